//! The consumer-side Inbox of ferry: a downstream business effect is committed **exactly once**
//! per consumer, however many times the relay delivers the event (the relay delivers at least
//! once: docs/architecture.md, "The four crash windows" and "Consumers: the Inbox").
//!
//! # Contract
//!
//! * [`postgres::record`], [`mysql::record`] and [`sqlite::record`] run **inside the consumer's
//!   own sqlx transaction** (`&mut *tx`), before the effect. They insert `(consumer, event_id)`
//!   into `ferry_inbox`, whose primary key is the dedupe, and return a [`Verdict`]:
//!   [`Verdict::New`] (apply the effect in the same transaction and commit) or
//!   [`Verdict::Duplicate`] (skip the effect). Because the record and the effect share one
//!   local transaction, either both commit or neither does: a rolled-back consumer transaction
//!   leaves no inbox row, and the redelivery is `New` again. Tests (`tests/inbox_conformance.rs`,
//!   every backend): `duplicate_applies_effect_once`, `rollback_leaves_no_record`,
//!   `consumers_are_independent`.
//! * Two transactions delivering the same event at once never both get `New`: the second one
//!   waits on the first's uncommitted key (or, with gap detection on, on the aggregate's row
//!   lock) and then gets `Duplicate` when the first commits, `New` when it rolled back, or — at
//!   `REPEATABLE READ`/`SERIALIZABLE` on PostgreSQL, or on a deadlock — a retryable error
//!   ([`InboxError::is_transient`]). After **any** error, roll the transaction back. Tests:
//!   `concurrent_delivery_waits_for_the_first`, `racing_deliveries_apply_once`,
//!   `concurrent_versions_of_one_aggregate`.
//! * With gap detection on ([`GapPolicy::Report`] or [`GapPolicy::HoldBack`]), each delivery
//!   also locks `ferry_inbox_aggregate (consumer, aggregate_id)`, which stores the highest
//!   version applied contiguously (`applied_upto`). v(n+1) arriving before v(n) is
//!   [`Verdict::Gap`] (recorded, apply it if your projection tolerates it) under `Report`, and
//!   [`Verdict::Early`] (nothing recorded, do not apply, have it redelivered) under `HoldBack`.
//!   [`gaps`](Inbox::gaps) lists aggregates with an open gap; [`accept_gap`](Inbox::accept_gap)
//!   is the operator's repair when a missing version will never come. The decision is written
//!   once for every backend (`engine.rs`, `record` over each backend's statements). Tests:
//!   `gap_is_reported_and_closes`, `gap_is_held_back_until_the_predecessor`,
//!   `accept_gap_repairs_a_lost_version`, `first_seen_baseline_starts_mid_stream`.
//! * Invalid input ([`Delivery::validate`]: empty or over-long ids, a version below 1 when gaps
//!   are tracked) is refused before any statement runs. Test: `bad_input_writes_nothing`.
//! * [`Inbox::apply_once`] is the whole pattern in one call on a pool: begin, record, run the
//!   effect closure only when the verdict says so, commit.
//! * [`runner::ConsumerRunner`] (feature `kafka`, on by default) is the consumer loop around it:
//!   it reads a ferry topic, applies each message with `apply_once` on tasks keyed by the
//!   aggregate (so one aggregate is applied in order), retries transient errors, counts the
//!   verdicts and says when it has caught up with the topic. Test: `tests/consumer_runner.rs`.
//! * [`Inbox::prune`] deletes only rows older than its window **and** covered by their
//!   aggregate's contiguous mark, which never decreases: a pruned event delivered again is
//!   `Stale`, never `New`. Test: `prune_deletes_only_what_the_mark_covers`.
//!
//! ## What the caller does with each verdict
//!
//! | verdict | inbox row written | effect | then |
//! | --- | --- | --- | --- |
//! | `New` | yes | apply | commit, then acknowledge the message |
//! | `Gap` | yes | apply (or not, the record stays) | commit, acknowledge; alert on [`Inbox::gaps`] |
//! | `Duplicate` | no | skip | commit or roll back (nothing to keep), acknowledge |
//! | `Stale` | no | skip | commit or roll back, acknowledge; the version is covered already |
//! | `Early` | no | skip | **do not acknowledge**: commit (keeps the gap visible to `gaps`) or roll back, then make the transport redeliver it later |
//!
//! "Redeliver later" depends on the transport: a nack/requeue with delay or a visibility
//! timeout for queues; for a Kafka partition, the consumer must not block the partition on an
//! early message (v(n) may sit behind it in the same partition): park it in a retry topic or
//! table and commit the offset, or use `Report`. ferry's relay already delivers each aggregate
//! in version order (shard workers + predecessor rule), so a gap downstream means a repair or a
//! foreign producer skipped a version — it is an alert, not routine.
//!
//! # Schema
//!
//! Tables `ferry_inbox` and `ferry_inbox_aggregate`, created by this crate's own embedded
//! migrations in `crates/ferry-inbox/migrations/<backend>/NNNN_name.sql` and tracked in their
//! own table `ferry_inbox_migrations` (independent of the outbox's `ferry_schema_migrations`,
//! so a consumer database needs no outbox). Migrations apply under the same kind of lock as
//! the store's: a transaction-scoped advisory lock keyed by schema on PostgreSQL, `GET_LOCK`
//! keyed by database on MariaDB/MySQL, `BEGIN IMMEDIATE` on SQLite (tests
//! `concurrent_migrations_apply_once`, `fresh_concurrent_migrations`). Table names are fixed;
//! every value is a bind parameter.
//!
//! # Backend notes
//!
//! * SQLite: begin the consumer transaction with `BEGIN IMMEDIATE` (as `apply_once` does);
//!   a deferred transaction that read first may fail with `SQLITE_BUSY` on its first write
//!   (classified retryable).
//! * MariaDB/MySQL: correct at `READ COMMITTED` and at the default `REPEATABLE READ` (the
//!   inbox reads its own rows only with locking reads, which see the latest committed data).
#![deny(missing_docs)]
#![warn(unreachable_pub)]

mod config;
mod delivery;
mod engine;
mod error;
mod gap;
mod inbox;
mod migrate;
pub mod mysql;
mod pool;
pub mod postgres;
#[cfg(feature = "kafka")]
pub mod runner;
pub mod sqlite;
mod verdict;

pub use config::{Baseline, GapPolicy, InboxConfig};
pub use delivery::{
    Delivery, HEADER_AGGREGATE_ID, HEADER_AGGREGATE_VERSION, HEADER_EVENT_ID, HEADER_REPLAY,
    MAX_IDENT_LEN,
};
pub use error::{BoxError, InboxError};
pub use ferry_store::Backend;
pub use gap::GapInfo;
pub use inbox::{Inbox, PRUNE_BATCH};
pub use migrate::{MIGRATIONS_MYSQL, MIGRATIONS_POSTGRES, MIGRATIONS_SQLITE};
pub use pool::{Conn, InboxPool, PoolOptions};
#[cfg(feature = "kafka")]
pub use runner::{Accept, ConsumerRunner, Effect, RunnerConfig, RunnerStats};
pub use sqlx::sqlite::SqliteSynchronous;
pub use verdict::Verdict;
