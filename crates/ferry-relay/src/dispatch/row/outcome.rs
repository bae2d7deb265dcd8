//! The outcome step: each routed item's compare-and-set on its claim token (ack, retry,
//! quarantine, release), batched per kind and retried for up to the claim lease; a fenced item
//! is counted, never an error.
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ferry_core::{now_micros, CasReport, ClaimedEvent, RetryItem, StoreError};

use crate::context::Ctx;
use crate::route::Decision;

/// Applies the routed `decisions` of batch `id` (one per item, in order) and takes the batch
/// off the in-flight list.
pub(super) async fn apply_outcomes(
    ctx: &Ctx,
    id: u64,
    items: &[ClaimedEvent],
    decisions: Vec<Decision>,
) {
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
        if let Some(r) = apply(ctx, "ack", || ctx.store.ack(&acked)).await {
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
        if let Some(r) = apply(ctx, "retry", || ctx.store.retry(&retry)).await {
            m.retried.fetch_add(r.applied() as u64, Ordering::Relaxed);
        }
    }
    if !quarantine.is_empty() {
        for (t, why) in &quarantine {
            tracing::warn!(event_id = %t.event_id, reason = %why, "quarantining event; its aggregate's successors are blocked until an operator acts");
        }
        if let Some(r) = apply(ctx, "quarantine", || ctx.store.quarantine(&quarantine)).await {
            m.quarantined
                .fetch_add(r.applied() as u64, Ordering::Relaxed);
        }
    }
    if !unknown.is_empty() {
        m.unknown.fetch_add(unknown.len() as u64, Ordering::Relaxed);
        apply(ctx, "release", || ctx.store.release(&unknown)).await;
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
