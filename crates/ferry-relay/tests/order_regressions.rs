//! The order net (`crates/ferry-relay/src/order_watch.rs`): an aggregate's version that goes
//! down in what the relay hands to the sink is counted in `ferry_order_regressions_total` and
//! logged with the aggregate, both versions, the slot and the topic — in both dispatch modes,
//! on every backend. Without the net both tests fail: the counter stays 0 and nothing is logged.
//!
//! Versions go down in the relay's input only when producers commit them out of order (the
//! relays keep every other order, which `relay_kafka.rs` and `cursor_release.rs` check, with
//! the counter at 0 through their resends): here a version 1 committed after version 2 was
//! sent, and a version 1 committed after version 2 in the same read.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use ferry_core::DispatchMode;
use ferry_relay::metrics::sample;
use ferry_relay::{Metrics, Relay, RelayConfig};
use ferry_testkit::{wait_until, RelayTask, TestDb};

mod support;
use support::{insert_intent, RecordingSink};

const TOPIC: &str = "orders";

/// Error events logged in this test process, one line each: `field=value ` pairs. The tests of
/// this file run in parallel and share it; each looks for its own aggregate.
static LOGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Collects error events into [`LOGS`] (a subscriber of this file's own: the relay depends on
/// `tracing` alone, and a formatter is not needed to read fields back).
struct Capture;

struct Line(String);

impl tracing::field::Visit for Line {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        use std::fmt::Write;
        let _ = write!(self.0, "{}={value} ", field.name());
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        m.is_event() && *m.level() == tracing::Level::ERROR
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = Line(String::new());
        event.record(&mut line);
        LOGS.lock().unwrap().push(line.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn capture_logs() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        tracing::subscriber::set_global_default(Capture).expect("no other global subscriber");
    });
}

/// The logged regressions of `agg`.
fn logged(agg: &str) -> Vec<String> {
    let needle = format!("aggregate_id={agg} ");
    LOGS.lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&needle) && l.contains("sent_now="))
        .cloned()
        .collect()
}

/// An aggregate id no other test of this process uses (they share [`LOGS`]).
fn fresh_aggregate() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("order-{}", N.fetch_add(1, Ordering::Relaxed))
}

fn start(db: &TestDb, mode: DispatchMode) -> (Arc<RecordingSink>, Arc<Metrics>, RelayTask) {
    capture_logs();
    let sink = Arc::new(RecordingSink::default());
    let cfg = RelayConfig {
        dispatch: Some(mode),
        poll_idle: Duration::from_millis(50),
        ..Default::default()
    };
    let relay = Relay::new(db.store.clone(), sink.clone(), cfg).unwrap();
    let metrics = relay.metrics();
    (sink, metrics, RelayTask::spawn(|cancel| relay.run(cancel)))
}

async fn wait_handed(sink: &RecordingSink, agg: &str, n: usize) {
    wait_until(
        &format!("{n} versions of {agg} handed to the sink"),
        Duration::from_secs(30),
        || {
            let got = sink.versions_of(agg).len();
            async move { got >= n }
        },
    )
    .await;
}

/// The counter, read from the metrics exposition as a scrape would.
fn exported(metrics: &Arc<Metrics>) -> Option<f64> {
    sample(&metrics.render(), "ferry_order_regressions_total")
}

/// Version 2 is committed and sent; then a producer commits version 1. Both modes send it
/// (the row claim finds no unfinished lower version, the cursor reads it past its position):
/// one regression across batches, logged.
async fn a_version_committed_after_a_later_one_was_sent_is_counted(db: TestDb, mode: DispatchMode) {
    let agg = fresh_aggregate();
    db.store
        .enqueue(&[ferry_testkit::intent(TOPIC, &agg, 2)])
        .await
        .unwrap();
    let (sink, metrics, relay) = start(&db, mode);
    wait_handed(&sink, &agg, 1).await;
    db.store
        .enqueue(&[ferry_testkit::intent(TOPIC, &agg, 1)])
        .await
        .unwrap();
    wait_handed(&sink, &agg, 2).await;
    relay.stop().await;
    assert_eq!(sink.versions_of(&agg), [2, 1]);
    assert_eq!(metrics.order_regressions.load(Ordering::Relaxed), 1);
    assert_eq!(exported(&metrics), Some(1.0));
    let lines = logged(&agg);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let slot = ferry_core::slot_for(&agg);
    for field in [
        "sent_before=2 ".to_string(),
        "sent_now=1 ".into(),
        format!("slot={slot} "),
        format!("topic={TOPIC} "),
        "same_batch=false ".into(),
    ] {
        assert!(lines[0].contains(&field), "{field:?} not in {:?}", lines[0]);
    }
    db.cleanup().await;
}

/// Version 2 and then version 1 committed before the relay starts (plain INSERTs, so `seq`
/// order is 2, 1). Cursor dispatch reads them in that order into one batch: one regression,
/// within the batch. Row dispatch never sends them so: its claim passes version 2 over while
/// version 1 is unfinished, so the sink gets 1, then 2, and the counter stays 0.
async fn versions_read_out_of_order_in_one_batch(db: TestDb, mode: DispatchMode) {
    let agg = fresh_aggregate();
    let slot = ferry_core::slot_for(&agg);
    for v in [2, 1] {
        insert_intent(&db, &format!("e-{agg}-{v}"), &agg, v, slot, TOPIC).await;
    }
    let (sink, metrics, relay) = start(&db, mode);
    wait_handed(&sink, &agg, 2).await;
    relay.stop().await;
    let lines = logged(&agg);
    match mode {
        DispatchMode::Cursor => {
            assert_eq!(sink.versions_of(&agg), [2, 1]);
            assert_eq!(metrics.order_regressions.load(Ordering::Relaxed), 1);
            assert_eq!(exported(&metrics), Some(1.0));
            assert_eq!(lines.len(), 1, "{lines:?}");
            for field in ["sent_before=2 ", "sent_now=1 ", "same_batch=true "] {
                assert!(lines[0].contains(field), "{field:?} not in {:?}", lines[0]);
            }
        }
        DispatchMode::Row => {
            assert_eq!(sink.versions_of(&agg), [1, 2]);
            assert_eq!(metrics.order_regressions.load(Ordering::Relaxed), 0);
            assert_eq!(exported(&metrics), Some(0.0));
            assert_eq!(lines, Vec::<String>::new());
        }
    }
    db.cleanup().await;
}

ferry_testkit::backend_tests!(modes:
    a_version_committed_after_a_later_one_was_sent_is_counted,
    versions_read_out_of_order_in_one_batch,
);
