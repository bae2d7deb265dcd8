//! The store conformance suite (row dispatch): every case runs against SQLite, PostgreSQL and
//! MariaDB, and every case that needs no SQL also against the in-memory store. A case takes an
//! [`AnyDb`] (any store) or a [`TestDb`](crate::TestDb) (SQL only); see [`CASES`].
//!
//! The cases by concern: `enqueue` (in the caller's transaction, refusals, plain SQL
//! producers), `claim` (the predecessor rule, concurrent claimers, skipped locked rows),
//! `outcome` (fenced outcomes, leases, lost claims), `ownership` (slot leases, membership),
//! `migrate`, `retention` (purge, reconcile, status), bulk quarantine actions (`super::bulk`,
//! shared with the cursor suite); `relay` holds what they share.
use super::case::suite;
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
    heads_past_a_deep_backlog_are_claimed, predecessor_blocks_successors,
    predecessor_rule_past_the_window, predecessor_rule_under_concurrency,
};
pub use enqueue::{
    bad_inputs_are_refused_and_write_nothing, committed_intent_visible_after_reconnect,
    intent_columns_are_immutable, keys_are_claimed_whether_stored_or_implied,
    multi_row_enqueue_in_caller_transaction, plain_insert_fills_what_the_rust_api_fills,
    rollback_leaves_neither_order_nor_intent,
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
    outbox_size_grows_with_the_rows, purge_deletes_only_old_sent_rows,
    reconcile_classifies_every_intent_once, shared_status_is_counted_once_per_max_age,
};

suite! {
    /// Every case, in order: the [`AnyDb`] cases first (they run on the in-memory store too),
    /// then the SQL-only ones.
    cases: AnyDb;
    /// Instantiates every store conformance case as a test per backend: modules `sqlite`,
    /// `postgres`, `mysql` and, for the cases that need no SQL, `memory`. Needs `tokio` (with
    /// `macros`) as a dev-dependency.
    macro: store_conformance, module: store, check: every_store_case_is_instantiated;
    // Run on every store, the in-memory one included.
    everywhere: [
        stale_claim_is_fenced,
        batch_with_mixed_outcomes_confirms_only_acked,
        stale_and_live_token_of_one_row_in_one_batch,
        predecessor_blocks_successors,
        predecessor_rule_under_concurrency,
        heads_past_a_deep_backlog_are_claimed,
        predecessor_rule_past_the_window,
        concurrent_claimers_deliver_each_event_once,
        lease_expiry_and_takeover,
        lost_claim_commit_is_recovered_by_claim_id,
        bad_inputs_are_refused_and_write_nothing,
        slot_leases_fence_claims,
        one_instance_holds_an_owner_id,
        purge_deletes_only_old_sent_rows,
        shared_status_is_counted_once_per_max_age,
    ],
    // SQL backends only; the in-memory store skips these because
    // - rollback_leaves_neither_order_nor_intent, multi_row_enqueue_in_caller_transaction: they
    //   enqueue inside the caller's own SQL business transaction (`place_order`); the memory
    //   store has no business transaction to join;
    // - committed_intent_visible_after_reconnect: durability across a new connection pool; the
    //   memory store is not durable by design (a second store is empty);
    // - intent_columns_are_immutable: a SQL `UPDATE` against the immutability trigger; in
    //   memory no API can change an intent column at all;
    // - concurrent_migrations_apply_once, fresh_concurrent_migrations,
    //   a_newer_schema_is_refused: there is no schema;
    // - claims_count_rows_skipped_as_locked: it holds SQL row locks from a second transaction;
    // - reconcile_classifies_every_intent_once: it needs the Inbox and business tables (the
    //   memory store refuses a reconcile naming them and is unit-tested without them);
    // - outbox_size_grows_with_the_rows: the memory store has no size on disk to report;
    // - keys_are_claimed_whether_stored_or_implied: it reads the stored `msg_key` column.
    sql_only: [
        rollback_leaves_neither_order_nor_intent,
        committed_intent_visible_after_reconnect,
        intent_columns_are_immutable,
        concurrent_migrations_apply_once,
        fresh_concurrent_migrations,
        a_newer_schema_is_refused,
        multi_row_enqueue_in_caller_transaction,
        reconcile_classifies_every_intent_once,
        outbox_size_grows_with_the_rows,
        claims_count_rows_skipped_as_locked,
        plain_insert_fills_what_the_rust_api_fills,
        keys_are_claimed_whether_stored_or_implied,
        // binary payloads: a plain INSERT of bytes, and a migration set back by SQL
        binary_payloads_round_trip,
        binary_migration_keeps_text_rows,
        bulk_requeue_moves_exactly_the_matching_events,
        bulk_skip_releases_successors_in_order,
        replay_reads_exactly_the_sent_events_of_a_range,
        purge_raises_the_retention_watermark,
    ],
}
