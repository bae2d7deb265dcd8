//! One case of a suite, a suite's case list, and running every case of a suite in order.
use std::future::Future;
use std::pin::Pin;

use crate::db::{AnyDb, TestDb};

/// Declares a suite, from the names of its case functions (in scope where it is used), in
/// order: its `CASES` on the suite's database `$db` and its `exercise`, and the exported macro
/// `$mac` that instantiates every case as a test per backend (the cases of module `$suite`,
/// with a test `$check` that checks they are exactly `CASES`). `everywhere` cases get the
/// suite's database as it comes and run on the in-memory store too; `sql_only` ones get the
/// SQL database ([`SuiteDb::into_sql`]).
macro_rules! suite {
    (
        $(#[doc = $cases_doc:expr])*
        cases: $db:ty;
        $(#[doc = $mac_doc:expr])*
        macro: $mac:ident, module: $suite:ident, check: $check:ident;
        everywhere: [$($any:ident),* $(,)?],
        sql_only: [$($sql:ident),* $(,)?] $(,)?
    ) => {
        $(#[doc = $cases_doc])*
        pub const CASES: &[$crate::conformance::case::Case<$db>] = &[
            $($crate::conformance::case::Case {
                name: stringify!($any),
                sql_only: false,
                run: |db| Box::pin($any(db)),
            },)*
            $($crate::conformance::case::Case {
                name: stringify!($sql),
                sql_only: true,
                run: |db| {
                    let db = $crate::conformance::case::SuiteDb::into_sql(db);
                    Box::pin($sql(db.expect("a SQL database")))
                },
            },)*
        ];

        /// Runs every case, in order, each on a fresh database from `factory`; a SQL-only case
        /// only when the factory's databases are SQL. Panics at the first failing case.
        pub async fn exercise<F, Fut>(factory: F)
        where
            F: FnMut() -> Fut,
            Fut: ::std::future::Future<Output = $db>,
        {
            $crate::conformance::case::exercise_each(CASES, factory).await
        }

        $(#[doc = $mac_doc])*
        #[macro_export]
        macro_rules! $mac {
            () => {
                $crate::backend_tests!(
                    in [$crate::conformance::$suite];
                    everywhere: [$($any),*],
                    sql_only: [$($sql),*],
                );

                /// The instantiated list is exactly `CASES`, in order, with the same
                /// `sql_only` flags.
                #[test]
                fn $check() {
                    let listed: &[(&str, bool)] =
                        &[$((stringify!($any), false),)* $((stringify!($sql), true),)*];
                    let cases: ::std::vec::Vec<(&str, bool)> =
                        $crate::conformance::$suite::CASES
                            .iter()
                            .map(|c| (c.name, c.sql_only))
                            .collect();
                    assert_eq!(cases, listed);
                }
            };
        }
    };
}
pub(crate) use suite;

/// A case's future.
pub type CaseFuture = Pin<Box<dyn Future<Output = ()>>>;

/// One case of a suite.
pub struct Case<D> {
    /// The function's name (and the test's).
    pub name: &'static str,
    /// Whether the case needs a SQL database (it is skipped on the in-memory store).
    pub sql_only: bool,
    /// Runs the case on a fresh database.
    pub run: fn(D) -> CaseFuture,
}

/// A suite's database: a [`TestDb`], or an [`AnyDb`] that may be the in-memory store.
pub(super) trait SuiteDb {
    /// The SQL database, if this is one.
    fn sql(&self) -> Option<&TestDb>;
    /// The SQL database, if this is one, for a SQL-only case.
    fn into_sql(self) -> Option<TestDb>;
}

impl SuiteDb for TestDb {
    fn sql(&self) -> Option<&TestDb> {
        Some(self)
    }
    fn into_sql(self) -> Option<TestDb> {
        Some(self)
    }
}

impl SuiteDb for AnyDb {
    fn sql(&self) -> Option<&TestDb> {
        AnyDb::sql(self)
    }
    fn into_sql(self) -> Option<TestDb> {
        AnyDb::into_sql(self)
    }
}

/// Runs every case of `cases`, in order, each on a fresh database from `factory`: a SQL-only
/// case only when the database is SQL, and a SQL database is dropped after its case. Panics
/// at the first failing case.
pub(super) async fn exercise_each<D: SuiteDb, F, Fut>(cases: &[Case<D>], mut factory: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = D>,
{
    for case in cases {
        let db = factory().await;
        if case.sql_only && db.sql().is_none() {
            continue;
        }
        let cleanup = db.sql().map(TestDb::cleanup_handle);
        (case.run)(db).await;
        if let Some(c) = cleanup {
            c.run().await;
        }
    }
}
