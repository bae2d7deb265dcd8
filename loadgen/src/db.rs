//! The run's database: an isolated namespace per run, the business transaction, and the
//! store-side checks and costs.
//!
//! The business: `loadgen_aggregates (aggregate_id PRIMARY KEY, ver)` holds one row per
//! aggregate (created up front with `ver` 0); `loadgen_orders` one row per order, i.e. per
//! version of an aggregate. A business transaction first takes each of its orders' versions from
//! the aggregate's row (`ver = ver + 1`, in the orders' order, which producers make random), so
//! it holds that row's lock until it ends, exactly as an application that updates an aggregate
//! and writes its event does; then it inserts the orders and their outbox intents.
//!
//! Isolation (ferry-testkit's): PostgreSQL gets a fresh schema (selected with `search_path` in
//! the URL, so child `ferry relay` processes see the same tables), MySQL a fresh database,
//! SQLite a fresh file in a temporary directory. They are dropped after the run unless
//! `--keep-db`. An explicit SQLite file is emptied first, but only if it holds loadgen's own
//! table (or nothing).
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{now_micros, DispatchMode, Limits, NewEvent, OutboxStore};
use ferry_inbox::InboxPool as Pool;
use ferry_store::mysql::MyStore;
use ferry_store::postgres::PgStore;
use ferry_store::sqlite::SqliteStore;
use ferry_store::{redact_url, Backend, ConnectOptions};
use ferry_testkit::{on_inbox, Cleanup, TempDir};
use hdrhistogram::Histogram;
use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteSynchronous};
use sqlx::{Connection, Executor, MySql, QueryBuilder, Sqlite};

use crate::cli::SqliteSync;
use crate::error::{Error, Result};
use crate::spec::RunSpec;
use crate::workload::Order;

/// `sql` with `?` placeholders in `pool`'s dialect.
pub fn dialect<'a>(pool: &Pool, sql: &'a str) -> std::borrow::Cow<'a, str> {
    ferry_testkit::placeholder(sql, matches!(pool, Pool::Postgres(_)))
}

/// Rows per multi-row business insert (6 placeholders per row, far below SQLite's 32,766).
const CHUNK: usize = 1000;

/// The run's database, with a pool for the producers' business transactions.
pub struct Database {
    pub kind: Backend,
    /// URL of the isolated namespace (may contain a password: print only through [`redact_url`]).
    pub url: String,
    /// The outbox store over the producers' pool (status, slot leases).
    pub store: Arc<dyn OutboxStore>,
    pool: Pool,
    /// The producers' pool's size (it grows to this as the producers start).
    pool_size: u32,
    /// The outbox's dispatch mode (set at creation).
    pub dispatch: DispatchMode,
    sqlite_sync: SqliteSync,
    /// The PostgreSQL schema or MariaDB database of the run.
    namespace: Option<Cleanup>,
    /// The temporary directory of the default SQLite file.
    dir: Option<TempDir>,
    keep: bool,
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

/// What went wrong with one business transaction.
#[derive(Debug)]
pub enum TxError {
    /// Failed before COMMIT: rolled back, nothing written (its versions were rolled back too).
    RolledBack(Rollback, String),
    /// COMMIT itself failed: the transaction may or may not have committed.
    Unknown(String),
}

/// Why a business transaction rolled back before its COMMIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rollback {
    /// The database broke a lock cycle and chose this transaction (PostgreSQL `40P01`,
    /// MariaDB 1213): two transactions locked aggregates in opposite orders.
    Deadlock,
    /// A lock wait timed out (PostgreSQL `55P03`, MariaDB 1205) or SQLite was busy.
    LockWait,
    /// Another conflict the database asks to retry (serialization failure, MariaDB 1020).
    Conflict,
    /// Anything else: a lost connection, a failed statement.
    Other,
}

impl Rollback {
    /// Deadlocks, lock waits and other conflicts: contention, expected with shared aggregates.
    pub fn is_contention(self) -> bool {
        self != Rollback::Other
    }

    /// The kind of a failed statement.
    fn of(e: &sqlx::Error) -> Self {
        let sqlx::Error::Database(d) = e else {
            return Rollback::Other;
        };
        let code = match d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
            Some(my) => my.number().to_string(),
            None => d.code().map(|c| c.to_string()).unwrap_or_default(),
        };
        match code.as_str() {
            "40P01" | "1213" => Rollback::Deadlock,
            // SQLite: BUSY, LOCKED, BUSY_SNAPSHOT
            "55P03" | "1205" | "5" | "6" | "517" => Rollback::LockWait,
            "40001" | "1020" => Rollback::Conflict,
            _ => Rollback::Other,
        }
    }

    /// The kind of a failed enqueue, from its message (`EnqueueError` keeps no error code):
    /// on MariaDB the outbox's commit-gate trigger takes locks too.
    fn of_message(msg: &str) -> Self {
        let m = msg.to_ascii_lowercase();
        if m.contains("deadlock") {
            Rollback::Deadlock
        } else if m.contains("lock wait timeout") || m.contains("lock timeout") {
            Rollback::LockWait
        } else {
            Rollback::Other
        }
    }
}

/// What the business rows say about the versions the run committed (read after the drain).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VersionCheck {
    /// Aggregates with at least one committed order.
    pub aggregates_touched: u64,
    /// Of those, aggregates whose versions were committed by two or more producers.
    pub aggregates_shared: u64,
    /// Successive versions v(n), v(n+1) of one aggregate committed by different producers: each
    /// one a row lock handed from one producer's transaction to another's.
    pub handoffs: u64,
    /// Aggregates whose committed versions are not exactly `1..=n` with `n` = the business
    /// row's `ver` (a rolled-back transaction's version that survived, or one lost). Must be 0.
    pub version_mismatches: u64,
    /// PostgreSQL: successive versions whose outbox rows carry inverted transaction ids (the
    /// later version's transaction took its id first, then waited for the earlier one's row
    /// lock): what an order key fixed before the aggregate's lock gets wrong. `None` elsewhere.
    pub xid_inversions: Option<u64>,
}

/// The orders; `UNIQUE (aggregate_id, aggregate_version)`: one order per version (and the index
/// of the version checks after the run).
const ORDERS_DDL: &str = "CREATE TABLE IF NOT EXISTS loadgen_orders (order_id BIGINT PRIMARY KEY, \
    aggregate_id VARCHAR(255) NOT NULL, aggregate_version BIGINT NOT NULL, \
    amount_cents BIGINT NOT NULL, status VARCHAR(16) NOT NULL, created_at_us BIGINT NOT NULL, \
    UNIQUE (aggregate_id, aggregate_version))";
/// SQLite: `INTEGER PRIMARY KEY` makes the order id the rowid.
const ORDERS_DDL_SQLITE: &str = "CREATE TABLE IF NOT EXISTS loadgen_orders (order_id INTEGER \
    PRIMARY KEY, aggregate_id TEXT NOT NULL, aggregate_version INTEGER NOT NULL, \
    amount_cents INTEGER NOT NULL, status TEXT NOT NULL, created_at_us INTEGER NOT NULL, \
    UNIQUE (aggregate_id, aggregate_version))";
/// The aggregates' business rows: `ver` is the last version handed out.
const AGGREGATES_DDL: &str = "CREATE TABLE IF NOT EXISTS loadgen_aggregates \
    (aggregate_id VARCHAR(255) PRIMARY KEY, ver BIGINT NOT NULL)";
const AGGREGATES_DDL_SQLITE: &str = "CREATE TABLE IF NOT EXISTS loadgen_aggregates \
    (aggregate_id TEXT PRIMARY KEY, ver INTEGER NOT NULL) WITHOUT ROWID";
/// Business rows created per statement (a million: about 4 s on PostgreSQL, 2.5 s on MariaDB).
const AGGREGATE_ROWS_PER_STATEMENT: u64 = 1_000_000;
/// PostgreSQL: one statement takes every version of a transaction, aggregate after aggregate in
/// the order given, each `UPDATE` holding its row's lock until the transaction ends (one round
/// trip instead of one per order; the transaction's id is taken by the first `UPDATE`, before
/// any later one waits for a lock).
///
/// It also bounds each of its lock waits at 20 ms (`lock_timeout`, only while it runs: the
/// rest of the transaction, COMMIT's lock for NOTIFY included, waits as long as it must).
/// PostgreSQL looks for a deadlock only after `deadlock_timeout` (1 s by default, and only a
/// superuser may lower it), and meanwhile every producer that needs one of the cycle's rows
/// queues behind it. Measured (debug build, 8 producers, 10 orders per transaction) on 200
/// aggregates at 4,000 ev/s asked: 103 ev/s committed without a bound, about 1,000 with
/// 100 ms, 3,666 with 20 ms (220 waits timed out and retried); on 20 aggregates flat out
/// 107 ev/s with 100 ms, 640 with 20 ms, 1,121 with 10 ms; MariaDB, which finds deadlocks at
/// once, 2,634. 10 ms aborted three times as many waits in a line for one hot row (a
/// preload's single aggregate: 13 timeouts against 4) for no deadlock at all. Waits shorter
/// than the bound, the ones that reorder transaction ids and commits, still happen.
const TAKE_VERSIONS_PG: &str = r#"CREATE OR REPLACE FUNCTION loadgen_take_versions(ids text[])
RETURNS int8[] LANGUAGE plpgsql SET lock_timeout = '20ms' AS $f$
DECLARE
  vers int8[] := '{}';
  a text;
  v int8;
BEGIN
  FOREACH a IN ARRAY ids LOOP
    UPDATE loadgen_aggregates SET ver = ver + 1 WHERE aggregate_id = a RETURNING ver INTO v;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'loadgen: aggregate % has no row in loadgen_aggregates', a;
    END IF;
    vers := vers || v;
  END LOOP;
  RETURN vers;
END
$f$"#;
/// SQLite (3.35+ has `RETURNING`; the bundled one is 3.46).
const TAKE_VERSION_SQLITE: &str =
    "UPDATE loadgen_aggregates SET ver = ver + 1 WHERE aggregate_id = ? RETURNING ver";
/// MariaDB has no `UPDATE … RETURNING`: `LAST_INSERT_ID(expr)` hands the new value back in the
/// statement's OK packet (`last_insert_id`), so it still takes one round trip.
const TAKE_VERSION_MYSQL: &str =
    "UPDATE loadgen_aggregates SET ver = LAST_INSERT_ID(ver + 1) WHERE aggregate_id = ?";
/// Per touched aggregate: its orders, their lowest and highest version and the producers
/// (`order_id >> 40`, see [`crate::workload::Ids::order`]) against its business row.
const VERSION_CHECK: &str = "SELECT COUNT(*), \
      COUNT(CASE WHEN t.producers > 1 THEN 1 END), \
      COUNT(CASE WHEN t.n IS NULL OR t.n <> a.ver OR t.lo <> 1 OR t.hi <> a.ver THEN 1 END) \
    FROM loadgen_aggregates a LEFT JOIN (SELECT aggregate_id, COUNT(*) AS n, \
      MIN(aggregate_version) AS lo, MAX(aggregate_version) AS hi, \
      COUNT(DISTINCT order_id >> 40) AS producers \
      FROM loadgen_orders GROUP BY aggregate_id) t ON t.aggregate_id = a.aggregate_id \
    WHERE a.ver > 0";
/// PostgreSQL: successive versions of an aggregate whose outbox rows' `xid` (the inserting
/// transaction's id) are in the opposite order.
const XID_INVERSIONS: &str = "SELECT COUNT(*) FROM ferry_outbox a JOIN ferry_outbox b \
    ON b.aggregate_id = a.aggregate_id AND b.aggregate_version = a.aggregate_version + 1 \
    WHERE b.xid < a.xid";
/// Successive versions committed by different producers.
const HANDOFFS: &str = "SELECT COUNT(*) FROM loadgen_orders a JOIN loadgen_orders b \
    ON b.aggregate_id = a.aggregate_id AND b.aggregate_version = a.aggregate_version + 1 \
    WHERE (a.order_id >> 40) <> (b.order_id >> 40)";
const INSERT_ORDERS: &str = "INSERT INTO loadgen_orders (order_id, aggregate_id, \
    aggregate_version, amount_cents, status, created_at_us) ";

/// Successive versions of an aggregate both SENT, the later one marked SENT first. The relay
/// claims v(n+1) only after v(n) is SENT, so this must be zero; it is the ordering check when
/// no consumer reads the events back (null and stdout sinks).
const SENT_ORDER_VIOLATIONS: &str = "SELECT COUNT(*) FROM ferry_outbox a JOIN ferry_outbox b \
    ON b.aggregate_id = a.aggregate_id AND b.aggregate_version = a.aggregate_version + 1 \
    WHERE a.state = 'SENT' AND b.state = 'SENT' AND b.sent_at < a.sent_at";

/// [`SENT_ORDER_VIOLATIONS`] as pairs, `(aggregate, later version)`, before a purge run: also a
/// SENT version whose predecessor is still unfinished (PENDING, CLAIMED or QUARANTINED), which
/// the relay never allows in row dispatch and which a purge could otherwise delete before its
/// predecessor is SENT (and the end-of-run check could compare them). `{agg}` is the aggregate
/// id as text, `{limit}` the most pairs returned.
const SENT_ORDER_VIOLATION_PAIRS: &str = "SELECT {agg}, b.aggregate_version FROM ferry_outbox a \
    JOIN ferry_outbox b ON b.aggregate_id = a.aggregate_id \
      AND b.aggregate_version = a.aggregate_version + 1 \
    WHERE b.state = 'SENT' AND (a.state IN ('PENDING', 'CLAIMED', 'QUARANTINED') \
      OR (a.state = 'SENT' AND b.sent_at < a.sent_at)) \
    ORDER BY b.seq LIMIT {limit}";
/// Whether [`SENT_ORDER_VIOLATIONS`] counts the pair of `(aggregate, later version)`.
const SENT_ORDER_VIOLATION_OF: &str = "SELECT COUNT(*) FROM ferry_outbox a JOIN ferry_outbox b \
    ON b.aggregate_id = a.aggregate_id AND b.aggregate_version = a.aggregate_version + 1 \
    WHERE b.aggregate_id = ? AND b.aggregate_version = ? \
      AND a.state = 'SENT' AND b.state = 'SENT' AND b.sent_at < a.sent_at";

/// The tables whose row writes are counted per event (`ferry_outbox_exception` holds per-row
/// state in cursor mode; cursors live in `ferry_slot_lease`).
pub const COST_TABLES: [&str; 3] = ["ferry_outbox", "ferry_outbox_exception", "ferry_slot_lease"];

/// `pg_stat_user_tables` counters of one table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TableStats {
    /// Table name (in the run's schema).
    pub table: String,
    pub n_tup_ins: i64,
    /// Rows updated (HOT included).
    pub n_tup_upd: i64,
    pub n_tup_del: i64,
    /// Heap-only updates (no index maintenance).
    pub n_tup_hot_upd: i64,
    pub n_dead_tup: i64,
}

impl TableStats {
    /// The counters written since `before` (dead tuples: now).
    pub fn since(&self, before: TableStats) -> TableStats {
        TableStats {
            table: self.table.clone(),
            n_tup_ins: self.n_tup_ins - before.n_tup_ins,
            n_tup_upd: self.n_tup_upd - before.n_tup_upd,
            n_tup_del: self.n_tup_del - before.n_tup_del,
            n_tup_hot_upd: self.n_tup_hot_upd - before.n_tup_hot_upd,
            n_dead_tup: self.n_dead_tup,
        }
    }
}

/// What SQLite can tell cheaply about the writes of a run (it keeps no per-table counters).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SqliteWrites {
    /// Outbox rows: one INSERT each (over a run: the rows added, plus those purged).
    pub outbox_rows: i64,
    /// Row mode: sum of `claim_version` over the outbox = claim UPDATEs (of the rows still
    /// there: purged rows' claims went with them).
    pub outbox_claims: i64,
    /// Rows of `ferry_outbox_exception` (cursor mode's per-row state).
    pub exception_rows: i64,
    /// Sum of their `claim_version` (claim UPDATEs of exception rows).
    pub exception_claims: i64,
    /// Sum of `ferry_slot_lease.cursor_version`: cursor advances (one UPDATE per slot moved).
    pub cursor_versions: i64,
    /// Rows `--retention` purged over the run (one DELETE each; set by the run, 0 in a
    /// snapshot).
    pub purged_rows: i64,
}

impl SqliteWrites {
    /// The writes since `before`.
    pub fn since(&self, before: &SqliteWrites) -> SqliteWrites {
        SqliteWrites {
            outbox_rows: self.outbox_rows - before.outbox_rows,
            outbox_claims: self.outbox_claims - before.outbox_claims,
            exception_rows: self.exception_rows - before.exception_rows,
            exception_claims: self.exception_claims - before.exception_claims,
            cursor_versions: self.cursor_versions - before.cursor_versions,
            purged_rows: self.purged_rows - before.purged_rows,
        }
    }
}

/// PostgreSQL table statistics and sizes of the outbox.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PgCosts {
    /// `pg_total_relation_size('ferry_outbox')` (heap + indexes + TOAST), bytes.
    pub outbox_total_bytes: i64,
    pub outbox_table_bytes: i64,
    /// `pg_indexes_size('ferry_outbox')`, bytes.
    pub outbox_index_bytes: i64,
    /// `pg_total_relation_size('loadgen_orders')`, bytes.
    pub orders_total_bytes: i64,
    /// `pg_stat_user_tables.n_live_tup`.
    pub n_live_tup: i64,
    /// `pg_stat_user_tables.n_dead_tup`: the claim and ack updates' garbage.
    pub n_dead_tup: i64,
    pub n_tup_ins: i64,
    pub n_tup_upd: i64,
    /// Of which heap-only (no index maintenance).
    pub n_tup_hot_upd: i64,
    /// Autovacuum runs on the outbox.
    pub autovacuum_count: i64,
    /// Write counters of each of [`COST_TABLES`].
    pub tables: Vec<TableStats>,
}

/// Multi-row `INSERT`s of `orders` into `loadgen_orders` on `$conn` (MySQL and SQLite; the
/// PostgreSQL producer inserts from arrays in one statement).
macro_rules! insert_orders {
    ($db:ty, $conn:expr, $orders:expr, $now:expr) => {
        async {
            for chunk in $orders.chunks(CHUNK) {
                let mut qb: QueryBuilder<$db> = QueryBuilder::new(INSERT_ORDERS);
                qb.push_values(chunk, |mut b, o| {
                    b.push_bind(o.order_id)
                        .push_bind(&o.aggregate_id)
                        .push_bind(o.version)
                        .push_bind(o.amount_cents)
                        .push_bind(o.status())
                        .push_bind($now);
                });
                qb.build().execute($conn).await?;
            }
            Ok::<(), sqlx::Error>(())
        }
        .await
    };
}

impl Database {
    /// Creates the run's isolated namespace, opens the store (migrating it) and creates the
    /// business table; `keep`: leave them in place afterwards.
    pub async fn create(spec: &RunSpec, keep: bool, run: &str, pool_size: u32) -> Result<Self> {
        let aggregates = spec.work.aggregate_rows();
        let (flags, spec) = (&spec.flags, &spec.db);
        let sqlite_sync = flags.sqlite_synchronous;
        let (mut dir, mut namespace) = (None, None);
        let url = match (spec.store, &flags.database_url) {
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
        let (store, pool) = match open(spec.store, &url, sqlite_sync, &opts).await {
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
            .prepare(flags.database_url.is_some(), run, aggregates, opts)
            .await
        {
            drop_namespace(db.namespace.take()).await;
            return Err(e);
        }
        Ok(db)
    }

    /// Creates the business tables (emptying an explicit SQLite file that loadgen created) with
    /// the rows of `aggregates` aggregates and puts the outbox in the run's dispatch mode; on
    /// PostgreSQL then reconnects.
    async fn prepare(
        &mut self,
        explicit_sqlite: bool,
        run: &str,
        aggregates: u64,
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
                 DROP TABLE IF EXISTS loadgen_aggregates;",
            )
            .await
            .map_err(Error::sql("empty the SQLite file"))?;
        }
        let ddl = match self.kind {
            Backend::Sqlite => vec![
                ORDERS_DDL_SQLITE.to_string(),
                AGGREGATES_DDL_SQLITE.to_string(),
            ],
            Backend::Mysql => vec![
                format!("{ORDERS_DDL} ENGINE = InnoDB"),
                format!("{AGGREGATES_DDL} ENGINE = InnoDB"),
            ],
            Backend::Postgres => vec![
                ORDERS_DDL.to_string(),
                AGGREGATES_DDL.to_string(),
                TAKE_VERSIONS_PG.to_string(),
            ],
        };
        for stmt in ddl {
            on_inbox!(InboxPool, &self.pool, p => p.execute(stmt.as_str()).await.map(drop))
                .map_err(Error::sql("create loadgen_orders and loadgen_aggregates"))?;
        }
        create_aggregates(&self.pool, run, aggregates)
            .await
            .map_err(Error::sql(
                "create the aggregates' rows in loadgen_aggregates",
            ))?;
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
            (self.store, self.pool) = open(self.kind, &self.url, self.sqlite_sync, &opts).await?;
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

    async fn scalar(&self, stmt: &str, what: &str) -> Result<i64> {
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
    /// as separate relay processes would have), and a handle that closes that pool.
    pub async fn open_store(
        &self,
        max_connections: u32,
        measure_contention: bool,
    ) -> Result<(Arc<dyn OutboxStore>, PoolHandle)> {
        let opts = ConnectOptions {
            max_connections,
            acquire_timeout: Duration::from_secs(30),
            migrate: false,
            limits: Limits::default(),
            measure_contention,
        };
        let (store, pool) = open(self.kind, &self.url, self.sqlite_sync, &opts).await?;
        Ok((store, PoolHandle(pool)))
    }

    /// The business transaction. First each order takes its version from its aggregate's row
    /// (`ver = ver + 1`, in the order of `orders`: the row stays locked until the transaction
    /// ends, and a transaction that waits for a row another one holds may deadlock with it);
    /// then the order rows and their outbox intents (`intents` makes them from the numbered
    /// orders) are inserted, so all of it commits or none. After a successful COMMIT, or a
    /// failed one that did commit, `orders` carry the versions that committed; after a rollback
    /// their versions never existed (the `UPDATE`s rolled back too).
    pub async fn commit_orders(
        &self,
        orders: &mut [Order],
        intents: &(dyn Fn(&[Order]) -> Vec<NewEvent> + Sync),
    ) -> Result<(), TxError> {
        let (limits, now) = (Limits::default(), now_micros());
        let rb = |e: sqlx::Error| TxError::RolledBack(Rollback::of(&e), e.to_string());
        macro_rules! business_tx {
            ($begin:expr, $store:ident, $tx:ident => $take:expr, $insert:expr) => {{
                let mut $tx = $begin.await.map_err(rb)?;
                $take.map_err(rb)?;
                $insert.map_err(rb)?;
                let events = intents(orders);
                ferry_store::$store::enqueue_many(&mut $tx, &events, &limits)
                    .await
                    .map_err(|e| {
                        let msg = e.to_string();
                        TxError::RolledBack(Rollback::of_message(&msg), msg)
                    })?;
                $tx.commit()
                    .await
                    .map_err(|e| TxError::Unknown(e.to_string()))
            }};
        }
        match &self.pool {
            Pool::Postgres(p) => business_tx!(p.begin(), postgres, tx =>
                take_versions_pg(&mut tx, orders).await, sqlx::query(
                "INSERT INTO loadgen_orders (order_id, aggregate_id, aggregate_version, amount_cents, status, created_at_us) \
                 SELECT o.*, $6::int8 FROM UNNEST($1::int8[], $2::text[], $3::int8[], $4::int8[], $5::text[]) AS o",
            )
            .bind(orders.iter().map(|o| o.order_id).collect::<Vec<_>>())
            .bind(orders.iter().map(|o| o.aggregate_id.clone()).collect::<Vec<_>>())
            .bind(orders.iter().map(|o| o.version).collect::<Vec<_>>())
            .bind(orders.iter().map(|o| o.amount_cents).collect::<Vec<_>>())
            .bind(orders.iter().map(|o| o.status()).collect::<Vec<_>>())
            .bind(now)
            .execute(&mut *tx)
            .await),
            Pool::Mysql(p) => business_tx!(p.begin(), mysql, tx =>
                take_versions_mysql(&mut tx, orders).await,
                insert_orders!(MySql, &mut *tx, orders, now)),
            // IMMEDIATE (taken up front, so no deferred read→write upgrade fails with
            // SQLITE_BUSY) behind the in-process write gate the relay's claims and acks queue
            // on too: one writer, so SQLite's producers take turns and never deadlock.
            Pool::Sqlite(p) => business_tx!(ferry_store::sqlite::begin_write(p), sqlite, tx =>
                take_versions_sqlite(&mut tx, orders).await,
                insert_orders!(Sqlite, &mut *tx, orders, now)),
        }
    }

    /// Aggregates touched, shared and handed off between producers, and whether every
    /// aggregate's committed versions are exactly `1..=n` (see [`VersionCheck`]).
    pub async fn version_check(&self) -> Result<VersionCheck> {
        let (touched, shared, mismatches): (i64, i64, i64) =
            on_inbox!(InboxPool, &self.pool, p => sqlx::query_as(VERSION_CHECK).fetch_one(p).await)
                .map_err(Error::sql("check the committed versions"))?;
        let handoffs = self.scalar(HANDOFFS, "count version handoffs").await?;
        let n = |v: i64| v.max(0) as u64;
        let xid_inversions = match self.kind {
            // informative only: a schema without the column must not fail the run
            Backend::Postgres => match self.scalar(XID_INVERSIONS, "count xid inversions").await {
                Ok(v) => Some(n(v)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot count transaction-id inversions");
                    None
                }
            },
            _ => None,
        };
        Ok(VersionCheck {
            aggregates_touched: n(touched),
            aggregates_shared: n(shared),
            handoffs: n(handoffs),
            version_mismatches: n(mismatches),
            xid_inversions,
        })
    }

    /// Whether order `order_id` exists: resolves a transaction whose COMMIT outcome was lost
    /// (the order row and its intents commit together).
    pub async fn order_exists(&self, order_id: i64) -> Result<bool> {
        let stmt = dialect(
            &self.pool,
            "SELECT COUNT(*) FROM loadgen_orders WHERE order_id = ?",
        );
        let n: i64 =
            on_inbox!(InboxPool, &self.pool, p => sqlx::query_scalar(&stmt).bind(order_id).fetch_one(p).await)
                .map_err(Error::sql("look up an order"))?;
        Ok(n > 0)
    }

    /// The relation whose `state` is an intent's effective state: the outbox in row mode, the
    /// cursor view (an exception row's state, else SENT behind the slot's cursor) in cursor mode.
    fn state_table(&self) -> &'static str {
        match self.dispatch {
            DispatchMode::Row => "ferry_outbox",
            DispatchMode::Cursor => "ferry_outbox_cursor_view",
        }
    }

    /// Outbox rows in `SENT` (cursor mode: effectively SENT, see `ferry_outbox_cursor_view`).
    pub async fn count_sent(&self) -> Result<i64> {
        let stmt = format!(
            "SELECT COUNT(*) FROM {} WHERE state = 'SENT'",
            self.state_table()
        );
        self.scalar(&stmt, "count SENT rows").await
    }

    /// All outbox rows.
    pub async fn count_rows(&self) -> Result<i64> {
        self.scalar("SELECT COUNT(*) FROM ferry_outbox", "count outbox rows")
            .await
    }

    /// Up to ten unsent rows, `event_id (STATE)`.
    pub async fn unsent_examples(&self) -> Result<Vec<String>> {
        // MySQL: event ids are binary strings
        let cols = match self.kind {
            Backend::Mysql => "CAST(event_id AS CHAR), CAST(state AS CHAR)",
            _ => "event_id, state",
        };
        let stmt = format!(
            "SELECT {cols} FROM {} WHERE state <> 'SENT' ORDER BY seq LIMIT 10",
            self.state_table()
        );
        let rows: Vec<(String, String)> =
            on_inbox!(InboxPool, &self.pool, p => sqlx::query_as(&stmt).fetch_all(p).await)
                .map_err(Error::sql("list unsent rows"))?;
        Ok(rows
            .into_iter()
            .map(|(id, s)| format!("{id} ({s})"))
            .collect())
    }

    /// Pairs of successive versions marked SENT out of order (see [`SENT_ORDER_VIOLATIONS`]);
    /// `None` in cursor mode, where rows dispatched by the cursor carry no `sent_at`.
    pub async fn sent_order_violations(&self) -> Result<Option<i64>> {
        if self.dispatch == DispatchMode::Cursor {
            return Ok(None);
        }
        let n = self
            .scalar(SENT_ORDER_VIOLATIONS, "check SENT order")
            .await?;
        Ok(Some(n))
    }

    /// Row dispatch: the pairs [`SENT_ORDER_VIOLATION_PAIRS`] finds (at most `limit`); none in
    /// cursor mode.
    pub async fn sent_order_violation_pairs(&self, limit: usize) -> Result<Vec<(String, i64)>> {
        if self.dispatch == DispatchMode::Cursor {
            return Ok(Vec::new());
        }
        let stmt = violation_pairs_sql(self.kind, limit);
        on_inbox!(InboxPool, &self.pool, p => sqlx::query_as(&stmt).fetch_all(p).await)
            .map_err(Error::sql("check SENT order before a purge"))
    }

    /// Whether the end-of-run [`SENT_ORDER_VIOLATIONS`] counts the pair of `aggregate`'s
    /// `version` and its predecessor (both still there, both SENT, out of order).
    pub async fn counts_as_sent_order_violation(
        &self,
        aggregate: &str,
        version: i64,
    ) -> Result<bool> {
        let stmt = dialect(&self.pool, SENT_ORDER_VIOLATION_OF);
        let n: i64 = on_inbox!(InboxPool, &self.pool, p => sqlx::query_scalar(&stmt)
            .bind(aggregate)
            .bind(version)
            .fetch_one(p)
            .await)
        .map_err(Error::sql("look up an out-of-order pair"))?;
        Ok(n > 0)
    }

    /// The outbox's size in bytes and where it comes from: PostgreSQL
    /// `pg_total_relation_size` (heap, indexes, TOAST); MariaDB the size of its InnoDB
    /// tablespace file (`ferry_outbox.ibd`, which never shrinks: deleted rows' space is reused);
    /// SQLite the pages of the table and its indexes (`dbstat`).
    pub async fn outbox_bytes(&self) -> Result<Option<i64>> {
        let stmt = match self.kind {
            Backend::Postgres => "SELECT pg_total_relation_size('ferry_outbox')::int8",
            Backend::Mysql => {
                "SELECT CAST(COALESCE(MAX(FILE_SIZE), -1) AS SIGNED) \
                 FROM information_schema.INNODB_SYS_TABLESPACES \
                 WHERE NAME = CONCAT(DATABASE(), '/ferry_outbox')"
            }
            Backend::Sqlite => {
                "SELECT COALESCE(SUM(pgsize), 0) FROM dbstat \
                 WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = 'ferry_outbox')"
            }
        };
        let n = self.scalar(stmt, "measure the outbox's size").await?;
        Ok((n >= 0).then_some(n))
    }

    /// Where [`Self::outbox_bytes`] comes from.
    pub fn outbox_bytes_source(&self) -> &'static str {
        match self.kind {
            Backend::Postgres => "pg_total_relation_size('ferry_outbox'): heap, indexes, TOAST",
            Backend::Mysql => "the InnoDB tablespace file ferry_outbox.ibd (it never shrinks; purged rows' space is reused)",
            Backend::Sqlite => "dbstat: the pages of ferry_outbox and its indexes",
        }
    }

    /// Commit→SENT latency of every SENT row, from `created_at`/`sent_at` (used when relays
    /// run as processes and their metrics are out of reach). Values in µs. `None` in cursor
    /// mode: rows dispatched by the cursor are never updated, so they have no `sent_at`.
    pub async fn commit_to_ack_from_rows(&self) -> Result<Option<Histogram<u64>>> {
        if self.dispatch == DispatchMode::Cursor {
            return Ok(None);
        }
        let us = match self.kind {
            Backend::Postgres => "(extract(epoch from (sent_at - created_at)) * 1000000)::int8",
            Backend::Mysql => "CAST(TIMESTAMPDIFF(MICROSECOND, created_at, sent_at) AS SIGNED)",
            Backend::Sqlite => "sent_at - created_at",
        };
        let stmt =
            format!("SELECT {us} FROM ferry_outbox WHERE state = 'SENT' AND sent_at IS NOT NULL");
        let values: Vec<i64> =
            on_inbox!(InboxPool, &self.pool, p => sqlx::query_scalar(&stmt).fetch_all(p).await)
                .map_err(Error::sql("read commit→SENT latencies"))?;
        let mut h = new_histogram();
        for v in values {
            let _ = h.record(v.clamp(1, 3_600_000_000) as u64);
        }
        Ok(Some(h))
    }

    /// PostgreSQL-side costs of the outbox; `None` on other backends. Uses a fresh
    /// connection: pooled backends flush their table statistics only about once a second (or
    /// when they exit), so read this after closing the pools for exact end-of-run figures.
    pub async fn pg_costs(&self) -> Result<Option<PgCosts>> {
        if self.kind != Backend::Postgres {
            return Ok(None);
        }
        let mut conn = ferry_store::postgres::connect_one(&self.url).await?;
        let r: (i64, i64, i64, i64, i64, i64, i64, i64, i64, i64) = sqlx::query_as(
            "SELECT pg_total_relation_size('ferry_outbox'), pg_relation_size('ferry_outbox'), \
               pg_indexes_size('ferry_outbox'), pg_total_relation_size('loadgen_orders'), \
               COALESCE(s.n_live_tup, 0), COALESCE(s.n_dead_tup, 0), COALESCE(s.n_tup_ins, 0), \
               COALESCE(s.n_tup_upd, 0), COALESCE(s.n_tup_hot_upd, 0), COALESCE(s.autovacuum_count, 0) \
             FROM (SELECT 1) AS one \
             LEFT JOIN pg_stat_user_tables s ON s.relid = 'ferry_outbox'::regclass",
        )
        .fetch_one(&mut conn)
        .await
        .map_err(Error::sql("read pg_stat_user_tables"))?;
        let mut tables = Vec::with_capacity(COST_TABLES.len());
        for t in COST_TABLES {
            let s: (i64, i64, i64, i64, i64) = sqlx::query_as(
                "SELECT COALESCE(s.n_tup_ins, 0), COALESCE(s.n_tup_upd, 0), COALESCE(s.n_tup_del, 0), \
                   COALESCE(s.n_tup_hot_upd, 0), COALESCE(s.n_dead_tup, 0) \
                 FROM (SELECT 1) AS one \
                 LEFT JOIN pg_stat_user_tables s ON s.relid = to_regclass($1)",
            )
            .bind(t)
            .fetch_one(&mut conn)
            .await
            .map_err(Error::sql(format!("read pg_stat_user_tables for {t}")))?;
            tables.push(TableStats {
                table: t.to_string(),
                n_tup_ins: s.0,
                n_tup_upd: s.1,
                n_tup_del: s.2,
                n_tup_hot_upd: s.3,
                n_dead_tup: s.4,
            });
        }
        let _ = conn.close().await;
        Ok(Some(PgCosts {
            outbox_total_bytes: r.0,
            outbox_table_bytes: r.1,
            outbox_index_bytes: r.2,
            orders_total_bytes: r.3,
            n_live_tup: r.4,
            n_dead_tup: r.5,
            n_tup_ins: r.6,
            n_tup_upd: r.7,
            n_tup_hot_upd: r.8,
            autovacuum_count: r.9,
            tables,
        }))
    }

    /// [`Self::pg_costs`] once the statistics have settled. A backend reports its table
    /// counters at most once a second, when idle up to 10 s later, at exit at once; so read
    /// this after the connections that wrote have been closed (relays stopped and their idle
    /// connections closed, the producers' pool closed): it rereads every 250 ms until two reads
    /// agree (at most ~5 s), for the exiting backends' reports to land. (`pg_stat_force_next_
    /// flush()` would not help here: it only affects the backend that calls it.) Returns the
    /// costs and whether they settled.
    pub async fn pg_costs_settled(&self, min_wait: Duration) -> Result<Option<(PgCosts, bool)>> {
        if self.kind != Backend::Postgres {
            return Ok(None);
        }
        tokio::time::sleep(min_wait).await;
        let mut last = self.pg_costs().await?.expect("postgres");
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = self.pg_costs().await?.expect("postgres");
            if now.tables == last.tables && now.n_dead_tup == last.n_dead_tup {
                return Ok(Some((now, true)));
            }
            last = now;
        }
        Ok(Some((last, false)))
    }

    /// SQLite's cheap write counts (see [`SqliteWrites`]); `None` on other backends.
    pub async fn sqlite_writes(&self) -> Result<Option<SqliteWrites>> {
        let Pool::Sqlite(p) = &self.pool else {
            return Ok(None);
        };
        let r: (i64, i64, i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM ferry_outbox), \
               (SELECT COALESCE(SUM(claim_version), 0) FROM ferry_outbox), \
               (SELECT COUNT(*) FROM ferry_outbox_exception), \
               (SELECT COALESCE(SUM(claim_version), 0) FROM ferry_outbox_exception), \
               (SELECT COALESCE(SUM(cursor_version), 0) FROM ferry_slot_lease)",
        )
        .fetch_one(p)
        .await
        .map_err(Error::sql("count SQLite writes"))?;
        Ok(Some(SqliteWrites {
            outbox_rows: r.0,
            outbox_claims: r.1,
            exception_rows: r.2,
            exception_claims: r.3,
            cursor_versions: r.4,
            purged_rows: 0,
        }))
    }

    /// `n_dead_tup` of the outbox right now (PostgreSQL; sampled once a second).
    pub async fn pg_dead_tuples(&self) -> Option<i64> {
        if self.kind != Backend::Postgres {
            return None;
        }
        self.scalar(
            "SELECT COALESCE((SELECT n_dead_tup FROM pg_stat_user_tables \
               WHERE relid = 'ferry_outbox'::regclass), 0)",
            "sample n_dead_tup",
        )
        .await
        .ok()
    }

    /// `ANALYZE` the outbox, the slot leases and the business table (PostgreSQL; a no-op
    /// elsewhere). Returns
    /// whether it ran.
    pub async fn pg_analyze(&self) -> Result<bool> {
        let Pool::Postgres(p) = &self.pool else {
            return Ok(false);
        };
        p.execute("ANALYZE ferry_outbox, ferry_slot_lease, loadgen_orders")
            .await
            .map_err(Error::sql("ANALYZE"))?;
        Ok(true)
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

/// [`SENT_ORDER_VIOLATION_PAIRS`] for `kind` (MariaDB: aggregate ids are binary strings).
fn violation_pairs_sql(kind: Backend, limit: usize) -> String {
    let agg = match kind {
        Backend::Mysql => "CAST(b.aggregate_id AS CHAR)",
        _ => "b.aggregate_id",
    };
    SENT_ORDER_VIOLATION_PAIRS
        .replace("{agg}", agg)
        .replace("{limit}", &limit.to_string())
}

/// `aggregate`'s business row is missing (a setup fault: every row is created before the run).
fn no_row(aggregate: &str) -> sqlx::Error {
    sqlx::Error::Protocol(format!(
        "aggregate {aggregate} has no row in loadgen_aggregates"
    ))
}

/// PostgreSQL: every order's version in one call of `loadgen_take_versions` (see
/// [`TAKE_VERSIONS_PG`]).
async fn take_versions_pg(conn: &mut sqlx::PgConnection, orders: &mut [Order]) -> sqlx::Result<()> {
    let ids: Vec<&str> = orders.iter().map(|o| o.aggregate_id.as_str()).collect();
    let versions: Vec<i64> = sqlx::query_scalar("SELECT loadgen_take_versions($1)")
        .bind(&ids)
        .fetch_one(conn)
        .await?;
    if versions.len() != orders.len() {
        return Err(sqlx::Error::Protocol(format!(
            "loadgen_take_versions returned {} versions for {} orders",
            versions.len(),
            orders.len()
        )));
    }
    for (o, v) in orders.iter_mut().zip(versions) {
        o.version = v;
    }
    Ok(())
}

/// MariaDB: one `UPDATE` per order, its new `ver` read from the OK packet.
async fn take_versions_mysql(
    conn: &mut sqlx::MySqlConnection,
    orders: &mut [Order],
) -> sqlx::Result<()> {
    for o in orders.iter_mut() {
        let r = sqlx::query(TAKE_VERSION_MYSQL)
            .bind(&o.aggregate_id)
            .execute(&mut *conn)
            .await?;
        if r.rows_affected() != 1 {
            return Err(no_row(&o.aggregate_id));
        }
        o.version = r.last_insert_id() as i64;
    }
    Ok(())
}

/// SQLite: one `UPDATE … RETURNING` per order (in-process: no network round trip).
async fn take_versions_sqlite(
    conn: &mut sqlx::SqliteConnection,
    orders: &mut [Order],
) -> sqlx::Result<()> {
    for o in orders.iter_mut() {
        let v: Option<i64> = sqlx::query_scalar(TAKE_VERSION_SQLITE)
            .bind(&o.aggregate_id)
            .fetch_optional(&mut *conn)
            .await?;
        o.version = v.ok_or_else(|| no_row(&o.aggregate_id))?;
    }
    Ok(())
}

/// Creates the business rows (`ver` 0) of aggregates `0..n` of run `run`, with the ids
/// [`crate::workload::Ids::aggregate`] gives them, at most
/// [`AGGREGATE_ROWS_PER_STATEMENT`] per statement.
async fn create_aggregates(pool: &Pool, run: &str, n: u64) -> sqlx::Result<()> {
    let mut lo = 0;
    while lo < n {
        let hi = (lo + AGGREGATE_ROWS_PER_STATEMENT).min(n) - 1;
        let (lo_i, hi_i) = (lo as i64, hi as i64);
        match pool {
            Pool::Postgres(p) => {
                sqlx::query(
                    "INSERT INTO loadgen_aggregates (aggregate_id, ver) \
                     SELECT 'lg-' || $1 || '-a' || g, 0 FROM generate_series($2::int8, $3::int8) AS g",
                )
                .bind(run)
                .bind(lo_i)
                .bind(hi_i)
                .execute(p)
                .await?;
            }
            // the Sequence engine's virtual tables (built into MariaDB since 10.1)
            Pool::Mysql(p) => {
                let stmt = format!(
                    "INSERT INTO loadgen_aggregates (aggregate_id, ver) \
                     SELECT CONCAT('lg-', ?, '-a', seq), 0 FROM seq_{lo}_to_{hi}"
                );
                sqlx::query(&stmt).bind(run).execute(p).await?;
            }
            Pool::Sqlite(p) => {
                sqlx::query(
                    "WITH RECURSIVE s(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM s WHERE i < ?) \
                     INSERT INTO loadgen_aggregates (aggregate_id, ver) \
                     SELECT 'lg-' || ? || '-a' || i, 0 FROM s",
                )
                .bind(lo_i)
                .bind(hi_i)
                .bind(run)
                .execute(p)
                .await?;
            }
        }
        lo = hi + 1;
    }
    Ok(())
}

/// Drops what [`Database::create`] made on a server.
async fn drop_namespace(namespace: Option<Cleanup>) {
    if let Some(c) = namespace {
        if let Err(e) = c.try_run().await {
            eprintln!("loadgen: could not drop the run's database: {e}");
        }
    }
}

/// A new latency histogram, bounded as the relay's ([`ferry_relay::metrics::Latency`]).
pub fn new_histogram() -> Histogram<u64> {
    ferry_relay::metrics::Latency::default().snapshot()
}

async fn open(
    kind: Backend,
    url: &str,
    sync: SqliteSync,
    opts: &ConnectOptions,
) -> Result<(Arc<dyn OutboxStore>, Pool)> {
    Ok(match kind {
        Backend::Postgres => {
            let s = PgStore::connect(url, opts).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Ids;
    use sqlx::sqlite::SqlitePoolOptions;

    fn order(aggregate_id: &str) -> Order {
        Order {
            order_id: 0,
            aggregate_id: aggregate_id.to_string(),
            version: 0,
            amount_cents: 100,
        }
    }

    #[tokio::test]
    async fn versions_come_from_the_rows_and_roll_back_with_the_transaction() {
        // one connection: an in-memory database lives in its connection
        let p = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        p.execute(AGGREGATES_DDL_SQLITE).await.unwrap();
        let pool = Pool::Sqlite(p.clone());
        create_aggregates(&pool, "abc123", 5).await.unwrap();
        // the rows carry the ids the producers use
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT aggregate_id FROM loadgen_aggregates ORDER BY ver, aggregate_id",
        )
        .fetch_all(&p)
        .await
        .unwrap();
        let run = Ids {
            run: "abc123".into(),
        };
        let mut want: Vec<String> = (0..5).map(|i| run.aggregate(i)).collect();
        want.sort();
        assert_eq!(ids, want);
        let take = |aggs: &[usize]| {
            aggs.iter()
                .map(|a| order(&run.aggregate(*a)))
                .collect::<Vec<_>>()
        };
        // a transaction that rolls back: its versions never existed
        let mut orders = take(&[3, 1, 3]);
        let mut tx = p.begin().await.unwrap();
        take_versions_sqlite(&mut tx, &mut orders).await.unwrap();
        assert_eq!(
            orders.iter().map(|o| o.version).collect::<Vec<_>>(),
            [1, 1, 2]
        );
        tx.rollback().await.unwrap();
        // the retry takes the same versions again, and they commit
        let mut tx = p.begin().await.unwrap();
        take_versions_sqlite(&mut tx, &mut orders).await.unwrap();
        assert_eq!(
            orders.iter().map(|o| o.version).collect::<Vec<_>>(),
            [1, 1, 2]
        );
        tx.commit().await.unwrap();
        let mut orders = take(&[1]);
        let mut tx = p.begin().await.unwrap();
        take_versions_sqlite(&mut tx, &mut orders).await.unwrap();
        assert_eq!(orders[0].version, 2);
        // an aggregate without a row is a setup fault, not a version 0
        let mut orders = take(&[5]);
        let e = take_versions_sqlite(&mut tx, &mut orders)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no row"), "{e}");
        tx.rollback().await.unwrap();
        p.close().await;
    }

    #[tokio::test]
    async fn the_pre_purge_order_check_finds_both_kinds_of_violation() {
        let p = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        // the columns the checks read
        p.execute(
            "CREATE TABLE ferry_outbox (seq INTEGER PRIMARY KEY, aggregate_id TEXT, \
             aggregate_version INTEGER, state TEXT, sent_at INTEGER)",
        )
        .await
        .unwrap();
        let rows = [
            // a: v2 marked SENT before v1
            ("a", 1, "SENT", Some(10)),
            ("a", 2, "SENT", Some(5)),
            // b: v2 SENT while v1 is still unsent (a purge could delete v2 first)
            ("b", 1, "PENDING", None),
            ("b", 2, "SENT", Some(7)),
            ("q", 1, "QUARANTINED", None),
            ("q", 2, "SENT", Some(8)),
            // in order, or allowed
            ("c", 1, "SENT", Some(1)),
            ("c", 2, "SENT", Some(2)),
            ("d", 1, "SKIPPED", None),
            ("d", 2, "SENT", Some(3)),
            ("e", 1, "SENT", Some(4)),
            ("e", 2, "CLAIMED", None),
        ];
        for (agg, ver, state, sent_at) in rows {
            sqlx::query(
                "INSERT INTO ferry_outbox (aggregate_id, aggregate_version, state, sent_at) \
                 VALUES (?, ?, ?, ?)",
            )
            .bind(agg)
            .bind(ver)
            .bind(state)
            .bind(sent_at)
            .execute(&p)
            .await
            .unwrap();
        }
        let pairs: Vec<(String, i64)> = sqlx::query_as(&violation_pairs_sql(Backend::Sqlite, 1000))
            .fetch_all(&p)
            .await
            .unwrap();
        let want = [("a", 2), ("b", 2), ("q", 2)].map(|(a, v)| (a.to_string(), v));
        assert_eq!(pairs, want);
        // the limit holds
        let one: Vec<(String, i64)> = sqlx::query_as(&violation_pairs_sql(Backend::Sqlite, 1))
            .fetch_all(&p)
            .await
            .unwrap();
        assert_eq!(one.len(), 1);
        // the end-of-run count sees only a's pair (b's and q's predecessors are not SENT)
        let n: i64 = sqlx::query_scalar(SENT_ORDER_VIOLATIONS)
            .fetch_one(&p)
            .await
            .unwrap();
        assert_eq!(n, 1);
        for (agg, counted) in [("a", 1), ("b", 0), ("q", 0)] {
            let n: i64 = sqlx::query_scalar(SENT_ORDER_VIOLATION_OF)
                .bind(agg)
                .bind(2i64)
                .fetch_one(&p)
                .await
                .unwrap();
            assert_eq!(n, counted, "{agg}");
        }
        p.close().await;
    }

    #[test]
    fn rollbacks_are_classified() {
        for (msg, want) in [
            ("error returned from database: 1213 (40001): Deadlock found when trying to get lock", Rollback::Deadlock),
            ("deadlock detected", Rollback::Deadlock),
            ("Lock wait timeout exceeded; try restarting transaction", Rollback::LockWait),
            ("payload is not valid JSON", Rollback::Other),
        ] {
            assert_eq!(Rollback::of_message(msg), want, "{msg}");
        }
        assert!(!Rollback::Other.is_contention());
        assert!(Rollback::Deadlock.is_contention() && Rollback::LockWait.is_contention());
    }
}
