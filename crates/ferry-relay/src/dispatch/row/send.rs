//! The send step: one claimed batch to the sink, its claim lease renewed while the send is
//! outstanding, each item's outcome routed ([`crate::route`]) and handed to the outcome step.
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferry_core::{ClaimToken, ClaimedEvent};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;
use crate::dispatch::row::outcome::apply_outcomes;
use crate::order_watch::{self, OrderWatch};
use crate::route::{route, RouteItem};

/// Sends one claimed batch and applies its outcomes; checks it against the worker's `watch`
/// as it is handed to the sink.
///
/// Store calls are never cancelled half-way: a future dropped between `BEGIN` and `COMMIT`
/// would leave a pooled connection inside a transaction (on SQLite, holding the only write
/// lock). Only the *send* can be abandoned (`abandon`, at the shutdown deadline); the batch's
/// tokens then stay in `in_flight` and `Relay::run` releases them.
pub(super) async fn send_batch(
    ctx: Arc<Ctx>,
    id: u64,
    items: Vec<ClaimedEvent>,
    watch: Arc<Mutex<OrderWatch>>,
    abandon: CancellationToken,
) {
    let tokens: Vec<ClaimToken> = items.iter().map(|e| e.token.clone()).collect();
    // Renew the claim lease while the send is outstanding (slow broker). Stopped by a token and
    // awaited, never aborted, so a renewal cannot land after (and be fenced by) our own ack.
    let stop_renew = CancellationToken::new();
    let renew = renew_lease(&ctx, tokens, stop_renew.clone());
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
    let route_items: Vec<RouteItem<'_>> = items.iter().map(RouteItem::claimed).collect();
    let decisions = route(&route_items, outcomes, &ctx.policy(false));
    apply_outcomes(&ctx, id, &items, decisions).await;
}

/// Renews the claim lease of `tokens` every lease/3 until `stop` (a fenced renewal is counted).
fn renew_lease(ctx: &Ctx, tokens: Vec<ClaimToken>, stop: CancellationToken) -> JoinHandle<()> {
    let store = ctx.store.clone();
    let metrics = ctx.metrics.clone();
    let lease = ctx.config.claim_lease;
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
                        .fetch_add(r.fenced() as u64, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) => tracing::warn!(error = %e, "lease renewal failed"),
            }
        }
    })
}
