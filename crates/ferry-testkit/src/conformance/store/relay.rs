//! What the cases do as a relay (claim, extend, read a row's state) and the intents they
//! enqueue.
use std::time::{Duration, Instant};

use ferry_core::{ClaimRequest, ClaimToken, EventState, NewEvent, OutboxStore};

pub(super) use crate::fixtures::claim_all as req;

pub(super) fn ev(agg: &str, v: i64) -> NewEvent {
    crate::fixtures::intent("orders", agg, v)
}

pub(super) const LONG: Duration = Duration::from_secs(60);

pub(super) async fn state(store: &dyn OutboxStore, id: &str) -> EventState {
    store
        .record(id)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no row {id}"))
        .state
}

/// Extends the leases of `tokens` by `lease`; the per-item outcomes.
pub(super) async fn extend(
    store: &dyn OutboxStore,
    tokens: &[ClaimToken],
    lease: Duration,
) -> ferry_core::CasReport {
    let ext = ferry_core::LeaseExtension::new(tokens, lease);
    store.extend_lease(&ext).await.unwrap()
}

/// One claim of a single event with a lease of `lease_ms` (so another claimer takes it over soon).
pub(super) async fn claim_short(
    store: &dyn OutboxStore,
    lease_ms: u64,
) -> Vec<ferry_core::ClaimedEvent> {
    let lease = Duration::from_millis(lease_ms);
    store.claim(&req(1, lease)).await.unwrap()
}

/// Claims until something is returned (a lease must expire first), bounded by `max`.
pub(super) async fn claim_eventually(
    store: &dyn OutboxStore,
    r: &ClaimRequest,
    max: Duration,
) -> Vec<ferry_core::ClaimedEvent> {
    let start = Instant::now();
    loop {
        let got = store.claim(r).await.unwrap();
        if !got.is_empty() {
            return got;
        }
        assert!(
            start.elapsed() < max,
            "nothing became claimable within {max:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The claim tokens of `claimed`, in order.
pub(super) fn tokens(claimed: &[ferry_core::ClaimedEvent]) -> Vec<ClaimToken> {
    claimed.iter().map(|e| e.token.clone()).collect()
}

/// Enqueues v1 of the aggregates `{prefix}-0` … `{prefix}-{n - 1}` and claims up to `limit`
/// events: the events claimed and their tokens.
pub(super) async fn enqueue_and_claim(
    store: &dyn OutboxStore,
    prefix: &str,
    n: usize,
    limit: usize,
) -> (Vec<ferry_core::ClaimedEvent>, Vec<ClaimToken>) {
    let evs: Vec<NewEvent> = (0..n).map(|i| ev(&format!("{prefix}-{i}"), 1)).collect();
    store.enqueue(&evs).await.unwrap();
    let claimed = store.claim(&req(limit, LONG)).await.unwrap();
    let tokens = tokens(&claimed);
    (claimed, tokens)
}
