//! The row-dispatch worker's loop: claim → hand the batch to its own task → claim the next.
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_core::{slots_for_worker, ClaimRequest, SlotFence, SlotId};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;
use crate::dispatch::row::claim::claim_or_recover;
use crate::dispatch::row::send::send_batch;
use crate::order_watch::OrderWatch;

/// One row-dispatch shard worker: claims batches of its slots and runs each as its own task
/// ([`send_batch`]) until `cancel`, then waits up to `shutdown_timeout` for them (what is still
/// claimed after that is released by [`crate::relay::Relay::run`]).
pub(crate) async fn worker(
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
        inflight.spawn(send_batch(
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
