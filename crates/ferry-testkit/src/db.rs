//! A fresh, isolated database per test on every backend.
//!
//! * SQLite: a new file in a temporary directory (always available).
//! * PostgreSQL: a new schema in `FERRY_TEST_POSTGRES_URL` (selected with `search_path`).
//! * MariaDB/MySQL: a new database on `FERRY_TEST_MYSQL_URL`.
//!
//! When a URL is not set the backend is skipped with a printed reason, unless
//! `FERRY_REQUIRE_DBS=1` (CI), where a missing URL fails the test: a skipped suite never passes
//! silently there.
use std::sync::Arc;

use ferry_core::{EnqueueError, Limits, NewEvent, OutboxStore, StoreError};
use sqlx::Executor;

use crate::memory::MemoryStore;
use ferry_core::EventRecord;
use ferry_store::mysql::MyStore;
use ferry_store::postgres::PgStore;
use ferry_store::sqlite::SqliteStore;
use ferry_store::{Backend, ConnectOptions};

/// A sqlx error as a [`StoreError`] classified like the store's own.
fn db_err(context: &str, e: sqlx::Error) -> StoreError {
    StoreError::with_source(ferry_store::error_kind(&e), format!("{context}: {e}"), e)
}

/// One isolated test database with a migrated outbox and a demo business table `orders`.
pub struct TestDb {
    /// Backend.
    pub backend: Backend,
    /// URL of the isolated database (usable by child processes).
    pub url: String,
    /// The store.
    pub store: Arc<dyn OutboxStore>,
    kind: Kind,
    admin_url: String,
    name: String,
    _dir: Option<TempDir>,
}

enum Kind {
    Pg(PgStore),
    My(MyStore),
    Lite(SqliteStore),
}

/// Runs `$body` with `$p` bound to the sqlx pool of whichever backend the [`TestDb`] `$db`
/// holds: one statement written once for every backend.
macro_rules! on_pool {
    ($db:expr, $p:ident => $body:expr) => {
        match &$db.kind {
            Kind::Pg(s) => {
                let $p = s.pool();
                $body
            }
            Kind::My(s) => {
                let $p = s.pool();
                $body
            }
            Kind::Lite(s) => {
                let $p = s.pool();
                $body
            }
        }
    };
}

/// A directory removed on drop.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    /// Creates a fresh directory under the system temp dir.
    pub fn new(prefix: &str) -> std::io::Result<Self> {
        let p = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&p)?;
        Ok(Self(p))
    }
    /// Its path.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The env var naming the server for `backend`, if any.
pub fn env_url(backend: Backend) -> Option<String> {
    let var = match backend {
        Backend::Postgres => "FERRY_TEST_POSTGRES_URL",
        Backend::Mysql => "FERRY_TEST_MYSQL_URL",
        Backend::Sqlite => return Some(String::new()),
    };
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            if std::env::var("FERRY_REQUIRE_DBS").as_deref() == Ok("1") {
                panic!("{var} is not set but FERRY_REQUIRE_DBS=1: the {backend:?} suite must run");
            }
            eprintln!("skipped: {var} is not set");
            None
        }
    }
}

fn unique_name() -> String {
    format!(
        "ferry_t_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..16]
    )
}

const ORDERS_PG: &str = "CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL, version BIGINT NOT NULL)";

impl TestDb {
    /// A fresh database for `backend` with `opts`, or `None` when the backend is skipped.
    pub async fn open_with(backend: Backend, opts: ConnectOptions) -> Option<TestDb> {
        let admin_url = env_url(backend)?;
        Some(
            Self::open_on(backend, &admin_url, opts)
                .await
                .expect("open an isolated test database"),
        )
    }

    /// A fresh, isolated database on the server at `admin_url` (a new PostgreSQL schema or
    /// MariaDB database; for SQLite a new file in a temporary directory, `admin_url` unused).
    /// Used by tests and by `ferry lab`.
    pub async fn open_on(
        backend: Backend,
        admin_url: &str,
        opts: ConnectOptions,
    ) -> Result<TestDb, StoreError> {
        let admin_url = admin_url.to_string();
        let name = unique_name();
        let io = |e: std::io::Error| {
            StoreError::new(ferry_core::StoreErrorKind::Other, format!("temp dir: {e}"))
        };
        let (url, dir) = match backend {
            Backend::Sqlite => {
                let dir = TempDir::new("ferry-test").map_err(io)?;
                (
                    format!("sqlite://{}", dir.path().join("outbox.db").display()),
                    Some(dir),
                )
            }
            Backend::Postgres | Backend::Mysql => {
                // TestDb::cleanup_handle makes its own handle
                let (url, _) = create_namespace(backend, &admin_url, &name).await?;
                (url, None)
            }
        };
        let kind = match backend {
            Backend::Postgres => Kind::Pg(PgStore::connect(&url, &opts).await?),
            Backend::Mysql => Kind::My(MyStore::connect(&url, &opts).await?),
            Backend::Sqlite => Kind::Lite(SqliteStore::connect(&url, &opts).await?),
        };
        let store: Arc<dyn OutboxStore> = match &kind {
            Kind::Pg(s) => Arc::new(s.clone()),
            Kind::My(s) => Arc::new(s.clone()),
            Kind::Lite(s) => Arc::new(s.clone()),
        };
        let db = TestDb {
            backend,
            url,
            store,
            kind,
            admin_url,
            name,
            _dir: dir,
        };
        db.exec(ORDERS_PG).await?;
        Ok(db)
    }

    /// The isolated database's name: the PostgreSQL schema or the MariaDB database (SQLite: a
    /// unique name, unused).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server URL the isolated database was created on (for clients that take the schema
    /// separately, such as `psql` with `PGOPTIONS=-c search_path=…`).
    pub fn admin_url(&self) -> &str {
        &self.admin_url
    }

    /// A fresh database with default options.
    pub async fn open(backend: Backend) -> Option<TestDb> {
        Self::open_with(
            backend,
            ConnectOptions {
                max_connections: 16,
                ..Default::default()
            },
        )
        .await
    }

    /// A fresh SQLite database (always available: no server).
    pub async fn sqlite() -> TestDb {
        Self::open(Backend::Sqlite)
            .await
            .expect("SQLite is always available")
    }

    /// Runs one statement (no parameters) and returns the affected row count.
    pub async fn exec(&self, sql: &str) -> Result<u64, StoreError> {
        on_pool!(self, p => p.execute(sql).await.map(|r| r.rows_affected()))
            .map_err(|e| db_err("exec", e))
    }

    /// Runs a query returning one integer (e.g. `SELECT effects FROM projection`).
    pub async fn scalar(&self, sql: &str) -> Result<i64, StoreError> {
        on_pool!(self, p => sqlx::query_scalar(sql).fetch_one(p).await)
            .map_err(|e| db_err("scalar", e))
    }

    /// MariaDB: `KILL`s every session connected to this test's database (a relay's, this
    /// store's own pooled connections too, which then reconnect), from a connection of its own;
    /// how many. 0 on the other backends.
    pub async fn kill_other_sessions(&self) -> Result<u64, StoreError> {
        if !matches!(self.kind, Kind::My(_)) {
            return Ok(0);
        }
        let mut c = <sqlx::MySqlConnection as sqlx::Connection>::connect(&self.admin_url)
            .await
            .map_err(|e| db_err("kill: connect", e))?;
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()",
        )
        .bind(&self.name)
        .fetch_all(&mut c)
        .await
        .map_err(|e| db_err("kill: sessions", e))?;
        let mut n = 0;
        for id in ids {
            // an id the server gave: a number (KILL takes no placeholder); gone already is fine
            if c.execute(format!("KILL {id}").as_str()).await.is_ok() {
                n += 1;
            }
        }
        Ok(n)
    }

    /// `SELECT COUNT(*)` of a query's rows.
    pub async fn count(&self, from_where: &str) -> i64 {
        let sql = format!("SELECT COUNT(*) FROM {from_where}");
        on_pool!(self, p => sqlx::query_scalar(&sql).fetch_one(p).await).expect("count")
    }

    /// The outbox pattern's business transaction: insert order `order_id` and enqueue `events` in
    /// one local transaction, then commit or roll back.
    pub async fn place_order(
        &self,
        order_id: i64,
        events: &[NewEvent],
        commit: bool,
    ) -> Result<Vec<String>, EnqueueError> {
        let limits = Limits::default();
        let store_err = |e: sqlx::Error| EnqueueError::Store(db_err("business tx", e).to_string());
        macro_rules! run {
            ($pool:expr, $module:ident, $insert:expr) => {{
                let mut tx = $pool.begin().await.map_err(store_err)?;
                sqlx::query($insert)
                    .bind(order_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(store_err)?;
                let ids = ferry_store::$module::enqueue_many(&mut tx, events, &limits).await?;
                if commit {
                    tx.commit().await.map_err(store_err)?;
                } else {
                    tx.rollback().await.map_err(store_err)?;
                }
                Ok(ids)
            }};
        }
        match &self.kind {
            Kind::Pg(s) => run!(
                s.pool(),
                postgres,
                "INSERT INTO orders VALUES ($1, 'CREATED', 1)"
            ),
            Kind::My(s) => run!(
                s.pool(),
                mysql,
                "INSERT INTO orders VALUES (?, 'CREATED', 1)"
            ),
            Kind::Lite(s) => run!(
                s.pool(),
                sqlite,
                "INSERT INTO orders VALUES (?, 'CREATED', 1)"
            ),
        }
    }

    /// Holds row locks on `ferry_outbox WHERE {where_sql}` (`SELECT … FOR UPDATE` in an open
    /// transaction) until the returned transaction is rolled back, as a concurrent claimer
    /// mid-claim would. Release them with [`OpenTx::rollback`], which returns once the server
    /// has released them (dropping the transaction rolls it back later, on a task of the
    /// pool's, so a claim right after a drop may still find the rows locked). `None` on SQLite,
    /// which has no row locks (one writer at a time).
    pub async fn hold_row_locks(&self, where_sql: &str) -> Option<OpenTx> {
        let sql = format!("SELECT 1 FROM ferry_outbox WHERE {where_sql} FOR UPDATE");
        match &self.kind {
            Kind::Pg(s) => {
                let mut tx = s.pool().begin().await.expect("begin");
                tx.execute(sql.as_str()).await.expect("lock rows");
                Some(OpenTx::Pg(tx))
            }
            Kind::My(s) => {
                let mut tx = s.pool().begin().await.expect("begin");
                tx.execute(sql.as_str()).await.expect("lock rows");
                Some(OpenTx::My(tx))
            }
            Kind::Lite(_) => None,
        }
    }

    /// Enqueues `events` in a producer transaction that stays open until the returned guard
    /// commits or rolls back (a slow business transaction). `None` on SQLite, where an open
    /// write transaction blocks every other writer, so no later intent can commit meanwhile.
    pub async fn open_producer_tx(&self, events: &[NewEvent]) -> Option<OpenTx> {
        let limits = Limits::default();
        macro_rules! open {
            ($pool:expr, $module:ident, $variant:ident, $idle_timeout:expr) => {{
                let mut tx = $pool.begin().await.expect("begin");
                tx.execute($idle_timeout).await.expect("timeout");
                ferry_store::$module::enqueue_many(&mut tx, events, &limits)
                    .await
                    .expect("enqueue in the open transaction");
                Some(OpenTx::$variant(tx))
            }};
        }
        // the store's sessions end transactions idle for 10 s
        match &self.kind {
            Kind::Pg(s) => open!(
                s.pool(),
                postgres,
                Pg,
                "SET LOCAL idle_in_transaction_session_timeout = '120s'"
            ),
            Kind::My(s) => open!(
                s.pool(),
                mysql,
                My,
                "SET SESSION idle_transaction_timeout = 120"
            ),
            Kind::Lite(_) => None,
        }
    }

    /// Waits until every intent is SENT (nothing PENDING or CLAIMED); panics after `timeout`.
    pub async fn wait_all_sent(&self, timeout: std::time::Duration) {
        crate::wait::wait_until("all SENT", timeout, || async {
            let s = self.store.status().await;
            s.is_ok_and(|s| s.pending == 0 && s.claimed == 0)
        })
        .await
    }

    /// A second, independent store on the same database (a new pool: "reopen the connection").
    pub async fn reopen(&self) -> Arc<dyn OutboxStore> {
        ferry_store::connect(
            &self.url,
            &ConnectOptions {
                migrate: false,
                ..Default::default()
            },
        )
        .await
        .expect("reopen")
    }

    /// Drops the schema/database (SQLite: the directory goes with `self`).
    pub async fn cleanup(self) {
        self.cleanup_handle().run().await;
    }

    /// A handle that drops this database later, after `self` was moved into a test body.
    /// (A panicking test leaves its database behind for inspection.)
    pub fn cleanup_handle(&self) -> Cleanup {
        Cleanup {
            backend: self.backend,
            admin_url: self.admin_url.clone(),
            name: self.name.clone(),
        }
    }
}

/// Creates the isolated namespace `name` on the server at `admin_url`: a new PostgreSQL schema
/// (selected with `search_path` in the returned URL, so child processes see the same tables)
/// or a new MariaDB database. Returns the namespace's URL and the handle that drops it. SQLite
/// has no server namespace (a new file is one): an error.
pub async fn create_namespace(
    backend: Backend,
    admin_url: &str,
    name: &str,
) -> Result<(String, Cleanup), StoreError> {
    let url = match backend {
        Backend::Postgres => {
            let mut c = ferry_store::postgres::connect_one(admin_url).await?;
            c.execute(format!("CREATE SCHEMA {name}").as_str())
                .await
                .map_err(|e| db_err(&format!("create schema {name}"), e))?;
            let _ = sqlx::Connection::close(c).await;
            let sep = if admin_url.contains('?') { '&' } else { '?' };
            format!("{admin_url}{sep}options[search_path]={name}")
        }
        Backend::Mysql => {
            let mut c = <sqlx::MySqlConnection as sqlx::Connection>::connect(admin_url)
                .await
                .map_err(|e| db_err("connect to MySQL", e))?;
            c.execute(format!("CREATE DATABASE {name}").as_str())
                .await
                .map_err(|e| db_err(&format!("create database {name}"), e))?;
            let _ = sqlx::Connection::close(c).await;
            mysql_url_with_db(admin_url, name)
        }
        Backend::Sqlite => {
            return Err(StoreError::new(
                ferry_core::StoreErrorKind::Other,
                "SQLite has no server namespace: use a new file".to_string(),
            ))
        }
    };
    Ok((
        url,
        Cleanup {
            backend,
            admin_url: admin_url.to_string(),
            name: name.to_string(),
        },
    ))
}

/// A private in-memory SQLite database for a unit test, on one connection (an in-memory
/// database lives in its connection).
pub async fn memory_sqlite() -> sqlx::SqlitePool {
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await
        .expect("in-memory SQLite")
}

/// `mysql://u:p@h:3306/old?x` → `mysql://u:p@h:3306/<db>?x`.
pub fn mysql_url_with_db(admin: &str, db: &str) -> String {
    let (base, query) = match admin.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (admin, String::new()),
    };
    let base = base.trim_end_matches('/');
    let authority_start = base.find("://").map(|i| i + 3).unwrap_or(0);
    let host = match base[authority_start..].find('/') {
        Some(i) => &base[..authority_start + i],
        None => base,
    };
    format!("{host}/{db}{query}")
}

/// Drops a test schema/database; see [`TestDb::cleanup_handle`] and [`create_namespace`].
#[derive(Debug, Clone)]
pub struct Cleanup {
    backend: Backend,
    admin_url: String,
    name: String,
}

impl Cleanup {
    /// Drops it, ignoring failures (a test's database that cannot be dropped is left behind).
    pub async fn run(self) {
        let _ = self.try_run().await;
    }

    /// Drops it (`IF EXISTS`: dropping twice is no error).
    pub async fn try_run(self) -> Result<(), StoreError> {
        let stmt = match self.backend {
            Backend::Postgres => format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name),
            Backend::Mysql => format!("DROP DATABASE IF EXISTS {}", self.name),
            Backend::Sqlite => return Ok(()),
        };
        let context = format!("drop {}", self.name);
        match self.backend {
            Backend::Postgres => {
                let mut c = ferry_store::postgres::connect_one(&self.admin_url).await?;
                c.execute(stmt.as_str())
                    .await
                    .map_err(|e| db_err(&context, e))?;
            }
            _ => {
                let mut c = <sqlx::MySqlConnection as sqlx::Connection>::connect(&self.admin_url)
                    .await
                    .map_err(|e| db_err("connect to MySQL", e))?;
                c.execute(stmt.as_str())
                    .await
                    .map_err(|e| db_err(&context, e))?;
            }
        }
        Ok(())
    }
}

/// A transaction held open by a test: a producer's ([`TestDb::open_producer_tx`]) or one
/// holding row locks ([`TestDb::hold_row_locks`]).
pub enum OpenTx {
    /// PostgreSQL.
    Pg(sqlx::Transaction<'static, sqlx::Postgres>),
    /// MySQL/MariaDB.
    My(sqlx::Transaction<'static, sqlx::MySql>),
}

impl OpenTx {
    /// Enqueues more `events` in the open transaction (one statement).
    pub async fn enqueue(
        &mut self,
        events: &[NewEvent],
    ) -> Result<Vec<String>, ferry_core::EnqueueError> {
        let limits = Limits::default();
        match self {
            Self::Pg(tx) => ferry_store::postgres::enqueue_many(tx, events, &limits).await,
            Self::My(tx) => ferry_store::mysql::enqueue_many(tx, events, &limits).await,
        }
    }
    /// Commits.
    pub async fn commit(self) {
        match self {
            Self::Pg(tx) => tx.commit().await.expect("commit"),
            Self::My(tx) => tx.commit().await.expect("commit"),
        }
    }
    /// Rolls back.
    pub async fn rollback(self) {
        match self {
            Self::Pg(tx) => tx.rollback().await.expect("rollback"),
            Self::My(tx) => tx.rollback().await.expect("rollback"),
        }
    }
}

/// The database of a test that runs on every store: a SQL [`TestDb`] or the in-memory store.
/// Tests that need SQL itself (business transactions, reopening, triggers, migrations) take a
/// [`TestDb`] and run on the SQL backends only.
pub struct AnyDb {
    /// The store under test.
    pub store: Arc<dyn OutboxStore>,
    sql: Option<TestDb>,
    memory: Option<Arc<MemoryStore>>,
}

impl From<TestDb> for AnyDb {
    fn from(db: TestDb) -> Self {
        Self {
            store: db.store.clone(),
            sql: Some(db),
            memory: None,
        }
    }
}

impl AnyDb {
    /// A fresh in-memory store.
    pub fn memory() -> Self {
        let m = Arc::new(MemoryStore::new());
        Self {
            store: m.clone(),
            sql: None,
            memory: Some(m),
        }
    }

    /// The SQL database, if this is one.
    pub fn into_sql(self) -> Option<TestDb> {
        self.sql
    }

    /// The SQL database, for the parts of a test that only exist there.
    pub fn sql(&self) -> Option<&TestDb> {
        self.sql.as_ref()
    }

    /// Counts outbox rows behind the store's back: `SELECT COUNT(*) FROM {sql_from_where}` on
    /// SQL, `keep` over every row on the in-memory store (the same filter, written twice).
    pub async fn count(&self, sql_from_where: &str, keep: impl Fn(&EventRecord) -> bool) -> i64 {
        match (&self.sql, &self.memory) {
            (Some(db), _) => db.count(sql_from_where).await,
            (None, Some(m)) => m.records().iter().filter(|r| keep(r)).count() as i64,
            (None, None) => unreachable!("an AnyDb has a store"),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::db::mysql_url_with_db;

    #[test]
    fn mysql_database_is_swapped() {
        assert_eq!(
            mysql_url_with_db("mysql://root@127.0.0.1:3306/test", "x"),
            "mysql://root@127.0.0.1:3306/x"
        );
        assert_eq!(
            mysql_url_with_db("mysql://u:p@h/test?ssl-mode=disabled", "x"),
            "mysql://u:p@h/x?ssl-mode=disabled"
        );
        assert_eq!(
            mysql_url_with_db("mysql://u@h:3306", "x"),
            "mysql://u@h:3306/x"
        );
    }
}
