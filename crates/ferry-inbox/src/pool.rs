//! Connection pools on the three backends and the transaction an effect runs on.
use std::str::FromStr;
use std::time::Duration;

use ferry_core::{StoreError, StoreErrorKind};
use ferry_store::{Backend, PING_IDLE_AFTER};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{
    Executor, MySqlConnection, MySqlPool, PgConnection, PgPool, SqliteConnection, SqlitePool,
};

use crate::error::{self, InboxError};

/// The consumer's open transaction as handed to an
/// [`Inbox::apply_once`](crate::Inbox::apply_once) effect.
#[derive(Debug)]
pub enum Conn<'c> {
    /// PostgreSQL.
    Postgres(&'c mut PgConnection),
    /// MySQL / MariaDB.
    Mysql(&'c mut MySqlConnection),
    /// SQLite.
    Sqlite(&'c mut SqliteConnection),
}

/// A pool-level handle on one of the three backends.
#[derive(Debug, Clone)]
pub enum InboxPool {
    /// PostgreSQL.
    Postgres(PgPool),
    /// MySQL / MariaDB.
    Mysql(MySqlPool),
    /// SQLite.
    Sqlite(SqlitePool),
}

/// How [`InboxPool::connect_with`] opens its pool.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Connections at most (at least 1). Default 10.
    pub max_connections: u32,
    /// How long a caller waits for a free connection before the call fails. Default 10 s: long
    /// enough for a busy server, short enough to report a wrong host promptly.
    pub acquire_timeout: Duration,
    /// SQLite only: when a commit is durable. Default `Full` (fsync of the WAL on every commit:
    /// a recorded delivery survives power loss); `Normal` survives process crashes only.
    pub sqlite_synchronous: SqliteSynchronous,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            sqlite_synchronous: SqliteSynchronous::Full,
        }
    }
}

impl InboxPool {
    /// Opens a pool on `url` (the scheme picks the backend) with `max_connections` and the
    /// other [`PoolOptions`] at their defaults.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, InboxError> {
        let options = PoolOptions {
            max_connections,
            ..PoolOptions::default()
        };
        Self::connect_with(url, &options).await
    }

    /// Opens a pool on `url` (the scheme picks the backend). MySQL sessions use `READ
    /// COMMITTED` (as the store's do: fewer gap locks); SQLite uses WAL, a 10 s busy timeout and
    /// `options.sqlite_synchronous`.
    pub async fn connect_with(url: &str, options: &PoolOptions) -> Result<Self, InboxError> {
        let max_connections = options.max_connections.max(1);
        let bad = |e: sqlx::Error| {
            InboxError::Database(StoreError::new(
                StoreErrorKind::InvalidInput,
                format!("invalid database URL {}: {e}", ferry_store::redact_url(url)),
            ))
        };
        let acquire = options.acquire_timeout;
        Ok(match Backend::from_url(url)? {
            Backend::Postgres => Self::Postgres(
                ferry_store::open_pool(
                    ferry_store::pool_options(max_connections, acquire, PING_IDLE_AFTER),
                    PgConnectOptions::from_str(url).map_err(bad)?,
                )
                .await
                .map_err(|e| error::db_err("cannot connect to PostgreSQL", e))?,
            ),
            Backend::Mysql => Self::Mysql(
                ferry_store::open_pool(
                    ferry_store::pool_options::<sqlx::MySql>(
                        max_connections,
                        acquire,
                        PING_IDLE_AFTER,
                    )
                    .after_connect(|c, _| {
                        Box::pin(async move {
                            c.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                                .await?;
                            Ok(())
                        })
                    }),
                    MySqlConnectOptions::from_str(url).map_err(bad)?,
                )
                .await
                .map_err(|e| error::db_err("cannot connect to MySQL/MariaDB", e))?,
            ),
            Backend::Sqlite => {
                let conn = SqliteConnectOptions::from_str(url).map_err(bad)?;
                let file = conn.get_filename().display().to_string();
                Self::Sqlite(
                    ferry_store::pool_options::<sqlx::Sqlite>(
                        max_connections,
                        acquire,
                        PING_IDLE_AFTER,
                    )
                    .connect_with(
                        conn.create_if_missing(true)
                            .journal_mode(SqliteJournalMode::Wal)
                            .synchronous(options.sqlite_synchronous)
                            .busy_timeout(Duration::from_secs(10)),
                    )
                    .await
                    .map_err(|e| {
                        error::db_err(&format!("cannot open SQLite database {file}"), e)
                    })?,
                )
            }
        })
    }

    /// A pool for `workers` concurrent apply tasks (a
    /// [`ConsumerRunner`](crate::ConsumerRunner)'s): one connection per task on a server; on
    /// SQLite a single one (one writer: more connections would only sleep in its busy handler)
    /// that the tasks queue on, hence a 30 s acquire timeout.
    pub async fn for_workers(
        url: &str,
        workers: usize,
        sqlite_synchronous: SqliteSynchronous,
    ) -> Result<Self, InboxError> {
        let options = match Backend::from_url(url)? {
            Backend::Sqlite => PoolOptions {
                max_connections: 1,
                acquire_timeout: Duration::from_secs(30),
                sqlite_synchronous,
            },
            Backend::Postgres | Backend::Mysql => PoolOptions {
                max_connections: u32::try_from(workers).unwrap_or(u32::MAX),
                ..PoolOptions::default()
            },
        };
        Self::connect_with(url, &options).await
    }

    /// Connections the pool opens at most.
    pub fn max_connections(&self) -> u32 {
        match self {
            Self::Postgres(p) => p.options().get_max_connections(),
            Self::Mysql(p) => p.options().get_max_connections(),
            Self::Sqlite(p) => p.options().get_max_connections(),
        }
    }

    /// Which database the pool is connected to.
    pub fn backend(&self) -> Backend {
        match self {
            Self::Postgres(_) => Backend::Postgres,
            Self::Mysql(_) => Backend::Mysql,
            Self::Sqlite(_) => Backend::Sqlite,
        }
    }
}
