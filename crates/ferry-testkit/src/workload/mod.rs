//! A simulated business whose producers contend for aggregates the way applications do: what
//! loadgen runs and the relay's tests can meet.
//!
//! Every producer may pick any aggregate of the run, so producers contend for aggregates as an
//! application's request handlers do. An aggregate's version is never chosen in-process: the
//! producer's transaction takes it from the aggregate's business row (`loadgen_aggregates`,
//! `ver = ver + 1`, see [`tx`]), whose row lock it then holds until COMMIT; a rolled-back
//! transaction's versions roll back with it, so every aggregate's committed versions are exactly
//! `1..=n`. Event ids are `lg-<run>-p<producer>-<n>`: deterministic (a retried transaction
//! reuses the very same event ids, with the versions its new attempt got) and contiguous per
//! producer, so "what was committed" is one counter per producer rather than millions of stored
//! ids.
//!
//! * [`tx`]: the business tables and the business transaction (the aggregates' rows, each
//!   order's version taken from its row, the orders and their outbox intents committed
//!   together), on every backend.
//! * [`producer`]: producer tasks that commit those transactions (paced or flat out), retry
//!   what contention rolled back and resolve a lost COMMIT outcome.
//! * [`check`]: what the business rows say about the committed versions afterwards (each
//!   aggregate's `1..=n`, handoffs between producers, PostgreSQL's transaction-id inversions).
//! * `shape`, re-exported here: the shape of the load ([`Workload`], [`Preload`]), aggregate
//!   popularity ([`KeyPicker`]), identities ([`Ids`]) and payloads.
pub mod check;
pub mod producer;
mod shape;
pub mod tx;

pub use check::{fold_orders, prepare_fold, version_check, VersionCheck};
/// The pool the business transactions run on (every backend's).
pub use ferry_inbox::InboxPool;
pub use producer::{
    CommitObserver, Counters, KeySource, ProducerError, ProducerPlan, ProducerResult,
};
pub use shape::{event, payload, Ids, KeyPicker, Order, Preload, Skew, Workload, EVENT_TYPE};
pub use tx::{create_tables, dialect, order_exists, Rollback, TxError};
