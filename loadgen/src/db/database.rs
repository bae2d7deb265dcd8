//! The run's database: its isolated namespace, the store over it and its lifetime.
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{DispatchMode, Limits, OutboxStore};
use ferry_inbox::InboxPool as Pool;
use ferry_store::mysql::MyStore;
use ferry_store::postgres::PgStore;
use ferry_store::sqlite::SqliteStore;
use ferry_store::{redact_url, Backend, ConnectOptions};
use ferry_testkit::{on_inbox, Cleanup, TempDir};
use sqlx::sqlite::{SqliteConnectOptions, SqliteSynchronous};
use sqlx::Executor;

use crate::cli::SqliteSync;
use crate::error::{Error, Result};
use crate::spec::RunSpec;

/// The run's database, with a pool for the producers' business transactions.
pub struct Database {
    pub kind: Backend,
    /// URL of the isolated namespace (may contain a password: print only through [`redact_url`]).
    pub url: String,
    /// The outbox store over the producers' pool (status, slot leases).
    pub store: Arc<dyn OutboxStore>,
    pub(super) pool: Pool,
    /// The producers' pool's size (it grows to this as the producers start).
    pub(super) pool_size: u32,
    /// The outbox's dispatch mode (set at creation).
    pub dispatch: DispatchMode,
    pub(super) sqlite_sync: SqliteSync,
    /// The PostgreSQL schema or MariaDB database of the run.
    pub(super) namespace: Option<Cleanup>,
    /// The temporary directory of the default SQLite file.
    pub(super) dir: Option<TempDir>,
    pub(super) keep: bool,
}

/// A relay's pool, to close its idle connections once the relay stopped. Needed on
/// PostgreSQL: the store's LISTEN task (commit wake-ups) keeps a clone of the pool alive after
/// the relay is gone, so its idle connections would stay open, holding table statistics their
/// backends report only up to 10 s later (at exit: at once). The pool itself is left open: the
/// LISTEN task would log a reconnect failure every second on a closed pool.
pub struct PoolHandle(Pool);

impl PoolHandle {
    /// Closes every idle connection (their backends exit and report their statistics). A
    /// connection the relay just dropped goes back to the pool from a task of its own, so this
    /// keeps closing until the pool is empty or has been quiet for 150 ms with at most the
    /// LISTEN connection left (at most ~1 s).
    pub async fn close_idle(&self) {
        let mut quiet = 0;
        for _ in 0..20 {
            let (closed, left) = on_inbox!(InboxPool, &self.0, p => {
                let mut n = 0u32;
                while let Some(c) = p.try_acquire() {
                    let _ = c.close().await;
                    n += 1;
                }
                (n, p.size())
            });
            quiet = if closed == 0 { quiet + 1 } else { 0 };
            if left == 0 || (left <= 1 && quiet >= 3) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Database {
    /// Creates the run's isolated namespace, opens the store (migrating it) and creates the
    /// business table; `keep`: leave them in place afterwards.
    pub async fn create(spec: &RunSpec, keep: bool, run: &str, pool_size: u32) -> Result<Self> {
        let aggregates = spec.work.aggregate_rows();
        let fold = spec.retention.is_some_and(|r| r.fold_orders);
        let spec = &spec.db;
        let sqlite_sync = spec.sqlite_sync;
        let (mut dir, mut namespace) = (None, None);
        let url = match (spec.store, &spec.url) {
            (Backend::Sqlite, None) => {
                let d = TempDir::new(&format!("loadgen-{run}")).map_err(|source| Error::Io {
                    what: "create a temporary directory in",
                    path: std::env::temp_dir(),
                    source,
                })?;
                let url = format!("sqlite://{}", d.path().join("outbox.db").display());
                dir = Some(d);
                url
            }
            (Backend::Sqlite, Some(url)) => url.clone(),
            (kind, Some(admin)) => {
                let name = format!("loadgen_{run}");
                let (url, cleanup) = ferry_testkit::create_namespace(kind, admin, &name)
                    .await
                    .map_err(|source| Error::Connect {
                        url: redact_url(admin),
                        source,
                    })?;
                namespace = Some(cleanup);
                url
            }
            (kind, None) => {
                return Err(Error::Setup(format!(
                    "--store {} needs --database-url",
                    kind.as_str()
                )))
            }
        };
        let opts = ConnectOptions {
            max_connections: pool_size,
            acquire_timeout: Duration::from_secs(30),
            ..ConnectOptions::default()
        };
        let (store, pool) = match open(spec.store, &url, PRODUCERS, sqlite_sync, &opts).await {
            Ok(v) => v,
            Err(e) => {
                drop_namespace(namespace).await;
                return Err(e);
            }
        };
        let mut db = Database {
            kind: spec.store,
            url,
            store,
            pool,
            pool_size,
            dispatch: spec.dispatch,
            sqlite_sync,
            namespace,
            dir,
            keep,
        };
        if let Err(e) = db
            .prepare(spec.url.is_some(), run, aggregates, fold, opts)
            .await
        {
            drop_namespace(db.namespace.take()).await;
            return Err(e);
        }
        Ok(db)
    }

    /// Creates the business tables (emptying an explicit SQLite file that loadgen created) with
    /// the rows of `aggregates` aggregates (`fold`: and what `--fold-orders` reads) and puts the
    /// outbox in the run's dispatch mode; on PostgreSQL then reconnects.
    async fn prepare(
        &mut self,
        explicit_sqlite: bool,
        run: &str,
        aggregates: u64,
        fold: bool,
        opts: ConnectOptions,
    ) -> Result<()> {
        if let (Pool::Sqlite(p), true) = (&self.pool, explicit_sqlite) {
            let ours: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'loadgen_orders'",
            )
            .fetch_one(p)
            .await
            .map_err(Error::sql("inspect the SQLite file"))?;
            let rows = self.count_rows().await?;
            if ours == 0 && rows > 0 {
                return Err(Error::Setup(format!(
                    "{} already holds {rows} outbox rows that loadgen did not create; \
                     point --database-url at a new file (or omit it for a temporary one)",
                    redact_url(&self.url)
                )));
            }
            p.execute(
                "DELETE FROM ferry_outbox; DELETE FROM ferry_outbox_exception; \
                 UPDATE ferry_slot_lease SET owner = NULL, lease_until = NULL; \
                 DELETE FROM ferry_relay_member; DROP TABLE IF EXISTS loadgen_orders; \
                 DROP TABLE IF EXISTS loadgen_aggregates; DROP TABLE IF EXISTS loadgen_orders_folded;",
            )
            .await
            .map_err(Error::sql("empty the SQLite file"))?;
        }
        ferry_testkit::workload::create_tables(&self.pool, self.kind, run, aggregates)
            .await
            .map_err(Error::sql(
                "create loadgen_orders, loadgen_aggregates and the aggregates' rows",
            ))?;
        if fold {
            ferry_testkit::workload::prepare_fold(&self.pool)
                .await
                .map_err(Error::sql("index loadgen_orders for --fold-orders"))?;
        }
        self.set_dispatch(run).await?;
        if self.kind == Backend::Postgres {
            // A backend reports its table statistics at most once a second and, when idle,
            // up to 10 s later; at exit at once. Reconnecting makes the setup's writes
            // (migrations, the dispatch switch) reach pg_stat_user_tables before the run's
            // "before" snapshot instead of being counted as the run's.
            self.close_pool().await;
            let opts = ConnectOptions {
                migrate: false,
                ..opts
            };
            (self.store, self.pool) =
                open(self.kind, &self.url, PRODUCERS, self.sqlite_sync, &opts).await?;
        }
        Ok(())
    }

    /// Puts the outbox in the run's dispatch mode before anything is produced. A relay started
    /// in the other mode would convert the outbox itself, but converting to cursor mode turns
    /// every unsent row into an exception row: a preloaded queue would then be drained through
    /// the exception path, not the cursor.
    async fn set_dispatch(&self, run: &str) -> Result<()> {
        let mode = self.dispatch;
        let Some(cs) = self.store.cursor() else {
            if mode == ferry_core::DispatchMode::Row {
                return Ok(());
            }
            return Err(Error::Setup(format!(
                "the {} store has no cursor dispatch: use --dispatch row",
                self.kind.as_str()
            )));
        };
        cs.set_dispatch_mode(mode, &format!("loadgen-{run}-setup"))
            .await?;
        let now = cs.dispatch_mode().await?;
        if now != mode {
            return Err(Error::Setup(format!(
                "the outbox stayed in {now} dispatch after switching it to {mode}"
            )));
        }
        Ok(())
    }

    /// Rows in the outbox.
    pub async fn count_rows(&self) -> Result<i64> {
        self.scalar("SELECT COUNT(*) FROM ferry_outbox", "count outbox rows")
            .await
    }

    /// One number from `stmt`; `what` names it in the error.
    pub(super) async fn scalar(&self, stmt: &str, what: &str) -> Result<i64> {
        on_inbox!(InboxPool, &self.pool, p => sqlx::query_scalar(stmt).fetch_one(p).await)
            .map_err(Error::sql(what))
    }

    /// Server connections still free for relay pools: `max_connections` less the superuser
    /// reserve, every connection open now, the producers' pool at full size and a margin of 6
    /// (verifier, Inbox, ANALYZE). PostgreSQL and MySQL; `None` on SQLite or when the server
    /// will not say.
    pub async fn free_connections(&self) -> Option<u32> {
        let stmt = match self.kind {
            Backend::Postgres => {
                "SELECT current_setting('max_connections')::int8 \
                   - current_setting('superuser_reserved_connections')::int8 \
                   - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
            }
            Backend::Mysql => {
                "SELECT CAST(@@max_connections AS SIGNED) \
                   - (SELECT COUNT(*) FROM information_schema.PROCESSLIST)"
            }
            Backend::Sqlite => return None,
        };
        let free = self.scalar(stmt, "count free connections").await.ok()?;
        Some((free - i64::from(self.pool_size + 6)).max(0) as u32)
    }

    /// Opens another store on the same namespace with its own pool (one per in-process relay,
    /// as separate relay processes would have), and a handle that closes that pool. `role`
    /// names its PostgreSQL connections (`application_name`).
    pub async fn open_store(
        &self,
        max_connections: u32,
        measure_contention: bool,
        role: &str,
    ) -> Result<(Arc<dyn OutboxStore>, PoolHandle)> {
        let opts = ConnectOptions {
            max_connections,
            acquire_timeout: Duration::from_secs(30),
            migrate: false,
            limits: Limits::default(),
            measure_contention,
        };
        let (store, pool) = open(self.kind, &self.url, role, self.sqlite_sync, &opts).await?;
        Ok((store, PoolHandle(pool)))
    }

    /// The producers' pool (the business transactions, the checks and the fold).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Closes the producers' pool (its backends exit and flush their statistics).
    pub async fn close_pool(&self) {
        on_inbox!(InboxPool, &self.pool, p => p.close().await)
    }

    /// Server version and durability settings worth echoing in the report.
    pub async fn server_info(&self) -> Vec<(String, String)> {
        let queries: &[(&str, &str)] = match self.kind {
            Backend::Postgres => &[
                ("server_version", "SHOW server_version"),
                ("synchronous_commit", "SHOW synchronous_commit"),
                ("fsync", "SHOW fsync"),
            ],
            Backend::Mysql => &[(
                "server",
                "SELECT CAST(CONCAT(VERSION(), ' flush_log_at_trx_commit=', \
                 @@innodb_flush_log_at_trx_commit) AS CHAR)",
            )],
            Backend::Sqlite => &[("sqlite_version", "SELECT sqlite_version()")],
        };
        let mut out = Vec::new();
        for (key, stmt) in queries {
            let v: std::result::Result<String, _> =
                on_inbox!(InboxPool, &self.pool, p => sqlx::query_scalar(stmt).fetch_one(p).await);
            if let Ok(v) = v {
                out.push((key.to_string(), v));
            }
        }
        if self.kind == Backend::Sqlite {
            let sync = format!("{:?}", self.sqlite_sync).to_lowercase();
            out.push(("synchronous".to_string(), sync));
        }
        out
    }

    /// Drops the namespace (unless `--keep-db`, then says where it is).
    pub async fn finish(mut self) {
        if self.keep {
            eprintln!("loadgen: kept the database: {}", redact_url(&self.url));
            std::mem::forget(self.dir.take());
            return;
        }
        self.close_pool().await;
        drop_namespace(self.namespace.take()).await;
    }
}

/// Drops what [`Database::create`] made on a server.
async fn drop_namespace(namespace: Option<Cleanup>) {
    if let Some(c) = namespace {
        if let Err(e) = c.try_run().await {
            eprintln!("loadgen: could not drop the run's database: {e}");
        }
    }
}

pub use ferry_testkit::verify::new_histogram;

/// The `application_name` of the producers' pool (which also runs the checks and the fold).
const PRODUCERS: &str = "loadgen-producers";
/// The `application_name` of the in-process relays' pools.
pub const RELAY: &str = "loadgen-relay";
/// The `application_name` of the retention purger's pool.
pub const PURGE: &str = "loadgen-purge";

/// PostgreSQL: `url` with `application_name=role` added unless it names one, so that
/// `pg_stat_activity` (and `benches/scripts/pg-sampler.py`) tells loadgen's roles apart.
fn named(url: &str, role: &str) -> String {
    if url.contains("application_name=") {
        return url.to_string();
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={role}")
}

async fn open(
    kind: Backend,
    url: &str,
    role: &str,
    sync: SqliteSync,
    opts: &ConnectOptions,
) -> Result<(Arc<dyn OutboxStore>, Pool)> {
    Ok(match kind {
        Backend::Postgres => {
            let s = PgStore::connect(&named(url, role), opts).await?;
            let pool = Pool::Postgres(s.pool().clone());
            (Arc::new(s), pool)
        }
        Backend::Mysql => {
            let s = MyStore::connect(url, opts).await?;
            let pool = Pool::Mysql(s.pool().clone());
            (Arc::new(s), pool)
        }
        Backend::Sqlite => {
            let conn = SqliteConnectOptions::from_str(url).map_err(|e| {
                Error::Setup(format!(
                    "invalid SQLite URL {}: {e} (use sqlite:///absolute/path.db)",
                    redact_url(url)
                ))
            })?;
            let s = SqliteStore::connect_with(conn.synchronous(sync.into()), opts).await?;
            let pool = Pool::Sqlite(s.pool().clone());
            (Arc::new(s), pool)
        }
    })
}

impl From<SqliteSync> for SqliteSynchronous {
    fn from(s: SqliteSync) -> Self {
        match s {
            SqliteSync::Full => SqliteSynchronous::Full,
            SqliteSync::Normal => SqliteSynchronous::Normal,
        }
    }
}
