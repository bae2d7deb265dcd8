//! The exception path: the per-row protocol on exception rows (claim due rows whose aggregate
//! has no lower open exception, send, compare-and-set ack / retry / quarantine / release), one
//! version of an aggregate per round trip.
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferry_core::{
    now_micros, ClaimRequest, CursorStore, ExceptionOutcomes, RetryItem, SlotFence, SlotId,
};

use crate::context::Ctx;
use crate::order_watch::{self, OrderWatch};
use crate::route::{route, Decision, RouteItem};

/// The exception path: claims due exception rows of `slots` (per-row protocol, predecessor rule),
/// sends them (checked against the worker's order `watch`), settles them. Returns when to look
/// again.
pub(super) async fn run_exceptions(
    ctx: &Ctx,
    cs: &dyn CursorStore,
    slots: &[SlotId],
    watch: &Mutex<OrderWatch>,
) -> Instant {
    let cfg = &ctx.config;
    let idle = Instant::now() + cfg.poll_idle;
    let mut req = ClaimRequest::new(slots.to_vec(), cfg.batch_size, cfg.claim_lease);
    req.fence = Some(SlotFence {
        owner: cfg.owner.clone(),
    });
    let items = match cs.claim_exceptions(&req).await {
        Ok(v) => v,
        Err(e) => {
            ctx.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "claiming exceptions failed");
            return idle;
        }
    };
    if items.is_empty() {
        return idle;
    }
    ctx.metrics
        .claimed_items
        .fetch_add(items.len() as u64, Ordering::Relaxed);
    ctx.metrics.note_misrouted(&items);
    order_watch::check_send(watch, &ctx.metrics, &items);
    let outcomes = ctx.sink.send_batch(&items).await;
    let route_items: Vec<RouteItem<'_>> = items.iter().map(RouteItem::claimed).collect();
    let mut out = ExceptionOutcomes::default();
    let mut acked_created = Vec::new();
    for (e, d) in items
        .iter()
        .zip(route(&route_items, outcomes, &ctx.policy(false)))
    {
        match d {
            Decision::Ack => {
                out.acked.push(e.token.clone());
                acked_created.push(e.created_at);
            }
            Decision::Retry { delay, error } => out.retry.push(RetryItem {
                token: e.token.clone(),
                delay,
                error,
            }),
            Decision::Quarantine(why) => {
                tracing::warn!(event_id = %e.token.event_id, reason = %why, "quarantining event; its aggregate's successors are held until an operator acts");
                out.quarantine.push((e.token.clone(), why))
            }
            Decision::Unknown(_) | Decision::Held { .. } => out.release.push(e.token.clone()),
        }
    }
    let deadline = Instant::now() + cfg.claim_lease;
    let mut backoff = Duration::from_millis(20);
    let report = loop {
        match cs.settle_exceptions(&out).await {
            Ok(r) => break Some(r),
            Err(e) => {
                ctx.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                if Instant::now() > deadline {
                    tracing::error!(error = %e, "giving up on exception outcomes; their lease will expire and they be resent");
                    break None;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    };
    if let Some(r) = report {
        let m = &ctx.metrics;
        let applied = |range: std::ops::Range<usize>| {
            r.items[range]
                .iter()
                .filter(|(_, x)| *x == ferry_core::CasResult::Applied)
                .count() as u64
        };
        let (a, rt, q) = (out.acked.len(), out.retry.len(), out.quarantine.len());
        let now = now_micros();
        m.record_commit_to_ack(
            r.items[..a]
                .iter()
                .zip(&acked_created)
                .filter(|((_, x), _)| *x == ferry_core::CasResult::Applied)
                .map(|(_, c)| (now - c).max(1) as u64),
        );
        m.sent.fetch_add(applied(0..a), Ordering::Relaxed);
        m.retried.fetch_add(applied(a..a + rt), Ordering::Relaxed);
        m.quarantined
            .fetch_add(applied(a + rt..a + rt + q), Ordering::Relaxed);
        m.unknown
            .fetch_add(out.release.len() as u64, Ordering::Relaxed);
        m.fenced.fetch_add(r.fenced() as u64, Ordering::Relaxed);
    }
    Instant::now()
}
