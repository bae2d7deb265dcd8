//! Cursor dispatch frees an aggregate for later reads when all its items of a batch were acked,
//! before that batch's advance commits — and only then. An aggregate with an item that was not
//! acked stays busy until the advance has written its exception row; otherwise a later version
//! read in the meantime would be sent before the failed one is resent.
//!
//! The store's advances are slowed down (500 ms) and the sink fails the aggregate's first
//! version once, slowly, while later versions are committed: any early release of that
//! aggregate sends a later version first, which the sink's record of first acks shows.
//!
//! And a fenced advance (nothing written, as another owner's takeover leaves it) makes the worker
//! drop its in-memory positions and everything in flight, and read again from the durable
//! cursors: every event is delivered, each aggregate's versions first in order, the fenced
//! batches' events a second time.
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_core::{
    AdvanceResult, BoxFuture, CasReport, ClaimRequest, ClaimToken, ClaimedEvent, CursorAdvance,
    CursorBatch, CursorRead, CursorStore, DispatchMode, EnqueueError, EventRecord,
    ExceptionOutcomes, HorizonInfo, NewEvent, OutboxStatus, OutboxStore, Outcome, QuarantinedEvent,
    ReconcileReport, ReconcileRequest, RetryItem, SlotCursor, SlotId, SlotLease, StoreError,
};
use ferry_relay::{Relay, RelayConfig, Sink, WorkerDefaults};
use ferry_testkit::{RelayTask, TestDb};

/// A store whose cursor advances take `delay` longer, and whose `fence`-th advance (counting from
/// 1; 0: none) comes back `Fenced` with nothing written; everything else is the inner store's.
struct SlowAdvance {
    inner: Arc<dyn OutboxStore>,
    delay: Duration,
    fence: usize,
    advances: AtomicUsize,
}

impl SlowAdvance {
    fn cs(&self) -> &dyn CursorStore {
        self.inner.cursor().expect("a store with cursor dispatch")
    }
}

impl ferry_core::RowDispatch for SlowAdvance {
    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>> {
        self.inner.claim(req)
    }

    fn lookup_claim<'a>(
        &'a self,
        claim_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>> {
        self.inner.lookup_claim(claim_id)
    }

    fn ack<'a>(&'a self, tokens: &'a [ClaimToken]) -> BoxFuture<'a, Result<CasReport, StoreError>> {
        self.inner.ack(tokens)
    }

    fn retry<'a>(&'a self, items: &'a [RetryItem]) -> BoxFuture<'a, Result<CasReport, StoreError>> {
        self.inner.retry(items)
    }

    fn quarantine<'a>(
        &'a self,
        items: &'a [(ClaimToken, String)],
    ) -> BoxFuture<'a, Result<CasReport, StoreError>> {
        self.inner.quarantine(items)
    }

    fn release<'a>(
        &'a self,
        tokens: &'a [ClaimToken],
    ) -> BoxFuture<'a, Result<CasReport, StoreError>> {
        self.inner.release(tokens)
    }

    fn extend_lease<'a>(
        &'a self,
        req: &'a ferry_core::LeaseExtension<'a>,
    ) -> BoxFuture<'a, Result<CasReport, StoreError>> {
        self.inner.extend_lease(req)
    }
}

impl ferry_core::SlotOwnership for SlowAdvance {
    fn acquire_slots<'a>(
        &'a self,
        req: &'a ferry_core::SlotRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<SlotLease>, StoreError>> {
        self.inner.acquire_slots(req)
    }

    fn release_slots<'a>(
        &'a self,
        req: &'a ferry_core::SlotRelease<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.release_slots(req)
    }

    fn heartbeat_member<'a>(
        &'a self,
        req: &'a ferry_core::MemberHeartbeat<'a>,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        self.inner.heartbeat_member(req)
    }

    fn leave_member<'a>(&'a self, owner: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.leave_member(owner)
    }

    fn slot_leases(&self) -> BoxFuture<'_, Result<Vec<SlotLease>, StoreError>> {
        self.inner.slot_leases()
    }
}

impl ferry_core::OperatorActions for SlowAdvance {
    fn enqueue<'a>(
        &'a self,
        events: &'a [NewEvent],
    ) -> BoxFuture<'a, Result<Vec<String>, EnqueueError>> {
        self.inner.enqueue(events)
    }

    fn requeue<'a>(
        &'a self,
        req: &'a ferry_core::OperatorAction<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.requeue(req)
    }

    fn skip<'a>(
        &'a self,
        req: &'a ferry_core::OperatorAction<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.skip(req)
    }

    fn list_quarantined(
        &self,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<QuarantinedEvent>, StoreError>> {
        self.inner.list_quarantined(limit)
    }

    fn status(&self) -> BoxFuture<'_, Result<OutboxStatus, StoreError>> {
        self.inner.status()
    }

    fn record<'a>(
        &'a self,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<EventRecord>, StoreError>> {
        self.inner.record(event_id)
    }
}

impl ferry_core::OutboxStore for SlowAdvance {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn reconcile<'a>(
        &'a self,
        req: &'a ReconcileRequest,
    ) -> BoxFuture<'a, Result<ReconcileReport, StoreError>> {
        self.inner.reconcile(req)
    }

    fn cursor(&self) -> Option<&dyn CursorStore> {
        Some(self)
    }
}

impl CursorStore for SlowAdvance {
    fn dispatch_mode(&self) -> BoxFuture<'_, Result<DispatchMode, StoreError>> {
        self.cs().dispatch_mode()
    }
    fn set_dispatch_mode<'a>(
        &'a self,
        mode: DispatchMode,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.cs().set_dispatch_mode(mode, owner)
    }
    fn load_cursors<'a>(
        &'a self,
        owner: &'a str,
        slots: &'a [SlotId],
    ) -> BoxFuture<'a, Result<Vec<SlotCursor>, StoreError>> {
        self.cs().load_cursors(owner, slots)
    }
    fn read_batch<'a>(
        &'a self,
        req: &'a CursorRead,
    ) -> BoxFuture<'a, Result<CursorBatch, StoreError>> {
        self.cs().read_batch(req)
    }
    fn advance<'a>(
        &'a self,
        req: &'a CursorAdvance,
    ) -> BoxFuture<'a, Result<AdvanceResult, StoreError>> {
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            if self.advances.fetch_add(1, Ordering::SeqCst) + 1 == self.fence {
                return Ok(AdvanceResult::Fenced);
            }
            self.cs().advance(req).await
        })
    }
    fn lookup_advance<'a>(&'a self, claim_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.cs().lookup_advance(claim_id)
    }
    fn claim_exceptions<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>> {
        self.cs().claim_exceptions(req)
    }
    fn settle_exceptions<'a>(
        &'a self,
        out: &'a ExceptionOutcomes,
    ) -> BoxFuture<'a, Result<CasReport, StoreError>> {
        self.cs().settle_exceptions(out)
    }
    fn horizon(&self) -> BoxFuture<'_, Result<HorizonInfo, StoreError>> {
        self.cs().horizon()
    }
}

/// Acks everything except the first attempt of `(FAIL_AGG, 1)`, which it answers with a retry
/// after `slow`; records the versions of each aggregate in the order they were first acked.
#[derive(Default)]
struct ScriptedSink {
    slow: Duration,
    failed_once: Mutex<bool>,
    /// Attempts seen of `(FAIL_AGG, 1)`.
    attempts: Mutex<u32>,
    first_acks: Mutex<HashMap<String, Vec<i64>>>,
}

const FAIL_AGG: &str = "hot";

impl Sink for ScriptedSink {
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn send_batch<'a>(&'a self, items: &'a [ClaimedEvent]) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(async move {
            let first = items
                .iter()
                .any(|e| e.aggregate_id == FAIL_AGG && e.aggregate_version == 1);
            if first {
                *self.attempts.lock().unwrap() += 1;
            }
            let fail = first && !std::mem::replace(&mut *self.failed_once.lock().unwrap(), true);
            if fail {
                tokio::time::sleep(self.slow).await;
            }
            let mut acks = self.first_acks.lock().unwrap();
            let mut failed_agg = false;
            items
                .iter()
                .map(|e| {
                    if e.aggregate_id == FAIL_AGG
                        && (failed_agg || (fail && e.aggregate_version == 1))
                    {
                        failed_agg = true;
                        return Outcome::Retry("scripted failure".into());
                    }
                    let seen = acks.entry(e.aggregate_id.clone()).or_default();
                    if !seen.contains(&e.aggregate_version) {
                        seen.push(e.aggregate_version);
                    }
                    Outcome::Acked
                })
                .collect()
        })
    }
}

fn ev(agg: &str, v: i64) -> NewEvent {
    ferry_testkit::intent("orders", agg, v)
}

async fn failed_aggregate_stays_busy_until_its_advance(db: TestDb) {
    let store: Arc<dyn OutboxStore> = Arc::new(SlowAdvance {
        inner: db.store.clone(),
        delay: Duration::from_millis(500),
        fence: 0,
        advances: AtomicUsize::new(0),
    });
    let sink = Arc::new(ScriptedSink {
        slow: Duration::from_millis(400),
        ..Default::default()
    });
    let d = WorkerDefaults::for_mode(DispatchMode::Cursor, ferry_store::Backend::Postgres);
    let cfg = RelayConfig {
        dispatch: Some(DispatchMode::Cursor),
        workers: d.workers,
        max_in_flight: d.max_in_flight,
        batch_size: 100,
        heartbeat: Duration::from_millis(200),
        slot_ttl: Duration::from_secs(5),
        poll_idle: Duration::from_millis(20),
        claim_lease: Duration::from_secs(20),
        backoff: ferry_core::Backoff {
            base: Duration::from_millis(50),
            max: Duration::from_millis(200),
        },
        ..Default::default()
    };
    store.enqueue(&[ev(FAIL_AGG, 1)]).await.unwrap();
    let relay = Relay::new(store.clone(), sink.clone(), cfg).unwrap();
    let metrics = relay.metrics();
    let relay = RelayTask::spawn(|cancel| relay.run(cancel));
    // v1 is being sent (slowly, and will fail): commit its successors, plus other aggregates
    // that keep the relay reading
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while *sink.attempts.lock().unwrap() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "v1 was never sent");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for v in 2..=5 {
        store
            .enqueue(&[ev(FAIL_AGG, v), ev(&format!("other-{v}"), 1)])
            .await
            .unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let done = sink
            .first_acks
            .lock()
            .unwrap()
            .get(FAIL_AGG)
            .is_some_and(|v| v.len() == 5);
        if done {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every version was delivered: {:?}",
            sink.first_acks.lock().unwrap().get(FAIL_AGG)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    relay.stop().await;
    let order = sink.first_acks.lock().unwrap()[FAIL_AGG].clone();
    assert_eq!(
        order,
        vec![1, 2, 3, 4, 5],
        "a later version was delivered before the failed one was resent"
    );
    assert!(*sink.attempts.lock().unwrap() >= 2, "v1 was resent");
    // v1 resent by the exception path after the first send: a resend, not a regression
    assert_eq!(metrics.order_regressions.load(Ordering::Relaxed), 0);
    db.cleanup().await;
}

/// A test per backend, `$test` on `$backend`, that runs `$case` on a fresh database of it
/// (returning early, with a printed reason, where the server's URL is unset).
macro_rules! on_backends {
    ($case:ident: $($test:ident on $backend:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                let Some(db) = TestDb::open(ferry_store::Backend::$backend).await else {
                    return;
                };
                $case(db).await;
            }
        )+
    };
}

on_backends!(failed_aggregate_stays_busy_until_its_advance:
    sqlite_failed_aggregate_stays_busy_until_its_advance on Sqlite,
    postgres_failed_aggregate_stays_busy_until_its_advance on Postgres,
);

/// Acks everything; records every send and each aggregate's versions in first-ack order.
#[derive(Default)]
struct RecordingSink {
    sends: AtomicUsize,
    first_acks: Mutex<HashMap<String, Vec<i64>>>,
}

impl Sink for RecordingSink {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn send_batch<'a>(&'a self, items: &'a [ClaimedEvent]) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(async move {
            self.sends.fetch_add(items.len(), Ordering::SeqCst);
            let mut acks = self.first_acks.lock().unwrap();
            for e in items {
                let seen = acks.entry(e.aggregate_id.clone()).or_default();
                if !seen.contains(&e.aggregate_version) {
                    seen.push(e.aggregate_version);
                }
            }
            vec![Outcome::Acked; items.len()]
        })
    }
}

const AGGREGATES: i64 = 10;
const VERSIONS: i64 = 30;

async fn a_fenced_advance_rereads_from_the_durable_cursors(db: TestDb) {
    let slow = Arc::new(SlowAdvance {
        inner: db.store.clone(),
        delay: Duration::from_millis(30),
        fence: 2,
        advances: AtomicUsize::new(0),
    });
    let store: Arc<dyn OutboxStore> = slow.clone();
    let sink = Arc::new(RecordingSink::default());
    let d = WorkerDefaults::for_mode(DispatchMode::Cursor, ferry_store::Backend::Postgres);
    let cfg = RelayConfig {
        dispatch: Some(DispatchMode::Cursor),
        workers: d.workers,
        max_in_flight: d.max_in_flight,
        batch_size: 20,
        heartbeat: Duration::from_millis(200),
        slot_ttl: Duration::from_secs(5),
        poll_idle: Duration::from_millis(20),
        claim_lease: Duration::from_secs(20),
        ..Default::default()
    };
    let relay = Relay::new(store.clone(), sink.clone(), cfg).unwrap();
    let metrics = relay.metrics();
    let relay = RelayTask::spawn(|cancel| relay.run(cancel));
    // versions committed in order, a few at a time, while the relay reads, sends and advances
    for v in 1..=VERSIONS {
        let batch: Vec<NewEvent> = (0..AGGREGATES)
            .map(|a| ev(&format!("agg-{a}"), v))
            .collect();
        store.enqueue(&batch).await.unwrap();
        if v % 5 == 0 {
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }
    let total = (AGGREGATES * VERSIONS) as usize;
    let delivered = || -> usize { sink.first_acks.lock().unwrap().values().map(Vec::len).sum() };
    let done =
        ferry_testkit::poll_until(Duration::from_secs(30), Duration::from_millis(20), || {
            let n = delivered();
            async move { n == total }
        })
        .await;
    relay.stop().await;
    assert!(done, "{} of {total} events delivered", delivered());
    assert!(
        slow.advances.load(Ordering::SeqCst) >= 3,
        "the relay never advanced past the fenced advance"
    );
    assert!(
        metrics.fenced.load(Ordering::Relaxed) > 0,
        "the fenced advance was not counted"
    );
    let want: Vec<i64> = (1..=VERSIONS).collect();
    for (agg, order) in sink.first_acks.lock().unwrap().iter() {
        assert_eq!(order, &want, "{agg}: versions first delivered out of order");
    }
    assert!(
        sink.sends.load(Ordering::SeqCst) > total,
        "nothing was sent again after the fenced advance"
    );
    // the resends from the durable cursors go back below versions sent before the reset:
    // legal, not counted by the order net (it forgets what it sent when the worker resets)
    assert_eq!(metrics.order_regressions.load(Ordering::Relaxed), 0);
    db.cleanup().await;
}

on_backends!(a_fenced_advance_rereads_from_the_durable_cursors:
    sqlite_a_fenced_advance_rereads_from_the_durable_cursors on Sqlite,
    postgres_a_fenced_advance_rereads_from_the_durable_cursors on Postgres,
    mysql_a_fenced_advance_rereads_from_the_durable_cursors on Mysql,
);
