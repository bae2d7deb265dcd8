//! The cursor-dispatch conformance suite: every case runs on each SQL store with cursor
//! dispatch (SQLite, PostgreSQL and MariaDB); see [`CASES`].
//!
//! The cases by concern: `advance` (read and advance, fencing), `exceptions`, `retention`,
//! `horizon` (open producer transactions), `mode` (switching dispatch modes), `positions`
//! (per-slot read positions), `restore`, bulk quarantine actions (`super::bulk`, shared with the
//! store suite); `relay` holds what they share.
use super::case::suite;
use crate::db::TestDb;

pub use super::bulk::cursor::{
    bulk_requeue_moves_exactly_the_matching_events, bulk_skip_releases_successors_in_order,
};

mod advance;
mod exceptions;
mod horizon;
mod mode;
mod positions;
pub(super) mod relay;
mod restore;
mod retention;

pub use advance::{
    keys_are_read_back_whether_stored_or_implied, lookup_advance_finds_a_committed_advance,
    read_advance_derives_sent, reads_are_cut_at_the_limit_and_resume,
    stale_owner_advance_is_fenced,
};
pub use exceptions::exceptions_hold_successors_in_order;
pub use horizon::{
    a_running_statement_of_a_long_transaction_is_waited_for,
    open_transactions_delay_only_their_own_rows,
};
pub use mode::mode_switch_converts_state;
pub use positions::{
    a_lagging_slot_holds_the_others_back_no_longer, a_reader_behind_many_ticks_misses_nothing,
    slot_subset_readers_get_exactly_their_slots,
};
pub use restore::restored_elsewhere_rebases_cursors;
pub use retention::{purge_by_age_stops_at_young_rows, reconcile_and_purge_use_derived_states};

suite! {
    /// Every case, in order.
    cases: TestDb;
    /// Instantiates every cursor conformance case as a test per SQL backend (modules `sqlite`,
    /// `postgres`, `mysql`). Needs `tokio` (with `macros`) as a dev-dependency.
    macro: cursor_conformance, module: cursor, check: every_cursor_case_is_instantiated;
    everywhere: [],
    sql_only: [
        read_advance_derives_sent,
        keys_are_read_back_whether_stored_or_implied,
        reads_are_cut_at_the_limit_and_resume,
        stale_owner_advance_is_fenced,
        lookup_advance_finds_a_committed_advance,
        exceptions_hold_successors_in_order,
        reconcile_and_purge_use_derived_states,
        purge_by_age_stops_at_young_rows,
        open_transactions_delay_only_their_own_rows,
        a_running_statement_of_a_long_transaction_is_waited_for,
        mode_switch_converts_state,
        slot_subset_readers_get_exactly_their_slots,
        a_lagging_slot_holds_the_others_back_no_longer,
        a_reader_behind_many_ticks_misses_nothing,
        restored_elsewhere_rebases_cursors,
        bulk_requeue_moves_exactly_the_matching_events,
        bulk_skip_releases_successors_in_order,
    ],
}
