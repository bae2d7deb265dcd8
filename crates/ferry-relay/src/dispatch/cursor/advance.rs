//! The advance step, in read order: route a sent batch's outcomes ([`crate::route`], the hold
//! rule on), then move its slots' durable cursors with one fenced compare-and-set that writes
//! the exception rows of every item not acked in the same transaction. One advance runs at a
//! time, while the worker reads and sends on; batches whose sends finished meanwhile share it.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{
    new_event_id, now_micros, AdvanceResult, CursorAdvance, CursorPos, CursorStore, ExceptionKind,
    NewException, SlotAdvance, SlotId, StoreErrorKind,
};
use tokio::sync::Notify;

use crate::context::Ctx;
use crate::dispatch::cursor::state::{Advancing, Batch, Routed, State};
use crate::order_watch;
use crate::route::{route, Decision, RouteItem};

/// Waits for a batch's sends and routes each item's outcome.
async fn route_batch(ctx: &Ctx, b: Batch) -> Routed {
    let outcomes = match b.send {
        Some(send) => send.outcomes().await,
        None => Vec::new(),
    };
    let items: Vec<RouteItem<'_>> = b
        .events
        .iter()
        .map(|e| RouteItem {
            aggregate_id: &e.event.aggregate_id,
            attempts: e.event.attempts,
            held: e.held,
        })
        .collect();
    let sent = b.events.iter().filter(|e| !e.held).count();
    if outcomes.len() != sent {
        tracing::error!(
            items = sent,
            outcomes = outcomes.len(),
            "the sink answered a different number of outcomes than items; missing ones count as unknown"
        );
    }
    let decisions = route(&items, outcomes, &ctx.policy(true));
    let mut r = Routed {
        events: Vec::new(),
        released: b.released,
        to: b.to,
        exceptions: Vec::new(),
        acked_created: Vec::new(),
        retried: 0,
        quarantined: 0,
        unknown: 0,
    };
    for (e, d) in b.events.iter().zip(decisions) {
        let ev = &e.event;
        let (kind, attempts) = match d {
            Decision::Ack => {
                r.acked_created.push(ev.created_at);
                continue;
            }
            Decision::Retry { delay, error } => {
                r.retried += 1;
                (ExceptionKind::Retry { delay, error }, ev.attempts + 1)
            }
            Decision::Quarantine(why) => {
                r.quarantined += 1;
                tracing::warn!(event_id = %ev.token.event_id, reason = %why, "quarantining event; its aggregate's successors are held until an operator acts");
                (ExceptionKind::Quarantine(why), ev.attempts + 1)
            }
            Decision::Unknown(err) => {
                r.unknown += 1;
                (ExceptionKind::Unknown(err), ev.attempts)
            }
            Decision::Held { acked } => {
                if acked {
                    ctx.metrics
                        .acked_after_failed_predecessor
                        .fetch_add(1, Ordering::Relaxed);
                }
                (ExceptionKind::Held, ev.attempts)
            }
        };
        r.exceptions.push(NewException {
            seq: ev.token.seq,
            slot: ev.shard_slot,
            aggregate_id: ev.aggregate_id.clone(),
            aggregate_version: ev.aggregate_version,
            attempts,
            kind,
        });
    }
    r.events = b.events;
    r
}

/// Completes the oldest batch: waits for its sends and routes the outcomes, applies the
/// previous advance, then starts one advance for this batch and every batch behind it whose
/// sends have finished too (group commit: their slots move to the latest position, their
/// exception rows go in the same transaction). The advance runs while the worker reads and
/// sends on; [`finish_advance`] applies it. Returns false when an advance was fenced or failed
/// (the caller resets and reloads the cursors).
pub(super) async fn complete_front(ctx: &Arc<Ctx>, st: &mut State, done: &Arc<Notify>) -> bool {
    let Some(b) = st.queue.pop_front() else {
        return finish_advance(ctx, st).await;
    };
    let gen = b.gen;
    let first = route_batch(ctx, b).await;
    if gen != st.gen {
        st.unbusy_except(&first.events, first.released.as_ref());
        return true;
    }
    // The previous advance first: this one expects the cursor versions it sets, and must not
    // run at all if it failed.
    if !finish_advance(ctx, st).await {
        st.unbusy_except(&first.events, first.released.as_ref());
        return false;
    }
    let mut batches = vec![first];
    while st
        .queue
        .front()
        .is_some_and(|f| f.gen == st.gen && f.is_done())
    {
        let b = st.queue.pop_front().expect("front exists");
        batches.push(route_batch(ctx, b).await);
    }
    if batches.iter().any(|b| !b.acked_created.is_empty()) {
        ferry_core::failpoint::hit("relay-after-ack");
    }
    // per slot the position of the latest batch (positions only grow in read order)
    let mut to: Vec<(SlotId, CursorPos)> = Vec::new();
    for (slot, pos) in batches.iter().flat_map(|b| b.to.iter().copied()) {
        match to.iter_mut().find(|(s, _)| *s == slot) {
            Some(t) => t.1 = t.1.max(pos),
            None => to.push((slot, pos)),
        }
    }
    let adv = CursorAdvance {
        owner: ctx.config.owner.clone(),
        claim_id: new_event_id(),
        slots: to
            .iter()
            .filter_map(|(s, p)| {
                st.cursors.get(s).map(|c| SlotAdvance {
                    slot: *s,
                    epoch: c.epoch,
                    version: c.version,
                    to: *p,
                })
            })
            .collect(),
        exceptions: batches
            .iter_mut()
            .flat_map(|b| std::mem::take(&mut b.exceptions))
            .collect(),
    };
    // The exception path will resend these aggregates from their lowest exception row on: not
    // a regression. Rewound before the advance can commit (and the exception path claim the
    // rows); if it does not, the reset clears everything anyway.
    {
        let mut watch = order_watch::lock(&st.watch);
        for x in &adv.exceptions {
            watch.rewind(&x.aggregate_id, x.aggregate_version);
        }
    }
    let slots = adv.slots.clone();
    let finished = Arc::new(AtomicBool::new(false));
    let task = {
        let (ctx, finished, done) = (ctx.clone(), finished.clone(), done.clone());
        tokio::spawn(async move {
            let t = Instant::now();
            let result = match ctx.store.cursor() {
                Some(cs) => advance(&ctx, cs, &adv).await,
                None => None,
            };
            ctx.metrics.ack_latency.record(t.elapsed());
            finished.store(true, Ordering::Release);
            done.notify_one();
            result
        })
    };
    st.advancing = Some(Advancing {
        gen: st.gen,
        task,
        finished,
        slots,
        batches,
    });
    true
}

/// Waits for the advance in flight, if any, and applies its result: the cursors and metrics on
/// success; false when it was fenced or failed.
pub(super) async fn finish_advance(ctx: &Ctx, st: &mut State) -> bool {
    let Some(a) = st.advancing.take() else {
        return true;
    };
    // a panicked advance task counts as a failed advance
    let result = a.task.await.ok().flatten();
    for b in &a.batches {
        st.unbusy_except(&b.events, b.released.as_ref());
    }
    if a.gen != st.gen {
        return true;
    }
    let events: usize = a.batches.iter().map(|b| b.events.len()).sum();
    match result {
        Some(AdvanceResult::Applied) => {
            for s in &a.slots {
                if let Some(c) = st.cursors.get_mut(&s.slot) {
                    c.version += 1;
                    c.pos = s.to;
                }
            }
            let m = &ctx.metrics;
            let now = now_micros();
            for b in &a.batches {
                m.record_commit_to_ack(b.acked_created.iter().map(|c| (now - c).max(1) as u64));
                m.sent
                    .fetch_add(b.acked_created.len() as u64, Ordering::Relaxed);
                m.retried.fetch_add(b.retried, Ordering::Relaxed);
                m.quarantined.fetch_add(b.quarantined, Ordering::Relaxed);
                m.unknown.fetch_add(b.unknown, Ordering::Relaxed);
            }
            true
        }
        Some(AdvanceResult::Fenced) => {
            ctx.metrics
                .fenced
                .fetch_add(events.max(1) as u64, Ordering::Relaxed);
            tracing::info!(
                events,
                "cursor advance fenced: a slot changed hands; re-reading from the durable cursors"
            );
            false
        }
        None => false,
    }
}

/// One advance, retried on store errors (except `InvalidInput`, which gives up at once) for up
/// to the claim lease; a lost commit response is resolved with [`CursorStore::lookup_advance`].
async fn advance(ctx: &Ctx, cs: &dyn CursorStore, adv: &CursorAdvance) -> Option<AdvanceResult> {
    let deadline = Instant::now() + ctx.config.claim_lease;
    let mut backoff = Duration::from_millis(20);
    loop {
        match cs.advance(adv).await {
            Ok(r) => return Some(r),
            Err(e) => {
                ctx.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                // The commit may have happened: the advance's id says.
                if matches!(cs.lookup_advance(&adv.claim_id).await, Ok(true)) {
                    tracing::info!(claim_id = %adv.claim_id, "recovered an advance whose commit response was lost");
                    return Some(AdvanceResult::Applied);
                }
                if Instant::now() > deadline || e.kind() == StoreErrorKind::InvalidInput {
                    tracing::error!(error = %e, "giving up on a cursor advance; the batch will be re-read and resent");
                    return None;
                }
                tracing::warn!(error = %e, "cursor advance failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}
