//! The commit gate's rows as the ticker holds them (MySQL/MariaDB): one session of the ticker
//! takes the gate rows in turn, reads the head, publishes the horizon, and leaves a row that a
//! long transaction holds to a waiter (the *frozen* row; [`super::ticker`] describes the scheme).
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Weak;
use std::time::Duration;

use ferry_core::{StoreError, StoreErrorKind};
use sqlx::mysql::MySqlConnection;
use sqlx::{Connection, Executor};
use tokio::task::JoinHandle;

use super::sql;
use super::Ticker;
use crate::error::db_err;

/// The ticker's pace while intents keep arriving, and its poll when nothing does (a reader that
/// caught up wakes it at once).
pub(super) const BUSY_TICK: Duration = Duration::from_millis(1);
pub(super) const IDLE_TICK: Duration = Duration::from_millis(50);
/// The ticker writes `ferry_gate_horizon.ticked_at` at least this often, even when nothing is
/// new.
pub(super) const HEARTBEAT: Duration = Duration::from_secs(1);
/// Rows of `ferry_commit_gate` (migration 0007).
pub(super) const GATE_ROWS: i8 = 4;
/// How long the ticker waits for a gate row before it leaves the request to a waiter and goes
/// on with the other rows.
pub(super) const FREEZE_AFTER: Duration = Duration::from_millis(200);
/// At most this many rows wait at once: the ticker alternates between two of the others, so a
/// producer always finds a row nobody holds or awaits exclusively.
pub(super) const MAX_FROZEN: usize = GATE_ROWS as usize - 2;
/// The server refreshes its lock view (`INNODB_TRX`, `INNODB_LOCK_WAITS`) only when it was last
/// read more than 100 ms ago: read more often, it would show the same old picture for ever.
pub(super) const LOCK_VIEW_EVERY: Duration = Duration::from_millis(150);
/// The lock wait of the ticker's gate connections (a waiter waits as long as the transaction it
/// waits for lasts; a year is the practical "for ever").
pub(super) const GATE_LOCK_WAIT_S: u32 = 31_536_000;
/// What a tick closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    /// Every `seq` at or below it is final.
    Full(i64),
    /// Every `seq` at or below it is final outside the held slots.
    Partial(i64),
}

type Waiter = JoinHandle<(MySqlConnection, Result<(), StoreError>)>;

pub(super) enum Gate {
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

pub(super) struct GateRow {
    pub(super) parity: i8,
    pub(super) conn_id: i64,
    pub(super) state: Gate,
}

pub(super) struct Session {
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

    pub(super) async fn run(
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
                    tx.execute(sql::CLEAR_GATE_HOLDS)
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
                    sql::publish_holds(&new)
                        .build()
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
            let mut qb = sql::lock_waits(&missing);
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
        let mut qb = sql::session_commands(&blockers);
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
        conn.execute(sql::DIRTY_READ_ISOLATION)
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

impl Session {
    /// A session of ticker connection `me` over its `gates`, the published horizon at `start`.
    pub(super) fn new(me: i64, gates: Vec<GateRow>, start: i64) -> Self {
        Self {
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
        }
    }
}

pub(crate) async fn gate_wait(conn: &mut MySqlConnection, parity: i8) -> Result<(), StoreError> {
    conn.execute(sql::GATE_BEGIN)
        .await
        .map_err(|e| db_err("ticker: begin", e))?;
    sqlx::query(sql::TICKER_GATE)
        .bind(parity)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| db_err("ticker: gate", e))?;
    Ok(())
}
