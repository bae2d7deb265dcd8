//! Row dispatch: the claim (window, heads past it, locking re-check, token update) and the
//! fenced outcomes.
use std::borrow::Cow;

use ferry_core::ClaimToken;
use sqlx::{MySql, QueryBuilder};

use super::fragments::{due, push_list, COLUMNS};
use crate::outcome::Transition;

/// `{head} FROM ferry_outbox WHERE seq IN (candidates) AND <still due> ORDER BY seq LIMIT n`:
/// the window the claim's locking re-check reads, and its contention recount reads again.
fn due_window<'a>(head: &str, candidates: &[i64], limit: usize) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::<MySql>::new(format!("{head} FROM ferry_outbox WHERE seq IN ("));
    push_list(&mut qb, candidates.iter().copied());
    qb.push(format!(") AND {} ORDER BY seq LIMIT ", due("")));
    qb.push_bind(limit as i64);
    qb
}

/// Due rows of one state in the owner's slots, in `seq` order up to `upto` (the window's end, when
/// it has one), whose aggregate has no unfinished lower version. `FORCE INDEX`:
/// `ferry_outbox_due` (state, seq, shard_slot, available_at, lease_until) yields seq order and
/// filters slot and due time without touching rows; left to itself the optimizer walked the
/// primary key through every SENT row, or sorted all pending rows of the slots, once the table
/// grew (docs/schema.md, "MariaDB claim plan").
pub(crate) fn candidate_query<'a>(
    state: &str,
    due_column: &str,
    slots: &[i16],
    upto: Option<i64>,
    limit: usize,
) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::<MySql>::new(format!(
        "SELECT o.seq FROM ferry_outbox o FORCE INDEX (ferry_outbox_due) WHERE o.state = '{state}' \
         AND o.shard_slot IN ("
    ));
    push_list(&mut qb, slots.iter().copied());
    qb.push(format!(") AND {due_column} <= UTC_TIMESTAMP(6)"));
    if let Some(end) = upto {
        qb.push(" AND o.seq <= ").push_bind(end);
    }
    qb.push(format!(
        " AND {} AND {} ORDER BY o.seq LIMIT ",
        predecessor_free("o"),
        crate::operator::pause::not_paused("o")
    ));
    qb.push_bind(limit as i64);
    qb
}

/// The predecessor rule on the row aliased `a`: its aggregate has no unfinished lower version.
/// One probe of `ferry_outbox_predecessor` (state, aggregate_id, aggregate_version) per unfinished
/// state, each an equality on `state` and `aggregate_id`: MariaDB reads a dependent subquery by
/// `ref` on an equality prefix only. With `state IN (…)` it took the unique key's
/// `aggregate_id` instead and read every version of the aggregate, SENT ones included, so a
/// probe cost the aggregate's history; left to choose, it read all CLAIMED rows by
/// `ferry_outbox_sent_at` (state, sent_at) for each probe, hence `FORCE INDEX`. The PENDING probe reads one entry, the aggregate's lowest
/// PENDING version (a `NOT EXISTS` would read all of them for a row that is the lowest);
/// CLAIMED and QUARANTINED versions of an aggregate are few.
fn predecessor_free(a: &str) -> String {
    let none_lower = |state: &str| {
        format!(
            "NOT EXISTS (SELECT 1 FROM ferry_outbox p FORCE INDEX (ferry_outbox_predecessor) \
               WHERE p.state = '{state}' AND p.aggregate_id = {a}.aggregate_id \
               AND p.aggregate_version < {a}.aggregate_version)"
        )
    };
    format!(
        "{a}.aggregate_version <= COALESCE((SELECT p.aggregate_version \
           FROM ferry_outbox p FORCE INDEX (ferry_outbox_predecessor) \
           WHERE p.state = 'PENDING' AND p.aggregate_id = {a}.aggregate_id \
           ORDER BY p.aggregate_version LIMIT 1), {a}.aggregate_version) \
         AND {} AND {}",
        none_lower("CLAIMED"),
        none_lower("QUARANTINED")
    )
}

/// The window's end: the seq of the `rows`-th due PENDING row of the slots (`OFFSET rows - 1`),
/// none when fewer are due. An index-only walk of `ferry_outbox_due`.
pub(crate) fn window_end<'a>(slots: &[i16], rows: i64) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::<MySql>::new(
        "SELECT o.seq FROM ferry_outbox o FORCE INDEX (ferry_outbox_due) WHERE o.state = 'PENDING' \
         AND o.shard_slot IN (",
    );
    push_list(&mut qb, slots.iter().copied());
    qb.push(") AND o.available_at <= UTC_TIMESTAMP(6) ORDER BY o.seq LIMIT 1 OFFSET ")
        .push_bind((rows - 1).max(0));
    qb
}

/// PENDING index entries one statement of the scan for heads reads ([`heads_after`]).
pub(crate) const HEAD_ENTRIES: i64 = 1024;

/// The heads of the aggregates after `from` that have a PENDING version, among the next
/// [`HEAD_ENTRIES`] PENDING entries of `ferry_outbox_predecessor` (state, aggregate_id,
/// aggregate_version) in index order, and whether the claim may take each:
/// `(aggregate_id, seq, claimable, entries)`, in aggregate order. The head of an aggregate is its
/// lowest PENDING version (the first of its entries: the read starts after `from`'s last); it is
/// claimable under the window's predicate (due, in the claim's slots, no unfinished lower version,
/// not paused) and lies past the window's end `after`. `entries` summed over the rows is how many
/// index entries the read took: fewer than [`HEAD_ENTRIES`] means it reached the last aggregate.
/// The last aggregate may have more versions past the read; its head is still the first.
/// Parameters, bound in this order: the slots, `after`, `from`, the entries.
pub(crate) fn heads_after<'a>(slots: &[i16], after: i64, from: &'a str) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::<MySql>::new("SELECT w.aggregate_id, o.seq, (o.shard_slot IN (");
    push_list(&mut qb, slots.iter().copied());
    qb.push(") AND o.available_at <= UTC_TIMESTAMP(6) AND o.seq > ")
        .push_bind(after);
    qb.push(format!(
        " AND {} AND {}), w.entries \
         FROM (SELECT u.aggregate_id, MIN(u.aggregate_version) AS v, COUNT(*) AS entries \
               FROM (SELECT aggregate_id, aggregate_version FROM ferry_outbox FORCE INDEX (ferry_outbox_predecessor) \
                     WHERE state = 'PENDING' AND aggregate_id > ",
        predecessor_free("o"),
        crate::operator::pause::not_paused("o")
    ));
    qb.push_bind(from);
    qb.push(" ORDER BY aggregate_id, aggregate_version LIMIT ")
        .push_bind(HEAD_ENTRIES);
    qb.push(
        ") u GROUP BY u.aggregate_id) w \
         JOIN ferry_outbox o ON o.aggregate_id = w.aggregate_id AND o.aggregate_version = w.v \
         ORDER BY w.aggregate_id",
    );
    qb
}

/// A CAS predicate over tokens: `seq IN (…) AND (seq, claim_version, claim_id) IN ((…), …)`.
pub(crate) fn push_tokens<'a>(qb: &mut QueryBuilder<'a, MySql>, tokens: &'a [ClaimToken]) {
    qb.push("state = 'CLAIMED' AND seq IN (");
    push_list(qb, tokens.iter().map(|t| t.seq));
    qb.push(") AND (seq, claim_version, claim_id) IN (");
    let mut first = true;
    for t in tokens {
        if !first {
            qb.push(", ");
        }
        first = false;
        qb.push("(")
            .push_bind(t.seq)
            .push(", ")
            .push_bind(t.claim_version)
            .push(", ")
            .push_bind(&t.claim_id)
            .push(")");
    }
    qb.push(")");
}

/// The SET clause of an outcome, the same on both tables. Per-item values are bound in the
/// order the clause reads them (delay, then text).
pub(crate) fn outcome_set(to: Transition) -> Cow<'static, str> {
    match to {
        Transition::Ack => "state = 'SENT', sent_at = UTC_TIMESTAMP(6), lease_until = NULL".into(),
        Transition::Retry => "available_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, last_error = ?, state = 'PENDING', \
             lease_until = NULL, attempts = attempts + 1"
            .into(),
        Transition::Quarantine => "available_at = available_at + INTERVAL ? MICROSECOND, last_error = ?, state = 'QUARANTINED', \
             lease_until = NULL, attempts = attempts + 1"
            .into(),
        Transition::Release => {
            "state = 'PENDING', lease_until = NULL, available_at = UTC_TIMESTAMP(6)".into()
        }
        Transition::Extend { lease_us } => {
            format!("lease_until = UTC_TIMESTAMP(6) + INTERVAL {lease_us} MICROSECOND").into()
        }
    }
}

/// The update of a claim's locked rows `seqs` of `table` (`ferry_outbox` or
/// `ferry_outbox_exception`, fixed constants): CLAIMED under the request's claim id, the next
/// claim version, a lease to now + the request's lease.
pub(crate) fn claim_update<'a>(
    table: &str,
    req: &'a ferry_core::ClaimRequest,
    seqs: impl IntoIterator<Item = i64>,
) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::<MySql>::new(format!(
        "UPDATE {table} SET state = 'CLAIMED', claim_version = claim_version + 1, claim_id = "
    ));
    qb.push_bind(&req.claim_id)
        .push(", lease_until = UTC_TIMESTAMP(6) + INTERVAL ")
        .push_bind(crate::time::micros(req.lease))
        .push(" MICROSECOND WHERE seq IN (");
    push_list(&mut qb, seqs);
    qb.push(")");
    qb
}

/// The claim's locking re-check: the candidates still due, in seq order up to `limit`, each
/// row locked, rows another transaction holds passed over.
pub(crate) fn lock_due<'a>(candidates: &[i64], limit: usize) -> QueryBuilder<'a, MySql> {
    let mut qb = due_window(&format!("SELECT {COLUMNS}"), candidates, limit);
    qb.push(" FOR UPDATE SKIP LOCKED");
    qb
}

/// The same window counted by a plain read, which sees the locked rows too: how many
/// candidates a short [`lock_due`] passed over.
pub(crate) fn count_due<'a>(candidates: &[i64], limit: usize) -> QueryBuilder<'a, MySql> {
    let mut qb = due_window("SELECT count(*) FROM (SELECT seq", candidates, limit);
    qb.push(") w");
    qb
}

/// An outcome of one token with its per-item values (delay, then text; [`outcome_set`]) on
/// `table` (a fixed constant).
pub(crate) fn outcome_one(table: &str, set: &str) -> String {
    format!("UPDATE {table} SET {set} WHERE state = 'CLAIMED' AND seq = ? AND claim_version = ? AND claim_id = ?")
}

/// An outcome of a chunk of tokens ([`push_tokens`]) on `table`.
pub(crate) fn outcome_tokens<'a>(
    table: &str,
    set: &str,
    tokens: &'a [ClaimToken],
) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::new(format!("UPDATE {table} SET {set} WHERE "));
    push_tokens(&mut qb, tokens);
    qb
}

/// The rows of `table` that still carry one of `tokens`, locked: which items of a short
/// outcome apply.
pub(crate) fn lock_tokens<'a>(table: &str, tokens: &'a [ClaimToken]) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::new(format!(
        "SELECT seq, claim_version, claim_id FROM {table} WHERE "
    ));
    push_tokens(&mut qb, tokens);
    qb.push(" FOR UPDATE");
    qb
}

/// The outcome on the rows [`lock_tokens`] locked.
pub(crate) fn outcome_seqs<'a>(table: &str, set: &str, seqs: &[i64]) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::new(format!("UPDATE {table} SET {set} WHERE seq IN ("));
    push_list(&mut qb, seqs.iter().copied());
    qb.push(")");
    qb
}
