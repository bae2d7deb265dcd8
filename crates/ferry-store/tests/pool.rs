//! The pools of [`ferry_store::pool_options`]: no ping on every acquire, a ping for a connection
//! idle at least `ping_idle_after`. A connection the server killed while it sat idle is
//! replaced before anyone uses it once it has been idle that long; before that, it fails one
//! statement and is discarded.
use std::time::Duration;

use ferry_store::{pool_options, Backend};
use ferry_testkit::env_url;
use sqlx::pool::PoolOptions;
use sqlx::{Database, Pool};

/// What a backend needs for this test: its session id, and a way to kill a session.
trait Kill: Database {
    const ID: &'static str;
    const KILL: &'static str;
}
impl Kill for sqlx::Postgres {
    const ID: &'static str = "SELECT pg_backend_pid()::int8";
    const KILL: &'static str = "SELECT pg_terminate_backend($1::int4)";
}
impl Kill for sqlx::MySql {
    const ID: &'static str = "SELECT CAST(CONNECTION_ID() AS SIGNED)";
    const KILL: &'static str = "KILL CONNECTION ?";
}

/// Opens a one-connection pool, kills its connection from outside, waits `idle`, and returns
/// the next statement's result with the session id before the kill.
async fn after_idle_kill<DB: Kill>(
    url: &str,
    options: PoolOptions<DB>,
    idle: Duration,
) -> (i64, Result<i64, sqlx::Error>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    i64: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB> + for<'q> sqlx::Encode<'q, DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let pool: Pool<DB> = options.max_connections(1).connect(url).await.unwrap();
    let before: i64 = sqlx::query_scalar(DB::ID).fetch_one(&pool).await.unwrap();
    let admin: Pool<DB> = PoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap();
    sqlx::query(DB::KILL)
        .bind(before)
        .execute(&admin)
        .await
        .unwrap();
    tokio::time::sleep(idle).await;
    let next = sqlx::query_scalar(DB::ID).fetch_one(&pool).await;
    if next.is_err() {
        // the broken connection went back through the release ping and was discarded
        let again: i64 = sqlx::query_scalar(DB::ID).fetch_one(&pool).await.unwrap();
        assert_ne!(again, before, "a new connection after the failed statement");
    }
    (before, next)
}

async fn idle_kill_cases<DB: Kill>(url: &str)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    i64: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB> + for<'q> sqlx::Encode<'q, DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let timeout = Duration::from_secs(10);
    // idle longer than ping_idle_after: the acquire's ping finds the dead connection and the
    // pool opens a new one; the statement succeeds
    let (before, next) = after_idle_kill::<DB>(
        url,
        pool_options(1, timeout, Duration::from_millis(300)),
        Duration::from_millis(800),
    )
    .await;
    let next = next.expect("a connection killed while idle is replaced before use");
    assert_ne!(next, before, "the statement ran on a new connection");
    // idle shorter than ping_idle_after: no ping, the first statement fails (the case the docs
    // describe: one failed statement, then a new connection)
    let (_, next) = after_idle_kill::<DB>(
        url,
        pool_options(1, timeout, Duration::from_secs(3600)),
        Duration::from_millis(300),
    )
    .await;
    assert!(
        next.is_err(),
        "without the idle ping the dead connection is used once: {next:?}"
    );
}

#[tokio::test]
async fn idle_connections_killed_by_the_server_are_replaced_postgres() {
    let Some(url) = env_url(Backend::Postgres) else {
        return;
    };
    idle_kill_cases::<sqlx::Postgres>(&url).await;
}

#[tokio::test]
async fn idle_connections_killed_by_the_server_are_replaced_mysql() {
    let Some(url) = env_url(Backend::Mysql) else {
        return;
    };
    idle_kill_cases::<sqlx::MySql>(&url).await;
}
