//! The commit gate's ticker (MySQL/MariaDB): the task that turns the gate's locks into a
//! horizon (docs/architecture.md, "MySQL/MariaDB: the commit gate").
//!
//! Every transaction that inserts an intent holds a shared lock on one of [`GATE_ROWS`](super::gate::GATE_ROWS) rows of
//! `ferry_commit_gate` from before its first `seq` is drawn until it ends (the `ferry_outbox_gate`
//! trigger, migration 0007). The ticker holds a set `A` of gate rows exclusively, reads the head
//! `M = max(seq)`, releases `A` and takes the other rows exclusively. A transaction that still
//! owns an uncommitted `seq <= M` took its gate row before drawing that `seq` and still holds it,
//! so it holds a row outside `A`: once the ticker holds every other row, it has ended and `M` is
//! closed (`ferry_gate_horizon.horizon_seq`).
//!
//! *A long transaction.* When a row is not granted within [`FREEZE_AFTER`](super::gate::FREEZE_AFTER), the ticker leaves its
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
use std::collections::HashMap;
use std::sync::Weak;
use std::time::Duration;

use ferry_core::{SlotId, StoreError};
use sqlx::mysql::MySqlConnection;
use sqlx::{ConnectOptions, Connection, Executor, MySqlPool, Row};

use super::gate::{Gate, GateRow, Session, GATE_LOCK_WAIT_S, GATE_ROWS};
use super::sql;
use super::Ticker;
use crate::error::db_err;

/// A ticker that has not written `ticked_at` for this long while holding the election lock (a
/// paused or hung process; or one waiting this long for an open producer transaction it could
/// not leave to a waiter) has its connections killed by a relay that wants to tick, which then
/// takes over.
pub(crate) const STALE_TICKER_S: i64 = 30;

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
    conn.execute(sql::TICKER_READ_COMMITTED)
        .await
        .map_err(|e| db_err("ticker: connect", e))?;
    // The pool's sessions end transactions idle for 10 s; the ticker's must not end that way
    // (it would look like a crash): a stopped ticker is replaced by the stale-ticker check
    // instead, whether it stopped inside a transaction or between two. (MySQL has no such
    // variable: the error is ignored.)
    let _ = conn.execute(sql::TICKER_NO_IDLE_TIMEOUT).await;
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
                if let Err(e) = conn.execute(sql::kill_connection(id).as_str()).await {
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
        c.execute(sql::lock_wait_timeout(GATE_LOCK_WAIT_S).as_str())
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
    tx.execute(sql::CLEAR_GATE_HOLDS_ON_REGISTER)
        .await
        .map_err(|e| db_err("ticker: register", e))?;
    let start: i64 = sqlx::query_scalar(sql::TICKER_HORIZON)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| db_err("ticker: register", e))?;
    tx.commit()
        .await
        .map_err(|e| db_err("ticker: register", e))?;
    let mut s = Session::new(me, gates, start);
    let r = s.run(&mut conn, ticker).await;
    if r.is_ok() {
        let _ = conn.close().await;
    }
    r
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
