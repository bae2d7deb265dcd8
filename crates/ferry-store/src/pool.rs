//! The pool every ferry store and the Inbox open: options and the first connection.
use std::time::Duration;

/// How long a pooled connection may sit idle before [`pool_options`]' pools check it with a
/// ping on acquire (30 s).
pub const PING_IDLE_AFTER: Duration = Duration::from_secs(30);

/// The pool options of every ferry pool (the stores', the Inbox's): `max_connections`,
/// `acquire_timeout`, and a liveness check only for connections idle at least
/// `ping_idle_after`.
///
/// sqlx's default pings every connection it hands out, on top of the ping it always sends when
/// a connection goes back to the pool (sqlx 0.8): two extra round trips per statement run on
/// the pool. A connection that broke while in use is still found by that return ping and
/// discarded. One that breaks while idle (a server restart, a proxy's idle cut-off) is found by
/// the ping on acquire once it has been idle `ping_idle_after`; one that breaks sooner fails its
/// next statement once, which every caller already treats as a store error (the relay retries).
/// Tests: `idle_connections_killed_by_the_server_are_replaced_*` (tests/pool.rs).
///
/// A connection still inside a transaction when it is handed out again is closed instead: its
/// COMMIT or ROLLBACK failed and the rollback its `Transaction` queued on drop failed too. On
/// SQLite a COMMIT that fails with "database or disk is full" leaves it so (sqlx counts the
/// transaction as open while SQLite already rolled it back, and every later `begin` on that
/// connection failed with "attempted to call begin_with at non-zero transaction depth").
/// Test: `a_full_disk_is_survived` (tests/disk_full.rs).
pub fn pool_options<DB: sqlx::Database>(
    max_connections: u32,
    acquire_timeout: Duration,
    ping_idle_after: Duration,
) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            Box::pin(async move {
                if sqlx::Connection::is_in_transaction(conn) {
                    tracing::warn!("closing a pooled connection left inside a failed transaction");
                    return Ok(false);
                }
                if meta.idle_for >= ping_idle_after {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

/// Opens `pool` on `options`. sqlx retries a failing first connection until the pool's acquire
/// timeout and then reports only `PoolTimedOut`; one direct connection attempt then names the
/// cause instead (connection refused, unknown host, TLS, ...).
pub async fn open_pool<DB: sqlx::Database>(
    pool: sqlx::pool::PoolOptions<DB>,
    options: <DB::Connection as sqlx::Connection>::Options,
) -> Result<sqlx::Pool<DB>, sqlx::Error> {
    match pool.connect_with(options.clone()).await {
        Err(sqlx::Error::PoolTimedOut) => {
            match <DB::Connection as sqlx::Connection>::connect_with(&options).await {
                Err(cause) => Err(cause),
                Ok(conn) => {
                    let _ = sqlx::Connection::close(conn).await;
                    Err(sqlx::Error::PoolTimedOut)
                }
            }
        }
        opened => opened,
    }
}
