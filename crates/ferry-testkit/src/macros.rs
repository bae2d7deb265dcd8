//! The per-backend test macro.

/// Generates one `#[tokio::test]` per backend for each named test function, in modules named
/// after the backend (`sqlite::name`, `postgres::name`, `mysql::name`, `memory::name`).
///
/// Each test opens a fresh [`TestDb`](crate::TestDb), passes it to the function (converted with
/// `From`, so a function may take a [`TestDb`](crate::TestDb) or an [`AnyDb`](crate::AnyDb)),
/// and drops the database once the function returned (a panicking test leaves its database
/// behind for inspection). The server backends return early, with a printed reason, when
/// their URL is unset, unless `FERRY_REQUIRE_DBS=1`. The calling crate needs `tokio` (with
/// `macros`) as a dev-dependency.
///
/// ```ignore
/// // async fn a(db: TestDb), async fn b(db: TestDb) in this module:
/// ferry_testkit::backend_tests!(a, b);
/// // async fn a(db: TestDb, mode: DispatchMode): modules row::{sqlite,…}, cursor::{sqlite,…}
/// ferry_testkit::backend_tests!(modes: a);
/// // async fn a(db: AnyDb) on the in-memory store too, b(db: TestDb) on SQL only:
/// ferry_testkit::backend_tests!(everywhere: [a], sql_only: [b]);
/// // the same with the functions in another module (an absolute path):
/// ferry_testkit::backend_tests!(in ferry_testkit::conformance::store; everywhere: [a], sql_only: [b]);
/// ```
#[macro_export]
macro_rules! backend_tests {
    (in [$($p:tt)*] ; everywhere: [$($any:ident),* $(,)?], sql_only: [$($sql:ident),* $(,)?] $(,)?) => {
        $crate::backend_tests!(@sql [$($p)*] [] $($any,)* $($sql),*);
        mod memory {
            $crate::backend_tests!(@memory [$($p)*] $($any),*);
        }
    };
    (in [$($p:tt)*] ; $($name:ident),* $(,)?) => {
        $crate::backend_tests!(@sql [$($p)*] [] $($name),*);
    };
    (in $($p:ident)::+ ; everywhere: [$($any:ident),* $(,)?], sql_only: [$($sql:ident),* $(,)?] $(,)?) => {
        $crate::backend_tests!(@sql [$($p)::+] [] $($any,)* $($sql),*);
        mod memory {
            $crate::backend_tests!(@memory [$($p)::+] $($any),*);
        }
    };
    (in $($p:ident)::+ ; $($name:ident),* $(,)?) => {
        $crate::backend_tests!(@sql [$($p)::+] [] $($name),*);
    };
    (everywhere: [$($any:ident),* $(,)?], sql_only: [$($sql:ident),* $(,)?] $(,)?) => {
        $crate::backend_tests!(@sql [super] [] $($any,)* $($sql),*);
        mod memory {
            $crate::backend_tests!(@memory [super] $($any),*);
        }
    };
    (modes: $($name:ident),* $(,)?) => {
        mod row {
            $crate::backend_tests!(@sql [super::super] [$crate::DispatchMode::Row] $($name),*);
        }
        mod cursor {
            $crate::backend_tests!(@sql [super::super] [$crate::DispatchMode::Cursor] $($name),*);
        }
    };
    ($($name:ident),* $(,)?) => {
        $crate::backend_tests!(@sql [super] [] $($name),*);
    };

    (@sql [$($p:tt)*] [$($arg:expr),*] $($name:ident),*) => {
        mod sqlite {
            $crate::backend_tests!(@fns Sqlite [$($p)*] [$($arg),*] $($name),*);
        }
        mod postgres {
            $crate::backend_tests!(@fns Postgres [$($p)*] [$($arg),*] $($name),*);
        }
        mod mysql {
            $crate::backend_tests!(@fns Mysql [$($p)*] [$($arg),*] $($name),*);
        }
    };
    (@fns $b:ident [$($p:tt)*] [$($arg:expr),*]) => {};
    (@fns $b:ident [$($p:tt)*] [$($arg:expr),*] $name:ident $(, $rest:ident)*) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            let Some(db) = $crate::TestDb::open($crate::Backend::$b).await else {
                return;
            };
            let cleanup = db.cleanup_handle();
            $($p)*::$name(::core::convert::From::from(db) $(, $arg)*).await;
            cleanup.run().await;
        }
        $crate::backend_tests!(@fns $b [$($p)*] [$($arg),*] $($rest),*);
    };
    (@memory [$($p:tt)*]) => {};
    (@memory [$($p:tt)*] $name:ident $(, $rest:ident)*) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            $($p)*::$name($crate::AnyDb::memory()).await;
        }
        $crate::backend_tests!(@memory [$($p)*] $($rest),*);
    };
}

/// Runs `$body` with `$x` bound to the sqlx pool (or connection) of whichever backend a
/// `ferry_inbox::InboxPool` (or the `ferry_inbox::Conn` an Inbox effect gets) holds: one
/// statement written once for every backend (mind the placeholder: `$1` on PostgreSQL, `?`
/// elsewhere, see [`placeholder`](crate::placeholder)). The calling crate needs `ferry-inbox`
/// and `sqlx`.
///
/// ```ignore
/// let n: i64 = ferry_testkit::on_inbox!(InboxPool, inbox.pool(), p => sqlx::query_scalar(sql).fetch_one(p).await)?;
/// ferry_testkit::on_inbox!(Conn, conn, c => sqlx::query(sql).execute(c).await.map(drop))?;
/// ```
#[macro_export]
macro_rules! on_inbox {
    ($kind:ident, $v:expr, $x:ident => $body:expr) => {
        match $v {
            ::ferry_inbox::$kind::Postgres($x) => $body,
            ::ferry_inbox::$kind::Mysql($x) => $body,
            ::ferry_inbox::$kind::Sqlite($x) => $body,
        }
    };
}

/// `assert_documented_command_lines!(Cli::command(), "ferry")`: the command lines of `program`
/// in the repository's README.md and docs/*.md use only flags and subcommands of `cmd`
/// ([`docs::assert_command_lines`](crate::docs::assert_command_lines), given the calling crate's
/// directory).
#[macro_export]
macro_rules! assert_documented_command_lines {
    ($cmd:expr, $program:expr) => {
        $crate::docs::assert_command_lines($cmd, $program, env!("CARGO_MANIFEST_DIR"))
    };
}
