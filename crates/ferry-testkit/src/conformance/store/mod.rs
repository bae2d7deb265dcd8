//! The store conformance suite (row dispatch): every case runs against SQLite, PostgreSQL and
//! MariaDB, and every case that needs no SQL also against the in-memory store. A case takes an
//! [`AnyDb`] (any store) or a [`TestDb`](crate::TestDb) (SQL only); see [`CASES`].
//!
//! The cases by concern: `enqueue` (in the caller's transaction, refusals, plain SQL
//! producers), `claim` (the predecessor rule, concurrent claimers, skipped locked rows),
//! `outcome` (fenced outcomes, leases, lost claims), `ownership` (slot leases, membership),
//! `migrate`, `retention` (purge, reconcile, status), bulk quarantine actions (`super::bulk`,
//! shared with the cursor suite); `relay` holds what they share.
use std::future::Future;

use super::case::{case_list, exercise_each, Case};
use crate::db::AnyDb;

mod binary;
pub use super::bulk::row::{
    bulk_requeue_moves_exactly_the_matching_events, bulk_skip_releases_successors_in_order,
};

mod claim;
mod enqueue;
mod migrate;
mod outcome;
mod ownership;
mod relay;
mod replay;
mod retention;

pub use binary::{binary_migration_keeps_text_rows, binary_payloads_round_trip};
pub use claim::{
    claims_count_rows_skipped_as_locked, concurrent_claimers_deliver_each_event_once,
    predecessor_blocks_successors, predecessor_rule_under_concurrency,
};
pub use enqueue::{
    bad_inputs_are_refused_and_write_nothing, committed_intent_visible_after_reconnect,
    intent_columns_are_immutable, multi_row_enqueue_in_caller_transaction,
    plain_insert_fills_what_the_rust_api_fills, rollback_leaves_neither_order_nor_intent,
};
pub use migrate::{
    a_newer_schema_is_refused, concurrent_migrations_apply_once, fresh_concurrent_migrations,
};
pub use outcome::{
    batch_with_mixed_outcomes_confirms_only_acked, lease_expiry_and_takeover,
    lost_claim_commit_is_recovered_by_claim_id, stale_and_live_token_of_one_row_in_one_batch,
    stale_claim_is_fenced,
};
pub use ownership::{one_instance_holds_an_owner_id, slot_leases_fence_claims};
pub use replay::{
    purge_raises_the_retention_watermark, replay_reads_exactly_the_sent_events_of_a_range,
};
pub use retention::{
    purge_deletes_only_old_sent_rows, reconcile_classifies_every_intent_once,
    shared_status_is_counted_once_per_max_age,
};

/// Every case, in order: the [`AnyDb`] cases first (they run on the in-memory store too), then
/// the SQL-only ones.
pub const CASES: &[Case<AnyDb>] = case_list!(
    everywhere: [
        stale_claim_is_fenced,
        batch_with_mixed_outcomes_confirms_only_acked,
        stale_and_live_token_of_one_row_in_one_batch,
        predecessor_blocks_successors,
        predecessor_rule_under_concurrency,
        concurrent_claimers_deliver_each_event_once,
        lease_expiry_and_takeover,
        lost_claim_commit_is_recovered_by_claim_id,
        bad_inputs_are_refused_and_write_nothing,
        slot_leases_fence_claims,
        one_instance_holds_an_owner_id,
        purge_deletes_only_old_sent_rows,
        shared_status_is_counted_once_per_max_age,
    ],
    sql_only: [
        rollback_leaves_neither_order_nor_intent,
        committed_intent_visible_after_reconnect,
        intent_columns_are_immutable,
        concurrent_migrations_apply_once,
        fresh_concurrent_migrations,
        a_newer_schema_is_refused,
        multi_row_enqueue_in_caller_transaction,
        reconcile_classifies_every_intent_once,
        claims_count_rows_skipped_as_locked,
        plain_insert_fills_what_the_rust_api_fills,
        binary_payloads_round_trip,
        binary_migration_keeps_text_rows,
        bulk_requeue_moves_exactly_the_matching_events,
        bulk_skip_releases_successors_in_order,
        replay_reads_exactly_the_sent_events_of_a_range,
        purge_raises_the_retention_watermark,
    ],
);

/// Runs every case, in order, each on a fresh database from `factory`; the SQL-only cases only
/// when the factory's databases are SQL ([`AnyDb::sql`]). Panics at the first failing case.
pub async fn exercise<F, Fut>(factory: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = AnyDb>,
{
    exercise_each(CASES, factory).await
}
