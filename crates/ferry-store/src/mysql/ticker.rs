//! The commit gate's ticker (MySQL/MariaDB): the task that turns the gate's locks into a
//! horizon (docs/architecture.md, "MySQL/MariaDB: the commit gate").
//!
//! Every transaction that inserts an intent holds a shared lock on one of [`GATE_ROWS`] rows of
//! `ferry_commit_gate` from before its first `seq` is drawn until it ends (the `ferry_outbox_gate`
//! trigger, migration 0007). The ticker holds a set `A` of gate rows exclusively, reads the head
//! `M = max(seq)`, releases `A` and takes the other rows exclusively. A transaction that still
//! owns an uncommitted `seq <= M` took its gate row before drawing that `seq` and still holds it,
//! so it holds a row outside `A`: once the ticker holds every other row, it has ended and `M` is
//! closed (`ferry_gate_horizon.horizon_seq`).
//!
//! *A long transaction.* When a row is not granted within [`FREEZE_AFTER`], the ticker leaves its
//! request queued on a connection of its own (the row is *frozen*: InnoDB grants no new shared
//! request behind a queued exclusive one, and the trigger's `SKIP LOCKED` passes over it, so the
//! set of its holders only shrinks) and alternates between the other rows. A head `M` is then
//! closed except for what the frozen row's holders wrote. Those are read from the server: the
//! holders are the transactions the queued request waits for (`INNODB_LOCK_WAITS`); once every
//! one of them is idle (`PROCESSLIST.COMMAND = 'Sleep'`: no statement of theirs is running, so
//! every `seq <= M` they drew is in the table), a dirty read of the new range lists their
//! uncommitted rows, and only the slots of those rows are held back (`ferry_gate_hold`: reads of
//! such a slot stop below its first uncommitted `seq`); every other slot reads up to
//! `partial_seq = M`. When the queued request is granted, every holder has ended and the next
//! head is closed for every slot again.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::Weak;
use std::time::Duration;

use ferry_core::{SlotId, StoreError, StoreErrorKind};
use sqlx::mysql::MySqlConnection;
use sqlx::{ConnectOptions, Connection, Executor, MySql, MySqlPool, QueryBuilder, Row};
use tokio::task::JoinHandle;

use super::sql;
use crate::db_err;
use crate::mysql::push_list;

/// The ticker's pace while intents keep arriving, and its poll when nothing does (a reader that
/// caught up wakes it at once).
const BUSY_TICK: Duration = Duration::from_millis(1);
const IDLE_TICK: Duration = Duration::from_millis(50);
/// The ticker writes `ferry_gate_horizon.ticked_at` at least this often, even when nothing is
/// new.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// A ticker that has not written `ticked_at` for this long while holding the election lock (a
/// paused or hung process; or one waiting this long for an open producer transaction it could
/// not leave to a waiter) has its connections killed by a relay that wants to tick, which then
/// takes over.
pub(crate) const STALE_TICKER_S: i64 = 30;
/// Rows of `ferry_commit_gate` (migration 0007).
const GATE_ROWS: i8 = 4;
/// How long the ticker waits for a gate row before it leaves the request to a waiter and goes
/// on with the other rows.
const FREEZE_AFTER: Duration = Duration::from_millis(200);
/// At most this many rows wait at once: the ticker alternates between two of the others, so a
/// producer always finds a row nobody holds or awaits exclusively.
const MAX_FROZEN: usize = GATE_ROWS as usize - 2;
/// The server refreshes its lock view (`INNODB_TRX`, `INNODB_LOCK_WAITS`) only when it was last
/// read more than 100 ms ago: read more often, it would show the same old picture for ever.
const LOCK_VIEW_EVERY: Duration = Duration::from_millis(150);
/// The lock wait of the ticker's gate connections (a waiter waits as long as the transaction it
/// waits for lasts; a year is the practical "for ever").
const GATE_LOCK_WAIT_S: u32 = 31_536_000;

/// The store's handle on its ticker task (started by the first cursor read).
#[derive(Debug, Default)]
pub(crate) struct Ticker {
    pub(crate) started: AtomicBool,
    pub(crate) wake: tokio::sync::Notify,
}

/// What reads may return, per slot: `horizon` everywhere, or `partial` (when set) except in the
/// held slots, which stop below their first `seq` that may still be open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Horizon {
    pub(crate) horizon: i64,
    pub(crate) partial: Option<i64>,
    pub(crate) holds: HashMap<SlotId, i64>,
}

impl Horizon {
    /// The highest `seq` of `slot` that is final.
    pub(crate) fn of(&self, slot: SlotId) -> i64 {
        let Some(p) = self.partial else {
            return self.horizon;
        };
        let part = match self.holds.get(&slot) {
            Some(below) => p.min(below - 1),
            None => p,
        };
        self.horizon.max(part)
    }
}

/// Runs ticker sessions until the store is dropped; a failed session (lost connection, lock
/// wait timeout) starts over after a pause.
pub(crate) async fn run_ticker(pool: MySqlPool, ticker: Weak<Ticker>) {
    loop {
        match tick_session(&pool, &ticker).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cursor horizon ticker: starting over");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        if ticker.upgrade().is_none() {
            return;
        }
    }
}

async fn gate_wait(conn: &mut MySqlConnection, parity: i8) -> Result<(), StoreError> {
    conn.execute("START TRANSACTION")
        .await
        .map_err(|e| db_err("ticker: begin", e))?;
    sqlx::query(sql::TICKER_GATE)
        .bind(parity)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| db_err("ticker: gate", e))?;
    Ok(())
}

/// A dedicated connection of the ticker's session, with its id.
async fn session_conn(pool: &MySqlPool) -> Result<(MySqlConnection, i64), StoreError> {
    // The pool's options (URL, TLS), without statement logging: a gate request waits as long
    // as the transactions it waits for, by design, and must not log a slow-statement warning.
    let opts = pool
        .connect_options()
        .as_ref()
        .clone()
        .disable_statement_logging();
    let mut conn = MySqlConnection::connect_with(&opts)
        .await
        .map_err(|e| db_err("ticker: connect", e))?;
    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .await
        .map_err(|e| db_err("ticker: connect", e))?;
    // The pool's sessions end transactions idle for 10 s; the ticker's must not end that way
    // (it would look like a crash): a stopped ticker is replaced by the stale-ticker check
    // instead, whether it stopped inside a transaction or between two. (MySQL has no such
    // variable: the error is ignored.)
    let _ = conn
        .execute("SET SESSION idle_transaction_timeout = 0")
        .await;
    let id: i64 = sqlx::query_scalar(sql::TICKER_CONNECTION_ID)
        .fetch_one(&mut conn)
        .await
        .map_err(|e| db_err("ticker: connection id", e))?;
    Ok((conn, id))
}

/// Waits for the election lock (held by the ticking relay's main connection until it ends),
/// replacing a ticker that stopped ticking. Returns `false` when the store is gone.
async fn win_election(
    conn: &mut MySqlConnection,
    ticker: &Weak<Ticker>,
) -> Result<bool, StoreError> {
    // `unregistered`: a holder of the lock that has not (yet) written its connection id into
    // `ferry_gate_horizon`, and since when this session has seen it so.
    let mut unregistered: Option<(i64, tokio::time::Instant)> = None;
    loop {
        let got: Option<i64> = sqlx::query_scalar(sql::TICKER_ELECTION)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| db_err("ticker: election", e))?;
        if got == Some(1) {
            return Ok(true);
        }
        if ticker.upgrade().is_none() {
            return Ok(false);
        }
        // The holder stopped ticking (a stopped process keeps its connections, and with them
        // the lock and its gate locks, outside any transaction the server would time out): end
        // its sessions. Killing a ticker is always safe; the horizon only moves on a closed
        // head. A holder that stopped between winning the lock and registering (the statements
        // after the election) never writes `ticked_at` and holds no gate row: it is stale once
        // this session has seen it unregistered for as long.
        let (holder, registered, stale, conns): (Option<i64>, Option<i64>, i64, Option<String>) =
            sqlx::query_as(sql::TICKER_STALE_CHECK)
                .bind(STALE_TICKER_S)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| db_err("ticker: stale check", e))?;
        let Some(holder) = holder else {
            unregistered = None;
            continue;
        };
        let kill: Vec<i64> = if registered == Some(holder) {
            unregistered = None;
            if stale == 1 {
                // every connection of its session: its gate rows are held on the others
                let mut ids: Vec<i64> = conns
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|s| s.trim().parse().ok())
                    .collect();
                if !ids.contains(&holder) {
                    ids.push(holder);
                }
                ids
            } else {
                Vec::new()
            }
        } else {
            match unregistered {
                Some((h, since)) if h == holder => {
                    if since.elapsed() >= Duration::from_secs(STALE_TICKER_S as u64) {
                        vec![holder]
                    } else {
                        Vec::new()
                    }
                }
                _ => {
                    unregistered = Some((holder, tokio::time::Instant::now()));
                    Vec::new()
                }
            }
        };
        if !kill.is_empty() {
            tracing::warn!(
                connections = ?kill,
                "cursor horizon ticker: the elected ticker has not ticked for {STALE_TICKER_S} s; ending its sessions and taking over"
            );
            unregistered = None;
            for id in kill {
                // KILL takes no placeholder; `id` is an integer read from the database
                if let Err(e) = conn.execute(format!("KILL CONNECTION {id}").as_str()).await {
                    tracing::warn!(error = %e, connection = id, "cursor horizon ticker: cannot end a session of the stale ticker");
                }
            }
        }
    }
}

/// One ticker session: wins the election (or waits for it), opens a connection per gate row,
/// then ticks until the store is gone. Returns `Ok` when the store is gone.
async fn tick_session(pool: &MySqlPool, ticker: &Weak<Ticker>) -> Result<(), StoreError> {
    let (mut conn, me) = session_conn(pool).await?;
    if !win_election(&mut conn, ticker).await? {
        return Ok(());
    }
    let mut gates = Vec::new();
    for parity in 0..GATE_ROWS {
        let (mut c, id) = session_conn(pool).await?;
        c.execute(format!("SET SESSION innodb_lock_wait_timeout = {GATE_LOCK_WAIT_S}").as_str())
            .await
            .map_err(|e| db_err("ticker: lock wait", e))?;
        gates.push(GateRow {
            parity,
            conn_id: id,
            state: Gate::Free(c),
        });
    }
    let conns = std::iter::once(me)
        .chain(gates.iter().map(|g| g.conn_id))
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    // Register at once, so a ticker that hangs before its first horizon is recognised as stale
    // too; an earlier session's partial horizon is dropped (this one rebuilds its holds).
    let mut tx = conn
        .begin()
        .await
        .map_err(|e| db_err("ticker: register", e))?;
    sqlx::query(sql::TICKER_REGISTER)
        .bind(me)
        .bind(&conns)
        .execute(&mut *tx)
        .await
        .map_err(|e| db_err("ticker: register", e))?;
    tx.execute("DELETE FROM ferry_gate_hold")
        .await
        .map_err(|e| db_err("ticker: register", e))?;
    let start: i64 = sqlx::query_scalar(sql::TICKER_HORIZON)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| db_err("ticker: register", e))?;
    tx.commit()
        .await
        .map_err(|e| db_err("ticker: register", e))?;
    let mut s = Session {
        me,
        gates,
        closed: None,
        published: None,
        analysed: start,
        holds: BTreeMap::new(),
        published_holds: BTreeMap::new(),
        lock_waits_readable: true,
        idle_blockers_since: None,
        lock_view_read: None,
        holders: HashMap::new(),
    };
    let r = s.run(&mut conn, ticker).await;
    if r.is_ok() {
        let _ = conn.close().await;
    }
    r
}

/// What a tick closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    /// Every `seq` at or below it is final.
    Full(i64),
    /// Every `seq` at or below it is final outside the held slots.
    Partial(i64),
}

type Waiter = JoinHandle<(MySqlConnection, Result<(), StoreError>)>;

enum Gate {
    /// Not held by the ticker (its connection idle).
    Free(MySqlConnection),
    /// Held exclusively (its connection's transaction open).
    Held(MySqlConnection),
    /// An exclusive request queued behind transactions that took long (the waiter owns the
    /// connection).
    Frozen(Waiter),
    /// Moved out for a moment.
    Gone,
}

struct GateRow {
    parity: i8,
    conn_id: i64,
    state: Gate,
}

struct Session {
    me: i64,
    gates: Vec<GateRow>,
    closed: Option<Closed>,
    published: Option<Closed>,
    /// Rows at or below it are known: final, or held in `holds`.
    analysed: i64,
    /// Slot → its first `seq` that may still be open (while rows are frozen).
    holds: BTreeMap<i16, i64>,
    published_holds: BTreeMap<i16, i64>,
    /// `INNODB_LOCK_WAITS`/`PROCESSLIST` readable (the `PROCESS` privilege): without it the
    /// ticker never leaves a row to a waiter, and a long transaction holds every slot.
    lock_waits_readable: bool,
    /// Since when every transaction holding a frozen row has been idle (for the log).
    idle_blockers_since: Option<tokio::time::Instant>,
    /// When the lock view was last read.
    lock_view_read: Option<tokio::time::Instant>,
    /// Per waiting connection, the transactions (their connection ids) that held its row when
    /// the lock view first showed its request.
    holders: HashMap<i64, HashSet<i64>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        for g in &self.gates {
            if let Gate::Frozen(w) = &g.state {
                w.abort();
            }
        }
    }
}

fn join_err(e: tokio::task::JoinError) -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        format!("ticker: gate waiter: {e}"),
    )
}

impl Session {
    fn frozen(&self) -> usize {
        self.gates
            .iter()
            .filter(|g| matches!(g.state, Gate::Frozen(_)))
            .count()
    }

    async fn run(
        &mut self,
        conn: &mut MySqlConnection,
        ticker: &Weak<Ticker>,
    ) -> Result<(), StoreError> {
        let mut beat = tokio::time::Instant::now();
        loop {
            let Some(t) = ticker.upgrade() else {
                return Ok(());
            };
            self.hold_some().await?;
            // Holding the `Held` rows exclusively: every transaction that may still own a seq
            // below the head read now holds one of the others.
            let head: i64 = sqlx::query_scalar(sql::TICKER_HEAD)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| db_err("ticker: head", e))?;
            if self.closed.is_some()
                && (self.closed != self.published || beat.elapsed() >= HEARTBEAT)
            {
                self.publish(conn).await?;
                beat = tokio::time::Instant::now();
            }
            let released = self.release().await?;
            let last = match self.closed {
                Some(Closed::Full(h) | Closed::Partial(h)) => Some(h),
                None => None,
            };
            if Some(head) != last {
                tokio::time::sleep(BUSY_TICK).await;
            } else {
                tokio::select! {
                    _ = t.wake.notified() => {}
                    _ = tokio::time::sleep(IDLE_TICK) => {}
                }
            }
            drop(t);
            // every row not held when the head was read: taken now, or frozen
            for i in 0..self.gates.len() {
                if !released.contains(&i) && matches!(self.gates[i].state, Gate::Free(_)) {
                    self.take(i).await?;
                }
            }
            let unfrozen = self.collect_granted().await?;
            if self.frozen() == 0 {
                self.closed = Some(Closed::Full(head));
                self.analysed = head;
                self.holds.clear();
                if unfrozen {
                    tracing::info!("cursor horizon ticker: the transactions that held a gate row have ended; every slot reads to the horizon again");
                }
            } else if self.analyse(conn, head).await? {
                self.closed = Some(Closed::Partial(head));
            }
        }
    }

    /// Makes sure some row is held (at the start, or after every row the ticker asked for
    /// froze).
    async fn hold_some(&mut self) -> Result<(), StoreError> {
        while !self.gates.iter().any(|g| matches!(g.state, Gate::Held(_))) {
            let Some(i) = self
                .gates
                .iter()
                .position(|g| matches!(g.state, Gate::Free(_)))
            else {
                return Err(StoreError::new(
                    StoreErrorKind::Conflict,
                    "ticker: no gate row left to take",
                ));
            };
            self.take(i).await?;
        }
        Ok(())
    }

    /// Asks for gate row `i` exclusively; leaves the request to a waiter (the row freezes) when
    /// it is not granted within [`FREEZE_AFTER`] and fewer than [`MAX_FROZEN`] rows are frozen.
    async fn take(&mut self, i: usize) -> Result<(), StoreError> {
        let Gate::Free(mut c) = std::mem::replace(&mut self.gates[i].state, Gate::Gone) else {
            return Err(StoreError::new(
                StoreErrorKind::Conflict,
                "ticker: gate row not free",
            ));
        };
        let parity = self.gates[i].parity;
        let mut waiter: Waiter = tokio::spawn(async move {
            let r = gate_wait(&mut c, parity).await;
            (c, r)
        });
        let freezable = self.lock_waits_readable && self.frozen() < MAX_FROZEN;
        let joined = if freezable {
            match tokio::time::timeout(FREEZE_AFTER, &mut waiter).await {
                Ok(j) => j,
                Err(_) => {
                    tracing::info!(
                        gate = parity,
                        "cursor horizon ticker: a transaction holds gate row {parity} for long; reading on for the slots it did not write"
                    );
                    self.gates[i].state = Gate::Frozen(waiter);
                    return Ok(());
                }
            }
        } else {
            (&mut waiter).await
        };
        let (c, r) = joined.map_err(join_err)?;
        r?;
        self.gates[i].state = Gate::Held(c);
        Ok(())
    }

    /// Frozen rows whose request was granted (every transaction that held them has ended) are
    /// released; returns whether any was.
    async fn collect_granted(&mut self) -> Result<bool, StoreError> {
        let mut any = false;
        for g in &mut self.gates {
            let done = matches!(&g.state, Gate::Frozen(w) if w.is_finished());
            if !done {
                continue;
            }
            let Gate::Frozen(w) = std::mem::replace(&mut g.state, Gate::Gone) else {
                unreachable!("checked above");
            };
            let (mut c, r) = w.await.map_err(join_err)?;
            r?;
            c.execute("COMMIT")
                .await
                .map_err(|e| db_err("ticker: release", e))?;
            g.state = Gate::Free(c);
            self.holders.remove(&g.conn_id);
            any = true;
        }
        if any {
            self.idle_blockers_since = None;
        }
        Ok(any)
    }

    /// Releases the held rows; returns their indexes.
    async fn release(&mut self) -> Result<Vec<usize>, StoreError> {
        let mut released = Vec::new();
        for (i, g) in self.gates.iter_mut().enumerate() {
            if !matches!(g.state, Gate::Held(_)) {
                continue;
            }
            let Gate::Held(mut c) = std::mem::replace(&mut g.state, Gate::Gone) else {
                unreachable!("checked above");
            };
            c.execute("COMMIT")
                .await
                .map_err(|e| db_err("ticker: release", e))?;
            g.state = Gate::Free(c);
            released.push(i);
        }
        Ok(released)
    }

    /// Publishes the last closed head (and the holds with a partial one), with `ticked_at`.
    async fn publish(&mut self, conn: &mut MySqlConnection) -> Result<(), StoreError> {
        let mut tx = conn
            .begin()
            .await
            .map_err(|e| db_err("ticker: publish", e))?;
        match self.closed {
            Some(Closed::Full(h)) => {
                sqlx::query(sql::TICKER_PUBLISH)
                    .bind(h)
                    .bind(self.me)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("ticker: publish", e))?;
                if !self.published_holds.is_empty() {
                    tx.execute("DELETE FROM ferry_gate_hold")
                        .await
                        .map_err(|e| db_err("ticker: publish", e))?;
                    self.published_holds.clear();
                }
            }
            Some(Closed::Partial(p)) => {
                // the holds first, in the same transaction: a reader sees the new partial
                // horizon only with every hold computed up to it
                let new: Vec<(i16, i64)> = self
                    .holds
                    .iter()
                    .filter(|(s, b)| self.published_holds.get(s) != Some(b))
                    .map(|(s, b)| (*s, *b))
                    .collect();
                if !new.is_empty() {
                    let mut qb = QueryBuilder::<MySql>::new(
                        "INSERT INTO ferry_gate_hold (shard_slot, below_seq) ",
                    );
                    qb.push_values(&new, |mut b, (s, seq)| {
                        b.push_bind(*s).push_bind(*seq);
                    });
                    qb.push(
                        " ON DUPLICATE KEY UPDATE below_seq = LEAST(below_seq, VALUES(below_seq))",
                    );
                    qb.build()
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_err("ticker: publish holds", e))?;
                    self.published_holds.extend(new);
                }
                sqlx::query(sql::TICKER_PUBLISH_PARTIAL)
                    .bind(p)
                    .bind(self.me)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("ticker: publish", e))?;
            }
            None => {}
        }
        tx.commit()
            .await
            .map_err(|e| db_err("ticker: publish", e))?;
        self.published = self.closed;
        Ok(())
    }

    /// Closes `head` outside the slots that the frozen rows' holders wrote: `false` when that
    /// cannot be known yet (a holder is running a statement, or the server's lock view is
    /// older than the waiters' requests).
    async fn analyse(&mut self, conn: &mut MySqlConnection, head: i64) -> Result<bool, StoreError> {
        let waiters: Vec<i64> = self
            .gates
            .iter()
            .filter(|g| matches!(g.state, Gate::Frozen(_)))
            .map(|g| g.conn_id)
            .collect();
        // 1. who holds the frozen rows: the transactions each waiter's request waits for, read
        // once per waiter from the server's lock view and kept: the holders only ever leave, so
        // the first view that shows the waiter names every later holder (and some that may have
        // ended since, which only makes the check below stricter). A view that does not show a
        // waiter predates its request (or it was just granted): nothing is concluded from it.
        let missing: Vec<i64> = waiters
            .iter()
            .copied()
            .filter(|w| !self.holders.contains_key(w))
            .collect();
        if !missing.is_empty() {
            if self
                .lock_view_read
                .is_some_and(|t| t.elapsed() < LOCK_VIEW_EVERY)
            {
                return Ok(false);
            }
            self.lock_view_read = Some(tokio::time::Instant::now());
            let mut qb = QueryBuilder::<MySql>::new(
                "SELECT CAST(r.trx_mysql_thread_id AS SIGNED), CAST(b.trx_mysql_thread_id AS SIGNED) \
                 FROM information_schema.INNODB_LOCK_WAITS w \
                 JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id \
                 JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id \
                 WHERE r.trx_mysql_thread_id IN (",
            );
            push_list(&mut qb, missing.iter().copied());
            qb.push(")");
            let pairs: Vec<(i64, i64)> = match qb.build_query_as().fetch_all(&mut *conn).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        "cursor horizon ticker: cannot read the server's lock waits (the PROCESS privilege); an open producer transaction holds every slot until it ends"
                    );
                    self.lock_waits_readable = false;
                    return Ok(false);
                }
            };
            for (w, b) in pairs {
                self.holders.entry(w).or_default().insert(b);
            }
            if missing.iter().any(|w| !self.holders.contains_key(w)) {
                return Ok(false);
            }
        }
        let blockers: Vec<i64> = waiters
            .iter()
            .flat_map(|w| self.holders[w].iter().copied())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        // 2. every one of them idle: no statement of theirs is running, so every seq they drew
        // before the head was read is in the table (a holder that is gone has ended)
        let mut qb = QueryBuilder::<MySql>::new(
            "SELECT CAST(ID AS SIGNED), COMMAND FROM information_schema.PROCESSLIST WHERE ID IN (",
        );
        push_list(&mut qb, blockers.iter().copied());
        qb.push(")");
        let commands: Vec<(i64, String)> = qb
            .build_query_as()
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| db_err("ticker: processlist", e))?;
        if commands.iter().any(|(_, c)| c != "Sleep") {
            self.idle_blockers_since = None;
            return Ok(false);
        }
        if self.idle_blockers_since.is_none() {
            self.idle_blockers_since = Some(tokio::time::Instant::now());
            tracing::debug!(connections = ?blockers, "cursor horizon ticker: reading past idle transactions that hold gate rows");
        }
        // 3. their uncommitted rows of the new range: in a dirty read, not in a committed one
        // (the committed read first: a row that commits in between counts as open, one tick)
        let committed: HashSet<i64> = sqlx::query_scalar(sql::TICKER_COMMITTED_ROWS)
            .bind(self.analysed)
            .bind(head)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| db_err("ticker: committed rows", e))?
            .into_iter()
            .collect();
        conn.execute("SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
            .await
            .map_err(|e| db_err("ticker: dirty read", e))?;
        let dirty: Vec<(i64, i16)> = sqlx::query_as(sql::TICKER_DIRTY_READ)
            .bind(self.analysed)
            .bind(head)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| db_err("ticker: dirty read", e))?;
        for (seq, slot) in dirty {
            if !committed.contains(&seq) {
                let below = self.holds.entry(slot).or_insert(seq);
                *below = (*below).min(seq);
            }
        }
        self.analysed = head;
        Ok(true)
    }
}

/// Reads the published horizon and, while a partial one is set, its holds, in one statement
/// (one read view); with whether any exception row is open.
pub(crate) async fn read_horizon(
    conn: &mut MySqlConnection,
) -> Result<(Horizon, bool), StoreError> {
    let rows = sqlx::query(sql::CURSOR_READ_HORIZON)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| db_err("cursor read: horizon", e))?;
    let mut h = Horizon::default();
    let mut open = false;
    for r in &rows {
        h.horizon = r.get(0);
        h.partial = r.get(1);
        open = r.get::<i64, _>(2) != 0;
        if let (Some(slot), Some(below)) = (r.get::<Option<i16>, _>(3), r.get::<Option<i64>, _>(4))
        {
            h.holds.insert(slot as SlotId, below);
        }
    }
    Ok((h, open))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_slot_stops_below_its_first_open_row() {
        let mut h = Horizon {
            horizon: 10,
            partial: None,
            holds: HashMap::new(),
        };
        assert_eq!(h.of(3), 10);
        h.partial = Some(50);
        h.holds.insert(3, 20);
        assert_eq!(h.of(3), 19);
        assert_eq!(h.of(4), 50);
        // a hold below the full horizon (left from an earlier freeze) never takes it back
        h.holds.insert(5, 4);
        assert_eq!(h.of(5), 10);
    }
}
