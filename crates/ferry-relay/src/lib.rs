//! The ferry relay runtime: moves committed publish intents from an outbox store to a sink.
//!
//! A [`Relay`] ([`RelayConfig`], `run(self, cancel)`) runs W shard workers over the logical
//! slots its process owns ([`ownership`]: leases in the database, rendezvous-hashed over the
//! live relays). Each worker takes batches of committed intents — per-row claims in row
//! dispatch, reads past a per-slot cursor in cursor dispatch ([`preferred_dispatch`]) — sends
//! them through a [`Sink`] that reports one [`ferry_core::Outcome`] per item, and applies those
//! outcomes with the store's compare-and-set. [`route`] is the one pure function that maps
//! outcomes to acks, retries, quarantines and releases in both modes. The two modes live side
//! by side in `src/dispatch/row/` and `src/dispatch/cursor/`, one file per step of the worker's
//! loop (`dispatch/mod.rs` maps one onto the other); what they share is `context.rs`. The data
//! flow, the ordering arguments and the timing defaults are in docs/architecture.md.
//!
//! # Invariants
//!
//! * **Nothing is acknowledged before the sink reported it.** An item's state moves only after
//!   the sink's per-item outcome; a sink reply with fewer outcomes than items makes the missing
//!   ones `Unknown` (resent, never counted as success). Tests (`route.rs`):
//!   `each_outcome_maps_to_its_decision`,
//!   `missing_outcomes_become_unknown_and_extra_ones_are_ignored`.
//! * **An aggregate is never reordered.** Row dispatch: a successor is not claimable before its
//!   predecessor is SENT (the store's claim), so pipelining and per-item retries cannot
//!   overtake. Cursor dispatch: an aggregate is busy from the read that takes it until its items
//!   are acked or its exception rows are committed, a read is cut before a busy aggregate
//!   (`release_acked` in `dispatch/cursor/state.rs`, `cut_at_busy_aggregates` in
//!   `dispatch/cursor/read.rs`), and the hold rule makes every item after an aggregate's first
//!   non-acked one `Held`. Tests:
//!   `the_hold_rule_stops_an_aggregate_at_its_first_failure` (`route.rs`),
//!   `failed_aggregate_stays_busy_until_its_advance` (`tests/cursor_release.rs`),
//!   `hot_aggregate_drains_in_order` and `mid_batch_faults_keep_first_delivery_order`
//!   (`tests/relay_kafka.rs`, both modes, every backend).
//! * **A reordering that happens anyway is counted**: each worker checks what it hands to the
//!   sink, in send order, and counts every version handed after a later one of its aggregate
//!   (`ferry_order_regressions_total`, logged), never a legal resend (`order_watch.rs` states
//!   the rule). Tests: the `order_watch.rs` unit tests, `tests/order_regressions.rs` (both
//!   modes, every backend), and 0 asserted after resends in `tests/cursor_release.rs` and
//!   `mid_batch_faults_keep_first_delivery_order`.
//! * **A permanent error quarantines the item and holds its aggregate** until an operator
//!   requeues or skips it; a retry past `max_attempts` is quarantined too. Tests:
//!   `retries_past_max_attempts_are_quarantined`,
//!   `permanent_error_quarantines_and_blocks_until_requeue`.
//! * **A fenced write is counted, never an error**: a stale row token, cursor advance or slot
//!   renewal adds to `ferry_fenced_total` / `ferry_slot_fenced_total`; a fenced or failed
//!   cursor advance resets the worker to the durable cursors (resends, never a loss). Tests:
//!   `paused_owner_is_fenced`, `two_relays_split_slots_and_survive_sigkill`
//!   (`crates/ferry-cli/tests/relay_processes.rs`).
//! * **Every slot has exactly one desired owner** among the live members
//!   ([`ownership::desired_slots`]). Test: `rendezvous_partitions_every_slot_once`.
//! * **One process at a time holds an owner id**: its membership row names the holding
//!   instance and is taken only when absent, the caller's or expired; a start finding it live
//!   is refused, a relay finding it taken stops without touching the other's slots. Tests:
//!   conformance `one_instance_holds_an_owner_id`, `tests/owner_id.rs`.
//! * **A send outstanding keeps its claim**: row-dispatch leases are renewed every lease/3
//!   while a batch is in flight, and the CLI refuses `sink.message_timeout` ≥
//!   `relay.claim_lease`.
//! * **Shutdown loses nothing in flight**: on cancel a worker stops taking batches and waits up
//!   to `shutdown_timeout` for outcomes; row dispatch then releases the items still claimed
//!   (a fenced CAS), cursor dispatch advances what finished and leaves the rest behind the
//!   cursor for the next owner; the process gives up its slot leases. Test:
//!   `graceful_shutdown_releases_everything` (relay processes: nothing left claimed, no slot
//!   lease left).
//! * **Each crash window recovers**: `crates/ferry-cli/tests/crash_windows.rs` SIGKILLs a relay
//!   at each [`ferry_core::failpoint`] in both modes and checks the one-effect outcome.
#![deny(missing_docs)]
#![warn(unreachable_pub)]

mod config;
mod context;
mod dispatch;
mod episode;
pub mod metrics;
mod order_watch;
pub mod ownership;
mod relay;
pub mod replay;
mod retention;
pub mod route;
pub mod sink;

pub use config::{default_owner, ConfigError, RelayConfig, WorkerDefaults};
pub use episode::{is_transient, Episode};
pub use metrics::Metrics;
pub use relay::{preferred_dispatch, Relay};
pub use retention::RetentionConfig;
pub use sink::kafka::{KafkaConfig, KafkaSink, MAX_KAFKA_LINGER};
pub use sink::{NullSink, Sink, StdoutSink};
