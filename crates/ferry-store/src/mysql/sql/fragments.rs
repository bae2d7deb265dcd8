//! Pieces of statements the others are built from: the column lists rows are read with, a
//! bound value list, the "due" predicate.
use sqlx::{MySql, QueryBuilder};

/// The columns a claimed row is read with, in the order `claimed_from_row` reads them.
pub(crate) const COLUMNS: &str = "seq, event_id, claim_id, claim_version, aggregate_id, aggregate_version, shard_slot, \
    topic, msg_key, event_type, headers, payload, payload_bytes, attempts, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at)";

/// `COLUMNS` qualified with `o.`, in the same order.
pub(crate) const COLUMNS_O: &str =
    "o.seq, o.event_id, o.claim_id, o.claim_version, o.aggregate_id, o.aggregate_version, \
    o.shard_slot, o.topic, o.msg_key, o.event_type, o.headers, o.payload, o.payload_bytes, o.attempts, \
    TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', o.created_at)";

/// Binds `items` as a comma-separated list.
pub(crate) fn push_list<'a, T>(qb: &mut QueryBuilder<'a, MySql>, items: impl IntoIterator<Item = T>)
where
    T: 'a + sqlx::Encode<'a, MySql> + sqlx::Type<MySql> + Send,
{
    let mut sep = qb.separated(", ");
    for i in items {
        sep.push_bind(i);
    }
}

/// A row (of the outbox or the exception table; columns prefixed with `a`) that is due:
/// PENDING and available, or CLAIMED with its lease expired.
pub(crate) fn due(a: &str) -> String {
    format!(
        "(({a}state = 'PENDING' AND {a}available_at <= UTC_TIMESTAMP(6)) \
         OR ({a}state = 'CLAIMED' AND {a}lease_until <= UTC_TIMESTAMP(6)))"
    )
}
