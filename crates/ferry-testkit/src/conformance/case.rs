//! One case of a suite, a suite's case list, and running every case of a suite in order.
use std::future::Future;
use std::pin::Pin;

use crate::db::{AnyDb, TestDb};

/// A suite's `CASES`, from the names of its case functions (in scope where it is used), in
/// order. `everywhere` cases get the suite's database as it comes; `sql_only` ones get the SQL
/// database an [`AnyDb`] holds (the store suite), or, with no `everywhere` list,
/// the suite's database as it comes (a suite of SQL databases).
macro_rules! case_list {
    (everywhere: [$($any:ident),* $(,)?], sql_only: [$($sql:ident),* $(,)?] $(,)?) => {
        &[
            $($crate::conformance::case::Case {
                name: stringify!($any),
                sql_only: false,
                run: |db| Box::pin($any(db)),
            },)*
            $($crate::conformance::case::Case {
                name: stringify!($sql),
                sql_only: true,
                run: |db| Box::pin($sql(db.into_sql().expect("a SQL database"))),
            },)*
        ]
    };
    (sql_only: [$($sql:ident),* $(,)?] $(,)?) => {
        &[$($crate::conformance::case::Case {
            name: stringify!($sql),
            sql_only: true,
            run: |db| Box::pin($sql(db)),
        },)*]
    };
}
pub(crate) use case_list;

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
}

impl SuiteDb for TestDb {
    fn sql(&self) -> Option<&TestDb> {
        Some(self)
    }
}

impl SuiteDb for AnyDb {
    fn sql(&self) -> Option<&TestDb> {
        AnyDb::sql(self)
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
