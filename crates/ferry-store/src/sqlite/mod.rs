//! SQLite backend (3.38+: `->>`; libsqlite3-sys bundles 3.46): the embedded default.
//!
//! SQLite has one writer at a time, so a claim is one `BEGIN IMMEDIATE` transaction (the write
//! lock is taken up front; no other claimer can interleave): `UPDATE … WHERE seq IN (SELECT …
//! LIMIT n) RETURNING …` over a bounded window, then the heads past it ([`claim`]). Timestamps are INTEGER microseconds
//! from this process's clock. The database runs in WAL mode with `synchronous = FULL` by default,
//! so a committed intent survives a power loss; `NORMAL` (survives process crashes only) is
//! available for benchmarks via [`SqliteStore::connect_with`].
//!
//! Write transactions of one process queue on an in-process gate per database file
//! ([`begin_write`]) before they ask SQLite for the write lock: SQLite's own busy handler polls
//! with sleeps of up to 100 ms, which, with producers, claims and acks all wanting the one
//! writer, left the database idle while writers slept. Other processes on the same file still
//! meet the busy handler (30 s timeout).
mod claim;
mod cursor;
mod sql;
mod write_gate;

use std::sync::Arc;
use std::time::Duration;

use ferry_core::{
    now_micros, CasReport, ClaimRequest, ClaimToken, ClaimedEvent, DispatchMode, EnqueueError,
    EventRecord, Limits, OutboxStatus, Payload, SlotId, SlotLease, SlotRelease, SlotRequest,
    StoreError, ValidatedEvent,
};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection, SqlitePool, TypeInfo, ValueRef};

use crate::enqueue::{push_intent, InsertIntents};
use crate::error::{db_err, enqueue_err, url_options, Ctx};
use crate::migrate::MIGRATIONS_SQLITE;
use crate::options::ConnectOptions;
use crate::outcome::Outcome;
use crate::protocol::Ops;
use crate::rows::{lease_from, status_from, StatusRow};
use crate::time::micros;
use sql::{outcome_set, CHUNK};
use write_gate::begin_gated;
pub use write_gate::{begin_write, write_gate, WriteTx};

/// WAL pages between automatic checkpoints (SQLite's default is 1,000).
const WAL_AUTOCHECKPOINT_PAGES: u32 = 10_000;

crate::enqueue::enqueue_fns!(SqliteConnection);

impl InsertIntents for SqliteConnection {
    async fn insert_intents(&mut self, rows: &[ValidatedEvent]) -> Result<(), EnqueueError> {
        let conn = self;
        let now = now_micros();
        for chunk in rows.chunks(CHUNK) {
            let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(sql::INSERT_HEAD);
            qb.push_values(chunk, |mut b, r| {
                push_intent(&mut b, r, r.shard_slot as i64);
                // one column: a BLOB stays a BLOB in it
                match &r.payload {
                    Payload::Text(text) => b.push_bind(text.as_str()),
                    Payload::Bytes(bytes) => b.push_bind(bytes.as_slice()),
                };
                b.push_bind(now).push_bind(now);
            });
            if let Err(e) = qb.build().execute(&mut *conn).await {
                // SQLite's message does not name the duplicate values; the transaction is still
                // usable, so ask which (aggregate, version) of this chunk exists already.
                if let sqlx::Error::Database(d) = &e {
                    let unique = d.kind() == sqlx::error::ErrorKind::UniqueViolation;
                    if unique && d.message().contains("aggregate_version") {
                        if let Some(r) = first_stored(conn, chunk, by_version).await {
                            return Err(EnqueueError::DuplicateVersion {
                                aggregate_id: r.aggregate_id.clone(),
                                version: r.aggregate_version,
                            });
                        }
                    }
                    if unique && d.message().contains("event_id") {
                        if let Some(r) = first_stored(conn, chunk, by_event_id).await {
                            return Err(EnqueueError::DuplicateEventId {
                                event_id: r.event_id.clone(),
                            });
                        }
                    }
                }
                return Err(enqueue_err(chunk, e));
            }
        }
        Ok(())
    }
}

/// A `SELECT 1` of the outbox row holding one of an intent's unique keys.
type Probe =
    for<'r> fn(
        &'r ValidatedEvent,
    ) -> sqlx::query::QueryScalar<'r, Sqlite, i64, sqlx::sqlite::SqliteArguments<'r>>;

fn by_version(
    r: &ValidatedEvent,
) -> sqlx::query::QueryScalar<'_, Sqlite, i64, sqlx::sqlite::SqliteArguments<'_>> {
    sqlx::query_scalar(sql::PROBE_VERSION)
        .bind(&r.aggregate_id)
        .bind(r.aggregate_version)
}

fn by_event_id(
    r: &ValidatedEvent,
) -> sqlx::query::QueryScalar<'_, Sqlite, i64, sqlx::sqlite::SqliteArguments<'_>> {
    sqlx::query_scalar(sql::PROBE_EVENT_ID).bind(&r.event_id)
}

/// The first row of `chunk` that `probe` finds stored already: the row a unique violation of the
/// chunk's insert was about. A probe that fails counts as not found.
async fn first_stored<'c>(
    conn: &mut SqliteConnection,
    chunk: &'c [ValidatedEvent],
    probe: Probe,
) -> Option<&'c ValidatedEvent> {
    for r in chunk {
        let exists: Option<i64> = probe(r).fetch_optional(&mut *conn).await.ok().flatten();
        if exists.is_some() {
            return Some(r);
        }
    }
    None
}

/// The SQLite outbox store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pub(crate) pool: SqlitePool,
    pub(crate) limits: Limits,
    gate: Arc<tokio::sync::Mutex<()>>,
    heads_from: crate::heads::HeadsFrom,
}

pub(crate) fn claimed_from_row(r: &sqlx::sqlite::SqliteRow) -> ClaimedEvent {
    ClaimedEvent {
        token: ClaimToken {
            seq: r.get(0),
            event_id: r.get(1),
            claim_id: r.get::<Option<String>, _>(2).unwrap_or_default(),
            claim_version: r.get(3),
        },
        aggregate_id: r.get(4),
        aggregate_version: r.get(5),
        shard_slot: r.get::<i64, _>(6) as SlotId,
        topic: r.get(7),
        key: r.get(8),
        event_type: r.get(9),
        headers: r.get(10),
        payload: payload_at(r, 11),
        attempts: r.get(12),
        created_at: r.get(13),
    }
}

/// Reads the `payload` column at `i`: SQLite keeps a BLOB a BLOB in a TEXT column, so the
/// value's own type says whether the row carries bytes (docs/schema.md, "Binary payloads").
pub(crate) fn payload_at(r: &sqlx::sqlite::SqliteRow, i: usize) -> Payload {
    let blob = r
        .try_get_raw(i)
        .is_ok_and(|v| !v.is_null() && v.type_info().name() == "BLOB");
    if blob {
        Payload::Bytes(r.get(i))
    } else {
        Payload::Text(r.get(i))
    }
}

fn json_slots(slots: &[SlotId]) -> String {
    serde_json::to_string(slots).expect("slots serialize")
}

impl SqliteStore {
    /// Opens (creating if missing) the database file named by `url` (`sqlite:///abs/path.db`,
    /// `sqlite://rel.db` or `sqlite::memory:`); migrates unless `opts.migrate` is false.
    pub async fn connect(url: &str, opts: &ConnectOptions) -> Result<Self, StoreError> {
        // a file path: nothing to redact
        let conn: SqliteConnectOptions = url_options(url, "SQLite", url)?;
        Self::connect_with(conn.synchronous(SqliteSynchronous::Full), opts).await
    }

    /// Opens with explicit options (WAL, `wal_autocheckpoint = 10000` and a 30 s busy timeout are
    /// always set, replacing any the options carry). SQLite has one writer at a time: a process
    /// stopped inside a write transaction blocks every writer until it resumes or dies (no server
    /// times it out).
    pub async fn connect_with(
        conn: SqliteConnectOptions,
        opts: &ConnectOptions,
    ) -> Result<Self, StoreError> {
        let file = conn.get_filename().display().to_string();
        let conn = conn
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // Checkpoint every 10,000 WAL pages (~40 MiB) instead of SQLite's 1,000: with random
            // aggregate keys a transaction dirties about one index page per intent, and pages
            // that several transactions dirtied between two checkpoints are copied into the
            // database file once (docs/tuning.md, "Per store").
            .pragma("wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES.to_string())
            .busy_timeout(Duration::from_secs(30));
        let pool = crate::pool::pool_options::<Sqlite>(
            opts.max_connections.max(1),
            opts.acquire_timeout,
            crate::pool::PING_IDLE_AFTER,
        )
        .connect_with(conn)
        .await
        .map_err(|e| db_err(&format!("cannot open SQLite database {file}"), e))?;
        let gate = write_gate(&pool);
        let (limits, heads_from) = (opts.limits, Default::default());
        let store = Self {
            pool,
            limits,
            gate,
            heads_from,
        };
        if opts.migrate {
            store.migrate().await?;
        }
        Ok(store)
    }

    /// The pool, for the application's own transactions (write ones through [`begin_write`]).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// A write transaction behind this database's in-process write gate.
    pub async fn begin_write(&self) -> Result<WriteTx, sqlx::Error> {
        begin_gated(&self.pool, self.gate.clone()).await
    }

    /// Applies pending migrations inside one `BEGIN IMMEDIATE` transaction: the write lock
    /// serializes concurrent migrates, and SQLite DDL is transactional.
    pub async fn migrate(&self) -> Result<Vec<i64>, StoreError> {
        use crate::migrate::{apply_sqlite, OUTBOX_LOCK, OUTBOX_TABLE};
        let mut conn = self.pool.acquire().await.ctx("migrate: connect")?;
        apply_sqlite(&mut conn, OUTBOX_LOCK, OUTBOX_TABLE, MIGRATIONS_SQLITE).await
    }

    /// A fenced outcome on `ferry_outbox` in a write transaction of its own ([`cas_in`]).
    async fn cas(&self, o: Outcome<'_>) -> Result<CasReport, StoreError> {
        if o.tokens.is_empty() {
            return Ok(CasReport::default());
        }
        let mut tx = self.begin_write().await.ctx("outcome: begin")?;
        let report = cas_in(&mut tx, "ferry_outbox", &o, now_micros()).await?;
        tx.commit().await.ctx("outcome: commit")?;
        Ok(report)
    }
}

/// A batched CAS on `table` (`ferry_outbox` or `ferry_outbox_exception`, fixed constants) inside
/// the caller's write transaction: the tokens (and per-item number/text) travel as one JSON array,
/// joined with `json_each`, so every batch size uses the same prepared statement. `?2` is `now`.
pub(crate) async fn cas_in(
    conn: &mut SqliteConnection,
    table: &str,
    o: &Outcome<'_>,
    now: i64,
) -> Result<CasReport, StoreError> {
    let (tokens, set) = (&o.tokens[..], outcome_set(o.to));
    if tokens.is_empty() {
        return Ok(CasReport::default());
    }
    let items: Vec<serde_json::Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let (n, s) = o.items.get(i).copied().unwrap_or((0, ""));
            serde_json::json!([t.seq, t.claim_version, t.claim_id, n, s])
        })
        .collect();
    let sql = sql::cas(table, set);
    let rows = sqlx::query_as::<_, (i64, i64, String)>(&sql)
        .bind(serde_json::Value::Array(items).to_string())
        .bind(now)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| db_err("outcome update", e))?;
    Ok(CasReport::from_returned(tokens, rows))
}

/// SQLite's claim statement, on `table` aliased `a` (`ferry_outbox o` or
/// `ferry_outbox_exception x`, fixed constants) in the caller's write transaction: rows of the
/// requested slots (with a fence, only those whose live lease the owner holds) that are due at
/// `now` and have no unfinished lower version of their aggregate in `table`, in `seq` order up to
/// the limit and up to seq `upto`, become CLAIMED under the request's claim id, with the next
/// claim version and a lease to now + the request's lease. Returns `returning` of each.
pub(crate) async fn claim_in(
    conn: &mut SqliteConnection,
    (table, a): (&str, &str),
    returning: &str,
    req: &ClaimRequest,
    now: i64,
    upto: i64,
) -> Result<Vec<sqlx::sqlite::SqliteRow>, sqlx::Error> {
    let sql = sql::claim((table, a), returning, req.fence.is_some());
    sqlx::query(&sql)
        .bind(json_slots(&req.slots))
        .bind(now)
        .bind(&req.claim_id)
        .bind(micros(req.lease))
        .bind(fence_owner(req))
        .bind(req.limit as i64)
        .bind(upto)
        .fetch_all(conn)
        .await
}

/// The owner a claim's fence names ("" unfenced: the statement then does not read it).
fn fence_owner(req: &ClaimRequest) -> &str {
    req.fence.as_ref().map_or("", |f| f.owner.as_str())
}

crate::protocol::impls::store_traits!(SqliteStore, sql);
crate::protocol::impls::handles! {
    SqliteStore: sqlx::SqliteConnection, WriteTx, Lite, begin_write;
}

impl Ops for SqliteStore {
    fn write_gate(&self) -> Option<&tokio::sync::Mutex<()>> {
        Some(&*self.gate)
    }

    /// The window, then the heads past it ([`SqliteStore::claim_window_then_heads`]).
    async fn claim_rows(&self, req: &ClaimRequest) -> Result<Vec<ClaimedEvent>, StoreError> {
        self.claim_window_then_heads(req).await
    }

    /// Never skips: a claim takes the database's one write lock up front (`BEGIN IMMEDIATE`),
    /// so no row is ever locked by another claimer. Contention shows as claim latency instead.
    fn rows_skipped_locked(&self) -> Option<u64> {
        Some(0)
    }

    async fn lookup_claim(&self, claim_id: &str) -> Result<Vec<ClaimedEvent>, StoreError> {
        crate::lookup::lookup_claim(&self.pool, &sql::lookup_claim(), claim_id, claimed_from_row)
            .await
    }

    async fn acquire_slots(&self, req: &SlotRequest<'_>) -> Result<Vec<SlotLease>, StoreError> {
        let now = now_micros();
        let mut tx = self.begin_write().await.ctx("acquire slots: begin")?;
        let rows: Vec<(i64, String, i64, i64)> = sqlx::query_as(sql::ACQUIRE_SLOTS)
            .bind(req.owner)
            .bind(json_slots(req.slots))
            .bind(now)
            .bind(micros(req.ttl))
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| db_err("acquire slots", e))?;
        tx.commit().await.ctx("acquire slots: commit")?;
        Ok(rows.into_iter().map(lease_from).collect())
    }

    async fn release_slots(&self, req: &SlotRelease<'_>) -> Result<(), sqlx::Error> {
        sqlx::query(sql::RELEASE_SLOTS)
            .bind(req.owner)
            .bind(json_slots(req.slots))
            .execute(&self.pool)
            .await
            .map(drop)
    }

    async fn status_rows(&self) -> Result<OutboxStatus, StoreError> {
        self.status_by(sql::STATUS_ROWS).await
    }

    async fn status_cursor(&self) -> Result<OutboxStatus, StoreError> {
        self.status_by(sql::STATUS_CURSOR).await
    }

    async fn record(&self, m: DispatchMode, id: &str) -> Result<Option<EventRecord>, StoreError> {
        crate::lookup::record(&self.pool, m, "?", sql::RECORD_PAYLOAD, id).await
    }
}

impl SqliteStore {
    /// Status by `sql` (`?`: now).
    async fn status_by(&self, sql: &str) -> Result<OutboxStatus, StoreError> {
        let r: StatusRow = sqlx::query_as(sql)
            .bind(now_micros())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| db_err("status", e))?;
        Ok(status_from(r))
    }
}
