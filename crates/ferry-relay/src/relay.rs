//! The relay: W shard workers over the slots this process owns.
//!
//! Per worker: claim a batch (≤ B items, fenced by slot ownership) → send it to the sink →
//! collect each item's outcome → apply the outcomes with the store's batched compare-and-set.
//! Up to `max_in_flight` batches per worker are in flight at once (the next claim runs while a
//! send is outstanding). This never reorders an aggregate: the claim only returns events whose
//! aggregate has no unfinished predecessor, so a successor cannot even be claimed before its
//! predecessor is SENT — whatever happens to the predecessor's batch.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_core::{
    now_micros, slots_for_worker, CasReport, ClaimRequest, ClaimToken, ClaimedEvent, DispatchMode,
    OutboxStore, RetryItem, SlotFence, SlotId, StoreError,
};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, RelayConfig};
use crate::context::Ctx;
use crate::episode::{is_transient, Episode};
use crate::metrics::Metrics;
use crate::order_watch::{self, OrderWatch};
use crate::ownership::{self, OwnershipConfig};
use crate::route::{route, Decision, RouteItem};
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
        Ok(Self {
            store,
            sink,
            config,
            metrics,
            wake: Arc::new(Notify::new()),
        })
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
                DispatchMode::Row => {
                    tokio::spawn(worker(ctx.clone(), w, slots_rx.clone(), stop.clone()))
                }
                DispatchMode::Cursor => tokio::spawn(crate::cursor::worker(
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
/// MySQL/MariaDB behind the commit gate; measured against row dispatch in docs/notes/2026-12-02-performance-log.md).
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

async fn worker(
    ctx: Arc<Ctx>,
    w: usize,
    mut slots_rx: watch::Receiver<Vec<SlotId>>,
    cancel: CancellationToken,
) {
    let cfg = &ctx.config;
    let abandon = CancellationToken::new();
    // What this worker handed to the sink, per aggregate (the order net). Row dispatch never
    // rewinds it: a claim returns a version only once every lower one is finished, and a resend
    // is the same version again (order_watch.rs).
    let watch = Arc::new(Mutex::new(OrderWatch::default()));
    // Each batch runs as its own task: it must make progress (e.g. finish an outcome
    // transaction that holds SQLite's write lock) while this loop waits on the next claim.
    let mut inflight: tokio::task::JoinSet<()> = tokio::task::JoinSet::new();
    let mut delay = cfg.poll_min;
    let mut store_backoff = Duration::from_millis(50);
    loop {
        // reap finished batches without blocking
        while inflight.try_join_next().is_some() {}
        if cancel.is_cancelled() {
            break;
        }
        if inflight.len() >= cfg.max_in_flight {
            tokio::select! {
                _ = inflight.join_next() => {}
                _ = cancel.cancelled() => {}
            }
            continue;
        }
        let slots = slots_for_worker(&slots_rx.borrow_and_update(), w, cfg.workers);
        if slots.is_empty() {
            tokio::select! {
                _ = slots_rx.changed() => {}
                Some(_) = inflight.join_next(), if !inflight.is_empty() => {}
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(cfg.poll_idle) => {}
            }
            continue;
        }
        let mut req = ClaimRequest::new(slots, cfg.batch_size, cfg.claim_lease);
        if cfg.ownership {
            req.fence = Some(SlotFence {
                owner: cfg.owner.clone(),
            });
        }
        let commits_seen = ctx.commits.load(Ordering::Acquire);
        let t0 = Instant::now();
        let claimed = match claim_or_recover(&*ctx.store, &req).await {
            Ok(c) => {
                store_backoff = Duration::from_millis(50);
                c
            }
            Err(e) => {
                ctx.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(worker = w, error = %e, "claim failed");
                tokio::select! {
                    _ = tokio::time::sleep(store_backoff) => {}
                    _ = cancel.cancelled() => {}
                }
                store_backoff = (store_backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        ctx.metrics.claim_latency.record(t0.elapsed());
        ctx.metrics.claims.fetch_add(1, Ordering::Relaxed);
        if let Some(n) = ctx.store.rows_skipped_locked() {
            ctx.metrics.skipped_locked.store(n, Ordering::Relaxed);
            ctx.metrics
                .skipped_locked_known
                .store(true, Ordering::Relaxed);
        }
        if claimed.is_empty() {
            ctx.metrics.empty_claims.fetch_add(1, Ordering::Relaxed);
            if ctx.commits.load(Ordering::Acquire) != commits_seen {
                // a commit was notified while this claim ran: claim again at once
                delay = cfg.poll_min;
                continue;
            }
            tokio::select! {
                _ = ctx.wake.notified() => {}
                Some(_) = inflight.join_next(), if !inflight.is_empty() => {}
                _ = cancel.cancelled() => {}
                _ = slots_rx.changed() => {}
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(cfg.poll_idle);
            continue;
        }
        let full = claimed.len() == cfg.batch_size;
        ctx.metrics
            .claimed_items
            .fetch_add(claimed.len() as u64, Ordering::Relaxed);
        ctx.metrics.batch_size.record_us(claimed.len() as u64);
        let id = ctx.next_batch.fetch_add(1, Ordering::Relaxed);
        ctx.in_flight
            .lock()
            .expect("in-flight lock")
            .insert(id, claimed.iter().map(|e| e.token.clone()).collect());
        inflight.spawn(process_batch(
            ctx.clone(),
            id,
            claimed,
            watch.clone(),
            abandon.clone(),
        ));
        if full {
            delay = cfg.poll_min;
        } else {
            // A partial batch means the backlog is drained for now: give producers a moment
            // to commit more so the next claim is fuller, without idling.
            tokio::select! {
                _ = ctx.wake.notified() => {}
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(cfg.poll_min) => {}
            }
        }
    }
    // Drain: wait for in-flight batches up to the deadline; the rest are released by `run`.
    let deadline = tokio::time::sleep(cfg.shutdown_timeout);
    tokio::pin!(deadline);
    while !inflight.is_empty() {
        tokio::select! {
            _ = inflight.join_next() => {}
            _ = &mut deadline, if !abandon.is_cancelled() => {
                tracing::warn!(worker = w, batches = inflight.len(), "shutdown deadline reached with batches in flight; abandoning their sends");
                abandon.cancel();
            }
        }
    }
}

/// Claims; if the claim's commit outcome is unknown (connection lost around COMMIT), looks the
/// claim up by its pre-generated id and keeps only what is still ours.
async fn claim_or_recover(
    store: &dyn OutboxStore,
    req: &ClaimRequest,
) -> Result<Vec<ClaimedEvent>, StoreError> {
    match store.claim(req).await {
        Ok(c) => Ok(c),
        Err(e) if e.kind() == ferry_core::StoreErrorKind::Unavailable => {
            // The commit may have happened. Our claim id is unique: whatever is CLAIMED under
            // it is ours to send; if the lookup fails too, the lease expires and others resend.
            match store.lookup_claim(&req.claim_id).await {
                Ok(items) if !items.is_empty() => {
                    tracing::info!(claim_id = %req.claim_id, items = items.len(), "recovered a claim whose commit response was lost");
                    Ok(items)
                }
                _ => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Sends one claimed batch and applies its outcomes; checks it against the worker's `watch`
/// as it is handed to the sink.
///
/// Store calls are never cancelled half-way: a future dropped between `BEGIN` and `COMMIT`
/// would leave a pooled connection inside a transaction (on SQLite, holding the only write
/// lock). Only the *send* can be abandoned (`abandon`, at the shutdown deadline); the batch's
/// tokens then stay in `in_flight` and `Relay::run` releases them.
async fn process_batch(
    ctx: Arc<Ctx>,
    id: u64,
    items: Vec<ClaimedEvent>,
    watch: Arc<Mutex<OrderWatch>>,
    abandon: CancellationToken,
) {
    let cfg = &ctx.config;
    let tokens: Vec<ClaimToken> = items.iter().map(|e| e.token.clone()).collect();
    // Renew the claim lease while the send is outstanding (slow broker). Stopped by a token and
    // awaited, never aborted, so a renewal cannot land after (and be fenced by) our own ack.
    let stop_renew = CancellationToken::new();
    let renew = {
        let store = ctx.store.clone();
        let metrics = ctx.metrics.clone();
        let tokens = tokens.clone();
        let lease = cfg.claim_lease;
        let stop = stop_renew.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(lease / 3) => {}
                }
                match store
                    .extend_lease(&ferry_core::LeaseExtension::new(&tokens, lease))
                    .await
                {
                    Ok(r) => {
                        metrics
                            .fenced
                            .fetch_add(r.fenced() as u64, Ordering::Relaxed);
                    }
                    Err(e) => tracing::warn!(error = %e, "lease renewal failed"),
                }
            }
        })
    };
    ferry_core::failpoint::hit("relay-after-claim");
    ctx.metrics.note_misrouted(&items);
    order_watch::check_send(&watch, &ctx.metrics, &items);
    let t0 = Instant::now();
    let sent = tokio::select! {
        o = ctx.sink.send_batch(&items) => Some(o),
        _ = abandon.cancelled() => None,
    };
    stop_renew.cancel();
    let _ = renew.await;
    let Some(outcomes) = sent else {
        tracing::info!(
            batch = id,
            items = items.len(),
            "send abandoned at the shutdown deadline; the batch will be released"
        );
        return;
    };
    ctx.metrics.send_latency.record(t0.elapsed());
    if outcomes.len() != items.len() {
        tracing::error!(
            items = items.len(),
            outcomes = outcomes.len(),
            "the sink answered a different number of outcomes than items; missing ones count as unknown"
        );
    }
    let route_items: Vec<RouteItem<'_>> = items
        .iter()
        .map(|e| RouteItem {
            aggregate_id: &e.aggregate_id,
            attempts: e.attempts,
            held: false,
        })
        .collect();
    let decisions = route(&route_items, outcomes, &ctx.policy(false));

    let mut acked = Vec::new();
    let mut acked_created = Vec::new();
    let mut retry = Vec::new();
    let mut quarantine = Vec::new();
    let mut unknown = Vec::new();
    for (e, d) in items.iter().zip(decisions) {
        match d {
            Decision::Ack => {
                acked.push(e.token.clone());
                acked_created.push(e.created_at);
            }
            Decision::Retry { delay, error } => retry.push(RetryItem {
                token: e.token.clone(),
                delay,
                error,
            }),
            Decision::Quarantine(why) => quarantine.push((e.token.clone(), why)),
            Decision::Unknown(err) => {
                tracing::debug!(event_id = %e.token.event_id, error = %err, "outcome unknown; releasing for resend");
                unknown.push(e.token.clone());
            }
            // row mode never holds (one version per aggregate per claim); release if it did
            Decision::Held { .. } => unknown.push(e.token.clone()),
        }
    }
    if !acked.is_empty() {
        ferry_core::failpoint::hit("relay-after-ack");
    }
    let t1 = Instant::now();
    let m = &ctx.metrics;
    if !acked.is_empty() {
        if let Some(r) = apply(&ctx, "ack", || ctx.store.ack(&acked)).await {
            // The report is in input order: zip it with the acked items' commit times and
            // record them under one histogram lock.
            let now = now_micros();
            m.record_commit_to_ack(
                r.items
                    .iter()
                    .zip(&acked_created)
                    .filter(|((_, res), _)| *res == ferry_core::CasResult::Applied)
                    .map(|(_, c)| (now - c).max(1) as u64),
            );
            m.sent.fetch_add(r.applied() as u64, Ordering::Relaxed);
        }
    }
    if !retry.is_empty() {
        if let Some(r) = apply(&ctx, "retry", || ctx.store.retry(&retry)).await {
            m.retried.fetch_add(r.applied() as u64, Ordering::Relaxed);
        }
    }
    if !quarantine.is_empty() {
        for (t, why) in &quarantine {
            tracing::warn!(event_id = %t.event_id, reason = %why, "quarantining event; its aggregate's successors are blocked until an operator acts");
        }
        if let Some(r) = apply(&ctx, "quarantine", || ctx.store.quarantine(&quarantine)).await {
            m.quarantined
                .fetch_add(r.applied() as u64, Ordering::Relaxed);
        }
    }
    if !unknown.is_empty() {
        m.unknown.fetch_add(unknown.len() as u64, Ordering::Relaxed);
        apply(&ctx, "release", || ctx.store.release(&unknown)).await;
    }
    m.ack_latency.record(t1.elapsed());
    ctx.in_flight.lock().expect("in-flight lock").remove(&id);
}

/// Applies one outcome CAS, retrying every store error (transient or not) for up to the claim
/// lease (after that the items are someone else's to resend anyway). Counts fenced items.
async fn apply<'a, F>(ctx: &'a Ctx, what: &str, op: impl Fn() -> F) -> Option<CasReport>
where
    F: std::future::Future<Output = Result<CasReport, StoreError>> + 'a,
{
    let deadline = Instant::now() + ctx.config.claim_lease;
    let mut backoff = Duration::from_millis(20);
    loop {
        match op().await {
            Ok(r) => {
                if r.fenced() > 0 {
                    ctx.metrics
                        .fenced
                        .fetch_add(r.fenced() as u64, Ordering::Relaxed);
                    tracing::info!(
                        what,
                        fenced = r.fenced(),
                        "outcome fenced: the claim was taken over"
                    );
                }
                return Some(r);
            }
            Err(e) => {
                ctx.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                if Instant::now() > deadline {
                    tracing::error!(what, error = %e, "giving up on an outcome update; the lease will expire and the events be resent");
                    return None;
                }
                tracing::warn!(what, error = %e, "outcome update failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}
