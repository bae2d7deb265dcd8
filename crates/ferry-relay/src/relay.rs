//! The relay: W shard workers over the slots this process owns.
//!
//! [`Relay::run`] resolves the dispatch mode (converting the outbox if it is stored in the
//! other one), takes its owner id and runs slot ownership ([`crate::ownership`]), listens for
//! commit notifications, starts the sink's health watch and the status poller, and runs one
//! worker per shard in that mode ([`crate::dispatch`]). On cancel it waits for the workers to
//! drain, releases what row dispatch still holds claimed, and gives up its slot leases and its
//! membership.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_core::{ClaimToken, DispatchMode, OutboxStore, SlotId, StoreError};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, RelayConfig};
use crate::context::Ctx;
use crate::episode::{is_transient, Episode};
use crate::metrics::Metrics;
use crate::ownership::{self, OwnershipConfig};
use crate::retention::RetentionConfig;
use crate::sink::health::WatchedSink;
use crate::sink::Sink;

/// The relay engine: a validated [`RelayConfig`] over one store and one sink. [`Relay::run`]
/// owns slots, runs the shard workers in the configured (or the store's preferred) dispatch
/// mode and drains on cancel.
pub struct Relay {
    store: Arc<dyn OutboxStore>,
    sink: Arc<dyn Sink>,
    config: RelayConfig,
    metrics: Arc<Metrics>,
    wake: Arc<Notify>,
    retention: Option<RetentionConfig>,
}

impl Relay {
    /// A relay over `store` and `sink`; refuses a configuration [`RelayConfig::validate`]
    /// rejects.
    pub fn new(
        store: Arc<dyn OutboxStore>,
        sink: Arc<dyn Sink>,
        config: RelayConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let metrics = Arc::new(Metrics::default());
        // not known until the relay has read the stored mode: /metrics leaves the gauge out
        // until then rather than report row dispatch (0)
        metrics.dispatch_cursor.store(-1, Ordering::Relaxed);
        Ok(Self {
            store,
            sink,
            config,
            metrics,
            wake: Arc::new(Notify::new()),
            retention: None,
        })
    }

    /// Runs `retention` beside the dispatch ([`crate::retention`]); refuses one
    /// [`RetentionConfig::validate`] rejects.
    pub fn with_retention(mut self, retention: RetentionConfig) -> Result<Self, ConfigError> {
        retention.validate()?;
        self.retention = Some(retention);
        Ok(self)
    }

    /// Shares an existing metrics registry.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The registry this relay counts into (shared with the metrics endpoint).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// A handle that wakes idle workers (e.g. from a commit notification).
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Runs until `cancel`, then drains: stops claiming, waits for in-flight outcomes up to
    /// `shutdown_timeout`, releases what is left with the fenced CAS, gives up its slots.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), StoreError> {
        let Relay {
            store,
            sink,
            config,
            metrics,
            wake,
            retention,
        } = self;
        metrics.horizon_blocker_age_us.store(-1, Ordering::Relaxed);
        metrics.horizon_blocker_pid.store(-1, Ordering::Relaxed);
        metrics.horizon_held_slots.store(-1, Ordering::Relaxed);
        metrics
            .started_us
            .store(ferry_core::now_micros(), Ordering::Relaxed);
        let sink: Arc<dyn Sink> = Arc::new(WatchedSink::new(sink, metrics.clone()));
        let mode = {
            let mut episode = Episode::new("resolving the dispatch mode at start");
            loop {
                match resolve_dispatch(&*store, &config).await {
                    Ok(m) => {
                        episode.ended();
                        break m;
                    }
                    Err(e) if is_transient(&e) => {
                        let wait = episode.failed(&e);
                        tokio::select! {
                            _ = cancel.cancelled() => return Ok(()),
                            _ = tokio::time::sleep(wait) => {}
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        metrics
            .dispatch_cursor
            .store(i64::from(mode == DispatchMode::Cursor), Ordering::Relaxed);
        tracing::info!(dispatch = %mode, backend = store.backend(), "dispatch mode");
        // resolving it read the database
        metrics
            .db_ok_us
            .store(ferry_core::now_micros(), Ordering::Relaxed);
        let (slots_tx, slots_rx) = watch::channel::<Vec<SlotId>>(Vec::new());
        let stop_aux = CancellationToken::new();
        let mut aux = Vec::new();
        // the workers stop on `cancel`, or when another process takes this owner id
        let stop = cancel.child_token();
        let ownership = config.ownership || mode == DispatchMode::Cursor;
        let mut owner_task = None;
        if ownership {
            let owning = OwnershipConfig {
                owner: config.owner.clone(),
                instance: uuid::Uuid::new_v4().simple().to_string(),
                ttl: config.slot_ttl,
                heartbeat: config.heartbeat,
            };
            if !ownership::claim_owner(&*store, &owning, &cancel).await? {
                return Ok(());
            }
            owner_task = Some(tokio::spawn(ownership::run(
                store.clone(),
                owning,
                metrics.clone(),
                slots_tx,
                stop_aux.clone(),
                stop.clone(),
            )));
        } else {
            let _ = slots_tx.send((0..ferry_core::SLOT_COUNT).collect());
            metrics
                .slots_owned
                .store(ferry_core::SLOT_COUNT as i64, Ordering::Relaxed);
            std::mem::forget(slots_tx); // keep the channel open for the workers
        }
        // Counts commit notifications: a worker that was busy when one arrived (notify_waiters
        // wakes only tasks already waiting) sees the count moved and reads again instead of
        // sleeping.
        let commits = Arc::new(AtomicU64::new(0));
        {
            let (wake, commits) = (wake.clone(), commits.clone());
            match store
                .listen_commits(Arc::new(move || {
                    commits.fetch_add(1, Ordering::Release);
                    wake.notify_waiters()
                }))
                .await
            {
                Ok(true) => tracing::info!("commit notifications enabled (LISTEN/NOTIFY)"),
                Ok(false) => tracing::debug!(
                    backend = store.backend(),
                    "no commit notifications; polling adaptively"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "commit notifications unavailable; polling adaptively")
                }
            }
        }
        aux.push(tokio::spawn(crate::sink::health::watch(
            sink.clone(),
            metrics.clone(),
            stop_aux.clone(),
        )));
        aux.push(tokio::spawn(status_poller(
            store.clone(),
            metrics.clone(),
            config.status_interval,
            stop_aux.clone(),
        )));
        if let Some(retention) = retention {
            // the owner of slot 0 purges; without slot ownership, this relay
            let owned = ownership.then(|| slots_rx.clone());
            aux.push(tokio::spawn(crate::retention::run(
                store.clone(),
                retention,
                metrics.clone(),
                owned,
                stop.clone(),
                config.shutdown_timeout,
            )));
        }
        let ctx = Arc::new(Ctx {
            store: store.clone(),
            sink,
            config: config.clone(),
            metrics,
            wake,
            commits,
            in_flight: Mutex::new(HashMap::new()),
            next_batch: AtomicU64::new(0),
        });
        ctx.metrics.dispatch_resolved.store(1, Ordering::Relaxed);
        let workers: Vec<_> = (0..config.workers)
            .map(|w| match mode {
                DispatchMode::Row => tokio::spawn(crate::dispatch::row::worker(
                    ctx.clone(),
                    w,
                    slots_rx.clone(),
                    stop.clone(),
                )),
                DispatchMode::Cursor => tokio::spawn(crate::dispatch::cursor::worker(
                    ctx.clone(),
                    w,
                    slots_rx.clone(),
                    stop.clone(),
                )),
            })
            .collect();
        for w in workers {
            let _ = w.await;
        }
        // Whatever is still in flight after the deadline is released: resent later, same id.
        let leftovers: Vec<ClaimToken> = ctx
            .in_flight
            .lock()
            .expect("in-flight lock")
            .drain()
            .flat_map(|(_, t)| t)
            .collect();
        if !leftovers.is_empty() {
            match store.release(&leftovers).await {
                Ok(r) => {
                    ctx.metrics
                        .fenced
                        .fetch_add(r.fenced() as u64, Ordering::Relaxed);
                    tracing::info!(
                        released = r.applied(),
                        fenced = r.fenced(),
                        "released in-flight events at shutdown"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not release in-flight events; their lease will expire")
                }
            }
        }
        stop_aux.cancel();
        for a in aux {
            let _ = a.await;
        }
        let displaced = match owner_task {
            Some(t) => t.await.ok().flatten(),
            None => None,
        };
        if let Some(e) = displaced {
            // the slot leases and the membership under this owner id are the other process's
            return Err(e);
        }
        if ownership {
            let all: Vec<SlotId> = (0..ferry_core::SLOT_COUNT).collect();
            let _ = store
                .release_slots(&ferry_core::SlotRelease::new(&config.owner, &all))
                .await;
            let _ = store.leave_member(&config.owner).await;
        }
        Ok(())
    }
}

/// The mode a relay picks on `backend` when not told: cursor on every SQL backend (on
/// MySQL/MariaDB behind the commit gate).
pub fn preferred_dispatch(backend: &str) -> DispatchMode {
    match backend {
        "memory" => DispatchMode::Row,
        _ => DispatchMode::Cursor,
    }
}

/// The mode this relay runs in: the configured one, else the store's preferred one. Converts
/// the outbox when it is stored in the other mode.
async fn resolve_dispatch(
    store: &dyn OutboxStore,
    config: &RelayConfig,
) -> Result<DispatchMode, StoreError> {
    let cursor = store.cursor();
    let mode = match (config.dispatch, cursor.is_some()) {
        (Some(m), _) => m,
        (None, true) => preferred_dispatch(store.backend()),
        (None, false) => DispatchMode::Row,
    };
    match cursor {
        Some(cs) => {
            let before = cs.dispatch_mode().await?;
            // Undelivered intents the conversion hands over: none on a new database (which
            // starts in row dispatch), where the switch is routine and no warning.
            let undelivered = if before != mode {
                store
                    .status()
                    .await
                    .map(|s| s.pending + s.claimed + s.quarantined)
                    .ok()
            } else {
                None
            };
            // true without a change of mode: the store re-based the cursors (and said so)
            let changed = cs.set_dispatch_mode(mode, &config.owner).await?;
            if changed && before != mode {
                if undelivered == Some(0) {
                    tracing::info!(dispatch = %mode, "outbox set to {mode} dispatch (nothing undelivered to convert)");
                } else {
                    tracing::warn!(
                        dispatch = %mode,
                        undelivered = undelivered.map_or_else(|| "unknown".to_string(), |n| n.to_string()),
                        "converted the outbox from {before} to {mode} dispatch"
                    );
                }
            }
        }
        None if mode == DispatchMode::Cursor => {
            return Err(StoreError::new(
                ferry_core::StoreErrorKind::InvalidInput,
                format!(
                    "cursor dispatch is not available on {}; use --dispatch row",
                    store.backend()
                ),
            ))
        }
        None => {}
    }
    Ok(mode)
}

async fn status_poller(
    store: Arc<dyn OutboxStore>,
    metrics: Arc<Metrics>,
    every: Duration,
    cancel: CancellationToken,
) {
    loop {
        // shared between the relays of one database where the store can (one count per
        // interval, not one per relay)
        let started = tokio::time::Instant::now();
        match store.shared_status(every).await {
            Ok(s) => {
                metrics
                    .db_ok_us
                    .store(ferry_core::now_micros(), Ordering::Relaxed);
                metrics.pending.store(s.pending, Ordering::Relaxed);
                metrics.claimed.store(s.claimed, Ordering::Relaxed);
                metrics
                    .quarantined_rows
                    .store(s.quarantined, Ordering::Relaxed);
                metrics
                    .blocked_aggregates
                    .store(s.blocked_aggregates, Ordering::Relaxed);
                metrics
                    .oldest_unfinished_age_us
                    .store(s.oldest_unfinished_age_us.unwrap_or(-1), Ordering::Relaxed);
            }
            Err(e) => tracing::debug!(error = %e, "status refresh failed"),
        }
        if let Some(pc) = store.pause_control() {
            match pc.paused().await {
                Ok(p) => metrics
                    .paused_topics
                    .store(p.len() as i64, Ordering::Relaxed),
                Err(e) => tracing::debug!(error = %e, "reading the paused topics failed"),
            }
        }
        if metrics.dispatch_cursor.load(Ordering::Relaxed) == 1 {
            if let Some(cs) = store.cursor() {
                match cs.horizon().await {
                    Ok(h) => {
                        let age = h.oldest_xact_age_us.unwrap_or(-1);
                        metrics.horizon_blocker_age_us.store(age, Ordering::Relaxed);
                        metrics
                            .horizon_blocker_pid
                            .store(h.oldest_xact_pid.unwrap_or(-1), Ordering::Relaxed);
                        metrics
                            .horizon_held_slots
                            .store(h.held_slots.map_or(-1, i64::from), Ordering::Relaxed);
                        let warn = metrics
                            .alerts
                            .lock()
                            .map(|a| a.oldest_warning)
                            .unwrap_or_default();
                        if age >= 0 && Duration::from_micros(age as u64) >= warn {
                            match h.held_slots {
                                Some(n) => tracing::warn!(
                                    pid = h.oldest_xact_pid,
                                    age_s = age / 1_000_000,
                                    held_slots = n,
                                    "an open write transaction holds the cursor horizon back in the slots it wrote: their intents committed after it started are not dispatched until it ends"
                                ),
                                None => tracing::warn!(
                                    pid = h.oldest_xact_pid,
                                    age_s = age / 1_000_000,
                                    "an open write transaction holds the cursor horizon back: intents committed after it started are not dispatched until it ends"
                                ),
                            }
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "horizon refresh failed"),
                }
            }
        }
        // In cursor dispatch a count walks the backlog: with 100k+ intents behind it took
        // 1-3.5 s, every 5 s, on the cores the relay and the producers need. The poll waits at
        // least STATUS_COST_FACTOR times as long as the count took, so it stays under ~10 % of
        // one core whatever the backlog (the gauges then refresh less often).
        let wait = every.max(started.elapsed() * STATUS_COST_FACTOR);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep_until(started + wait) => {}
        }
    }
}

/// The status poll waits at least this many times as long as its count took (see
/// `status_poller`).
const STATUS_COST_FACTOR: u32 = 10;
