//! The ferry relay runtime.
//!
//! A [`Relay`] runs W shard workers over the logical slots its process owns (leases in the
//! database, fenced by owner). Each worker claims batches of predecessor-free events, sends them
//! through a [`Sink`] that reports one [`ferry_core::Outcome`] per item, and applies those
//! outcomes with the store's compare-and-set. A successor is never claimed — let alone sent —
//! before its predecessor is SENT, so pipelining and per-item retries cannot reorder an
//! aggregate.
#![warn(missing_docs, unreachable_pub)]

mod cursor;
pub mod metrics;
pub mod ownership;
mod relay;
pub mod route;
pub mod sink;

pub use metrics::Metrics;
pub use relay::{
    default_owner, preferred_dispatch, ConfigError, Relay, RelayConfig, WorkerDefaults,
};
pub use sink::kafka::{KafkaConfig, KafkaSink};
pub use sink::{NullSink, Sink, StdoutSink};
