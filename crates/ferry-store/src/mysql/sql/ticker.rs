//! The commit gate and its ticker: the election, the gate rows, the head and the published
//! horizon, and the server views it reads holders from.
use sqlx::{MySql, QueryBuilder};

use super::fragments::push_list;

/// Requests gate row `?` exclusively.
pub(crate) const TICKER_GATE: &str =
    "SELECT parity FROM ferry_commit_gate WHERE parity = ? FOR UPDATE";

/// This connection's id.
pub(crate) const TICKER_CONNECTION_ID: &str = "SELECT CAST(CONNECTION_ID() AS SIGNED)";

/// The ticker election: this database's ticker lock, waited for 1 s.
pub(crate) const TICKER_ELECTION: &str = "SELECT GET_LOCK(CONCAT('ferry_ticker:', DATABASE()), 1)";

/// Who holds the ticker lock, the registered ticker's connection and gate connections, and whether
/// it has not ticked for `?` s.
pub(crate) const TICKER_STALE_CHECK: &str = "SELECT CAST(IS_USED_LOCK(CONCAT('ferry_ticker:', DATABASE())) AS SIGNED), ticker_conn, \
                   CAST(coalesce(ticked_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND, 0) AS SIGNED), ticker_conns \
                 FROM ferry_gate_horizon WHERE id = 1";

/// Registers this session's ticker connection and gate connections; drops an earlier session's
/// partial horizon.
pub(crate) const TICKER_REGISTER: &str =
    "UPDATE ferry_gate_horizon SET ticker_conn = ?, ticker_conns = ?, \
         ticked_at = UTC_TIMESTAMP(6), partial_seq = NULL WHERE id = 1";

/// The published horizon.
pub(crate) const TICKER_HORIZON: &str = "SELECT horizon_seq FROM ferry_gate_horizon WHERE id = 1";

/// The head: the highest seq drawn so far.
pub(crate) const TICKER_HEAD: &str =
    "SELECT CAST(coalesce(max(seq), 0) AS SIGNED) FROM ferry_outbox";

/// Publishes a closed head for every slot.
pub(crate) const TICKER_PUBLISH: &str =
    "UPDATE ferry_gate_horizon SET horizon_seq = GREATEST(horizon_seq, ?), partial_seq = NULL, \
                     ticked_at = UTC_TIMESTAMP(6), ticker_conn = ? WHERE id = 1";

/// Publishes a head closed outside the held slots.
pub(crate) const TICKER_PUBLISH_PARTIAL: &str =
    "UPDATE ferry_gate_horizon SET partial_seq = GREATEST(coalesce(partial_seq, 0), ?), \
                     ticked_at = UTC_TIMESTAMP(6), ticker_conn = ? WHERE id = 1";

/// The committed rows of a range.
pub(crate) const TICKER_COMMITTED_ROWS: &str =
    "SELECT seq FROM ferry_outbox WHERE seq > ? AND seq <= ?";

/// Every row of a range, committed or not (read uncommitted), with its slot.
pub(crate) const TICKER_DIRTY_READ: &str =
    "SELECT seq, shard_slot FROM ferry_outbox WHERE seq > ? AND seq <= ?";

/// A gate connection's transaction, in which it requests its gate row.
pub(crate) const GATE_BEGIN: &str = "START TRANSACTION";

/// The dirty read of a frozen row's holders' uncommitted rows.
pub(crate) const DIRTY_READ_ISOLATION: &str = "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED";

/// Drops every held-back slot (`ferry_gate_hold`).
pub(crate) const CLEAR_GATE_HOLDS: &str = "DELETE FROM ferry_gate_hold";

/// A new ticker session drops an earlier session's held-back slots.
pub(crate) const CLEAR_GATE_HOLDS_ON_REGISTER: &str = "DELETE FROM ferry_gate_hold";

/// The ticker's sessions wait inside transactions by design: no idle-in-transaction timeout.
pub(crate) const TICKER_NO_IDLE_TIMEOUT: &str = "SET SESSION idle_transaction_timeout = 0";

/// The ticker's sessions run at READ COMMITTED.
pub(crate) const TICKER_READ_COMMITTED: &str =
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// The ticker's new holds `(slot, below_seq)`; a slot's hold only ever moves down.
pub(crate) fn publish_holds<'a>(holds: &'a [(i16, i64)]) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::new("INSERT INTO ferry_gate_hold (shard_slot, below_seq) ");
    qb.push_values(holds, |mut b, (s, seq)| {
        b.push_bind(*s).push_bind(*seq);
    });
    qb.push(" ON DUPLICATE KEY UPDATE below_seq = LEAST(below_seq, VALUES(below_seq))");
    qb
}

/// The server's lock view: `(waiter, holder)` connection ids of the lock waits of `waiters`
/// (needs the PROCESS privilege).
pub(crate) fn lock_waits<'a>(waiters: &[i64]) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::new(
        "SELECT CAST(r.trx_mysql_thread_id AS SIGNED), CAST(b.trx_mysql_thread_id AS SIGNED) \
         FROM information_schema.INNODB_LOCK_WAITS w \
         JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id \
         JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id \
         WHERE r.trx_mysql_thread_id IN (",
    );
    push_list(&mut qb, waiters.iter().copied());
    qb.push(")");
    qb
}

/// `(connection id, command)` of the sessions `ids` (`Sleep`: no statement running).
pub(crate) fn session_commands<'a>(ids: &[i64]) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::new(
        "SELECT CAST(ID AS SIGNED), COMMAND FROM information_schema.PROCESSLIST WHERE ID IN (",
    );
    push_list(&mut qb, ids.iter().copied());
    qb.push(")");
    qb
}

/// Ends a stale ticker's session (`KILL` takes no placeholder; `id` is an integer the server
/// gave).
pub(crate) fn kill_connection(id: i64) -> String {
    format!("KILL CONNECTION {id}")
}

/// A gate connection's lock wait.
pub(crate) fn lock_wait_timeout(secs: u32) -> String {
    format!("SET SESSION innodb_lock_wait_timeout = {secs}")
}
