//! The context both dispatch modes share: the store, the sink, the settings, the metrics, the
//! wake-up of idle workers, and the claim tokens of row-dispatch batches in flight (released
//! by [`crate::relay::Relay::run`] after the shutdown deadline).
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use ferry_core::{ClaimToken, OutboxStore};
use tokio::sync::Notify;

use crate::config::RelayConfig;
use crate::metrics::Metrics;
use crate::route::RoutePolicy;
use crate::sink::Sink;

/// What every shard worker of one relay shares.
pub(crate) struct Ctx {
    pub(crate) store: Arc<dyn OutboxStore>,
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) config: RelayConfig,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) wake: Arc<Notify>,
    /// Commit notifications received so far (see `listen_commits`).
    pub(crate) commits: Arc<AtomicU64>,
    /// Tokens of batches in flight, by batch id (released on a shutdown timeout).
    pub(crate) in_flight: Mutex<HashMap<u64, Vec<ClaimToken>>>,
    pub(crate) next_batch: AtomicU64,
}

impl Ctx {
    pub(crate) fn policy(&self, hold_successors: bool) -> RoutePolicy {
        RoutePolicy {
            max_attempts: self.config.max_attempts,
            backoff: self.config.backoff,
            hold_successors,
        }
    }
}
