//! The four crash windows (docs/operations.md, "Crash windows"), with real processes: a
//! failpoint stops `ferry` at exactly the window, the test SIGKILLs it, then checks the durable
//! state the table predicts and that recovery delivers with no loss (a duplicate only where the
//! table says so).
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferry_core::{DispatchMode, EventState};
use ferry_testkit::embedded::EmbeddedKafka;
use ferry_testkit::verify::{read_records, Verifier, VerifyReport};
use ferry_testkit::TestDb;

const TOPIC: &str = "orders";
const EVENT: &str = r#"{"event_id":"e-7-1","aggregate_id":"order-7","aggregate_version":1,"topic":"orders","event_type":"OrderCreated","payload":"{\"orderId\":7}"}"#;

struct Proc {
    child: Child,
    marker: mpsc::Receiver<String>,
}

fn ferry(args: &[&str], failpoint: Option<&str>) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
    cmd.args(args)
        .env("FERRY_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    match failpoint {
        Some(f) => cmd.env("FERRY_FAILPOINT", f),
        None => cmd.env_remove("FERRY_FAILPOINT"),
    };
    let mut child = cmd.spawn().expect("spawn ferry");
    let (tx, marker) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    Proc { child, marker }
}

impl Proc {
    /// Waits for the failpoint marker, then SIGKILLs the process.
    fn kill_at(mut self, failpoint: &str) {
        let want = format!("FERRY_FAILPOINT {failpoint} reached");
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.marker.recv_timeout(left) {
                Ok(l) if l.contains(&want) => break,
                Ok(l) => seen.push(l),
                Err(_) => panic!("failpoint {failpoint} not reached; stderr: {seen:#?}"),
            }
        }
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGKILL);
        }
        let status = self.child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
    }
    fn wait_ok(mut self) {
        let s = self.child.wait().unwrap();
        let lines: Vec<String> = self.marker.try_iter().collect();
        assert!(s.success(), "ferry failed: {lines:#?}");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The mock cluster and a verifier on its topic.
fn kafka() -> (EmbeddedKafka, Verifier) {
    EmbeddedKafka::verified(1, TOPIC, 2)
}

/// `ferry enqueue` of [`EVENT`], stopping at `failpoint` if given.
fn enqueue(db: &TestDb, failpoint: Option<&str>) -> Proc {
    ferry(
        &["enqueue", "--database-url", &db.url, "--event", EVENT],
        failpoint,
    )
}

/// `ferry relay` as `owner` to the mock cluster `k`, stopping at `failpoint` if given.
fn relay(
    db: &TestDb,
    k: &EmbeddedKafka,
    owner: &str,
    mode: DispatchMode,
    failpoint: Option<&str>,
) -> Proc {
    let args: &[&str] = &[
        "relay",
        "--dispatch",
        mode.as_str(),
        "--database-url",
        &db.url,
        "--owner",
        owner,
        "--sink",
        "kafka",
        "--kafka-brokers",
        k.bootstrap_servers(),
        "--heartbeat",
        "200ms",
        "--slot-ttl",
        "1s",
        "--claim-lease",
        "2s",
        "--kafka-message-timeout",
        "1s",
        "--poll-idle",
        "50ms",
        "--metrics-listen",
        "off",
        "--no-migrate",
    ];
    ferry(args, failpoint)
}

/// Waits until the verifier saw `pred` hold (or 30 s passed); the report.
async fn delivered(v: &Verifier, pred: impl Fn(&VerifyReport) -> bool) -> VerifyReport {
    v.wait_until(Duration::from_secs(30), pred).await
}

/// Messages the broker holds in the topic (high minus low watermark, summed over its two
/// partitions): an exact count, independent of how far the verifier has read.
fn on_broker(k: &EmbeddedKafka) -> i64 {
    ferry_testkit::kafka::watermarks(k.bootstrap_servers(), TOPIC, 2)
        .expect("topic watermarks")
        .iter()
        .map(|(lo, hi)| hi - lo)
        .sum()
}

async fn state_of(db: &TestDb) -> Option<(EventState, i64)> {
    db.store
        .record("e-7-1")
        .await
        .unwrap()
        .map(|r| (r.state, r.claim_version))
}

async fn wait_state(db: &TestDb, want: EventState) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((s, v)) = state_of(db).await {
            if s == want {
                return v;
            }
        }
        assert!(
            Instant::now() < deadline,
            "e-7-1 never reached {want:?}: {:?}",
            state_of(db).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The claim version a row reaches after `n` row-mode claims; cursor dispatch never claims a
/// row that is sent on the first try.
fn terms(mode: DispatchMode, n: i64) -> i64 {
    match mode {
        DispatchMode::Row => n,
        DispatchMode::Cursor => 0,
    }
}

/// The durable state between a send and its outcome: CLAIMED under term 1 in row dispatch;
/// in cursor dispatch nothing was written (PENDING, the cursor has not moved past it).
fn claimed_state(mode: DispatchMode) -> (EventState, i64) {
    match mode {
        DispatchMode::Row => (EventState::Claimed, 1),
        DispatchMode::Cursor => (EventState::Pending, 0),
    }
}

/// The intent committed, a relay dies at the crash point `point` of its delivery: the row is
/// left as between a send and its outcome ([`claimed_state`]).
async fn relay_dies_at(db: &TestDb, k: &EmbeddedKafka, mode: DispatchMode, point: &str) {
    enqueue(db, None).wait_ok();
    relay(db, k, "dying", mode, Some(point)).kill_at(point);
    assert_eq!(state_of(db).await, Some(claimed_state(mode)));
}

/// Window 1: dies before the business commit → neither intent nor anything to deliver; the
/// client re-submits with the same identity.
async fn dies_before_commit(db: TestDb, mode: DispatchMode) {
    let (k, v) = kafka();
    enqueue(&db, Some("enqueue-before-commit")).kill_at("enqueue-before-commit");
    assert_eq!(
        state_of(&db).await,
        None,
        "an uncommitted intent must not exist"
    );
    assert_eq!(db.count("ferry_outbox").await, 0);
    enqueue(&db, None).wait_ok();
    let _relay = relay(&db, &k, "r1", mode, None);
    let r = delivered(&v, |r| r.delivered >= 1).await;
    wait_state(&db, EventState::Sent).await;
    assert_eq!((r.delivered, r.duplicates), (1, 0), "{r:?}");
    assert_eq!(on_broker(&k), 1, "sent once");
    db.cleanup().await;
}

/// Window 2: dies after commit, before any claim → PENDING survives; a relay delivers it.
async fn dies_after_commit_before_claim(db: TestDb, mode: DispatchMode) {
    let (k, v) = kafka();
    enqueue(&db, Some("enqueue-after-commit")).kill_at("enqueue-after-commit");
    assert_eq!(state_of(&db).await, Some((EventState::Pending, 0)));
    let _relay = relay(&db, &k, "r1", mode, None);
    // row dispatch claimed it once; cursor dispatch wrote no claim at all
    assert_eq!(wait_state(&db, EventState::Sent).await, terms(mode, 1));
    let r = delivered(&v, |r| r.delivered >= 1).await;
    assert_eq!((r.delivered, r.duplicates), (1, 0), "{r:?}");
    assert_eq!(on_broker(&k), 1, "sent once");
    db.cleanup().await;
}

/// Window 3: dies after the claim, before the broker ack → CLAIMED, nothing sent; after the
/// lease another relay resends with the same event id.
async fn dies_after_claim_before_ack(db: TestDb, mode: DispatchMode) {
    let (k, v) = kafka();
    // row: CLAIMED under term 1; cursor: nothing written, the cursor has not moved
    relay_dies_at(&db, &k, mode, "relay-after-claim").await;
    assert_eq!(
        on_broker(&k),
        0,
        "nothing reached the broker before the crash"
    );
    let _relay = relay(&db, &k, "survivor", mode, None);
    assert_eq!(
        wait_state(&db, EventState::Sent).await,
        terms(mode, 2),
        "taken over under a new claim term (row) / from the durable cursor (cursor)"
    );
    let r = delivered(&v, |r| r.delivered >= 1).await;
    assert_eq!((r.delivered, r.duplicates), (1, 0), "{r:?}");
    assert!(v.was_delivered("e-7-1"));
    assert_eq!(on_broker(&k), 1, "sent once, by the survivor");
    db.cleanup().await;
}

/// Window 4: dies after the broker ack, before SENT commits → the message exists but the row is
/// still CLAIMED; the resend is a duplicate that the consumer dedupes by event id.
async fn dies_after_ack_before_sent(db: TestDb, mode: DispatchMode) {
    let (k, v) = kafka();
    relay_dies_at(&db, &k, mode, "relay-after-ack").await;
    assert_eq!(on_broker(&k), 1, "the broker had acked it before the crash");
    let r = delivered(&v, |r| r.delivered >= 1).await;
    assert_eq!(r.delivered, 1, "the broker had acked it: {r:?}");
    let _relay = relay(&db, &k, "survivor", mode, None);
    assert_eq!(wait_state(&db, EventState::Sent).await, terms(mode, 2));
    let r = delivered(&v, |r| r.duplicates >= 1).await;
    assert_eq!(
        (r.delivered, r.duplicates),
        (1, 1),
        "one event, delivered twice, deduped by id: {r:?}"
    );
    assert_eq!(on_broker(&k), 2, "the original and the one resend");
    // The consumer side: both deliveries go through the Inbox (Inbox + effect in one
    // transaction, in the outbox's own database); the effect is applied once.
    let effects = apply_through_inbox(&db, k.bootstrap_servers(), 2).await;
    assert_eq!(effects, (1, 1), "(new, duplicate) verdicts");
    assert_eq!(
        db.scalar("SELECT applied FROM crash_effects WHERE id = 1")
            .await
            .unwrap(),
        1
    );
    db.cleanup().await;
}

/// Reads `expect` messages from the topic and applies each through the Inbox with a counter
/// effect; returns the (New, Duplicate) verdict counts.
async fn apply_through_inbox(db: &TestDb, brokers: &str, expect: usize) -> (usize, usize) {
    db.exec("CREATE TABLE crash_effects (id BIGINT PRIMARY KEY, applied BIGINT NOT NULL)")
        .await
        .unwrap();
    db.exec("INSERT INTO crash_effects VALUES (1, 0)")
        .await
        .unwrap();
    let messages = read_records(
        brokers,
        TOPIC,
        2,
        expect,
        Duration::from_secs(30),
        Duration::ZERO,
    )
    .await
    .unwrap();
    assert_eq!(messages.len(), expect, "deliveries at the broker");
    let inbox = ferry_inbox::Inbox::connect(&db.url, ferry_inbox::InboxConfig::default())
        .await
        .unwrap();
    let (mut new, mut dup) = (0, 0);
    for m in &messages {
        let d = ferry_inbox::Delivery::from_headers("crash-consumer", m.header_pairs()).unwrap();
        let verdict = inbox
            .apply_once(&d, |conn, _| {
                Box::pin(async move {
                    let sql = "UPDATE crash_effects SET applied = applied + 1 WHERE id = 1";
                    ferry_testkit::on_inbox!(Conn, conn, c => sqlx::query(sql).execute(c).await.map(drop))?;
                    Ok(())
                })
            })
            .await
            .unwrap();
        match verdict {
            ferry_inbox::Verdict::New => new += 1,
            ferry_inbox::Verdict::Duplicate => dup += 1,
            other => panic!("unexpected verdict {other:?}"),
        }
    }
    (new, dup)
}

ferry_testkit::backend_tests!(modes:
    dies_before_commit,
    dies_after_commit_before_claim,
    dies_after_claim_before_ack,
    dies_after_ack_before_sent
);
