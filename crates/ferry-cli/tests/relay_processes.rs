//! Real `ferry relay` processes: graceful shutdown, two relays splitting the slots, SIGKILL
//! takeover, and fencing of a paused (stale) owner.
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::Command;
use std::time::Duration;

use ferry_core::{DispatchMode, NewEvent};
use ferry_testkit::embedded::EmbeddedKafka;
use ferry_testkit::{wait_until, RelayProcess, Stdout, TestDb};

const TOPIC: &str = "orders";

fn ev(agg: &str, v: i64) -> NewEvent {
    ferry_testkit::intent(TOPIC, agg, v)
}

fn spawn_relay(url: &str, sink: &[&str], owner: &str, mode: DispatchMode) -> RelayProcess {
    spawn_relay_stopping(url, sink, owner, mode, "5s")
}

/// [`spawn_relay`] with `--shutdown-timeout shutdown`.
fn spawn_relay_stopping(
    url: &str,
    sink: &[&str],
    owner: &str,
    mode: DispatchMode,
    shutdown: &str,
) -> RelayProcess {
    let log = std::env::temp_dir().join(format!("ferry-relay-{owner}-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
    cmd.args(["relay", "--database-url", url, "--owner", owner])
        .args([
            "--workers",
            "2",
            "--batch-size",
            "100",
            "--dispatch",
            mode.as_str(),
        ])
        .args([
            "--heartbeat",
            "200ms",
            "--slot-ttl",
            "1500ms",
            "--claim-lease",
            "4s",
        ])
        .args(["--poll-idle", "50ms", "--kafka-message-timeout", "3s"])
        .args(["--shutdown-timeout", shutdown, "--no-migrate"])
        .args(sink)
        .env("FERRY_LOG", "info");
    RelayProcess::spawn(cmd, log, Stdout::Piped).expect("spawn ferry relay")
}

/// `ferry status` on `url`: its exit code and what it printed.
fn ferry_status(url: &str) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["status", "--database-url", url])
        .output()
        .expect("run ferry status");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A sample from a relay's `/metrics`, scraped with the relay's own client; `None` while the
/// endpoint is not up or does not carry it.
async fn metric(relay: &RelayProcess, name: &str) -> Option<f64> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], relay.metrics_port()));
    let text = ferry_relay::metrics::scrape(addr, Duration::from_secs(5))
        .await
        .ok()?;
    ferry_relay::metrics::sample(&text, name)
}

/// Whether the relay's `/metrics` carries `name` at `min` or more.
async fn metric_at_least(relay: &RelayProcess, name: &str, min: f64) -> bool {
    metric(relay, name).await.unwrap_or(0.0) >= min
}

/// Sends SIGTERM and waits (at most `wait`) for the relay to exit, which it must within the
/// shutdown bound: 1 s of `--shutdown-timeout` + 10 s, and 3 s of slack.
fn assert_sigterm_exit_is_bounded(relay: &mut RelayProcess, wait: Duration) {
    let t = std::time::Instant::now();
    relay.signal(libc::SIGTERM);
    let code = relay.wait_exit(wait);
    let took = t.elapsed();
    assert!(
        code.is_some() && took <= Duration::from_secs(11 + 3),
        "exit {code:?} after {took:?} (bound: 1 s + 10 s)\nlog:\n{}",
        relay.tail(40)
    );
}

/// The relay's last `lines` log lines hold a WARN "sink stalled" naming `broker`.
fn assert_stall_warned(relay: &RelayProcess, lines: usize, broker: &str) {
    let log = relay.tail(lines);
    let warn = log.lines().find(|l| l.contains("sink stalled")).unwrap();
    assert!(warn.contains("WARN") && warn.contains(broker), "{warn}");
}

/// A probe's status code and body (`/healthz`, `/ready`); status 0 while the endpoint does not
/// answer (not listening yet).
async fn probe(relay: &RelayProcess, path: &str) -> (u16, String) {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], relay.metrics_port()));
    match ferry_relay::metrics::get(addr, path, Duration::from_secs(5)).await {
        Ok((s, body)) => (s.as_u16(), body),
        Err(e) => (0, e.to_string()),
    }
}

async fn owners(db: &TestDb) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for l in db.store.slot_leases().await.unwrap() {
        if l.lease_until > ferry_core::now_micros() - 5_000_000 {
            *m.entry(l.owner).or_default() += 1;
        }
    }
    m
}

async fn graceful_shutdown_releases_everything(db: TestDb, mode: DispatchMode) {
    db.store
        .enqueue(&[ev("a", 1), ev("a", 2), ev("b", 1)])
        .await
        .unwrap();
    let mut relay = spawn_relay(&db.url, &["--sink", "stdout"], "solo", mode);
    let mut out = BufReader::new(relay.take_stdout().unwrap());
    let mut lines = Vec::new();
    for _ in 0..3 {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        lines.push(serde_json::from_str::<serde_json::Value>(&l).unwrap());
    }
    let order: Vec<_> = lines
        .iter()
        .filter(|v| v["aggregate_id"] == "a")
        .map(|v| v["aggregate_version"].as_i64().unwrap())
        .collect();
    assert_eq!(
        order,
        vec![1, 2],
        "{lines:?}\nlog:\n{}",
        std::fs::read_to_string(relay.log()).unwrap_or_default()
    );
    wait_until("all SENT", Duration::from_secs(20), || async {
        db.store.status().await.unwrap().pending == 0
    })
    .await;
    wait_until("slots owned", Duration::from_secs(20), || async {
        owners(&db).await.get("solo") == Some(&256)
    })
    .await;
    wait_until("ready", Duration::from_secs(20), || async {
        probe(&relay, "/ready").await.0 == 200
    })
    .await;
    assert_eq!(probe(&relay, "/healthz").await, (200, "ok\n".into()));
    relay.signal(libc::SIGTERM);
    assert_eq!(relay.wait_exit(Duration::from_secs(20)), Some(0));
    let st = db.store.status().await.unwrap();
    assert_eq!((st.pending, st.claimed), (0, 0));
    assert!(
        db.store.slot_leases().await.unwrap().is_empty(),
        "slots released on shutdown"
    );
    db.cleanup().await;
}

async fn two_relays_split_slots_and_survive_sigkill(db: TestDb, mode: DispatchMode) {
    let (kafka, verifier) = EmbeddedKafka::verified(3, TOPIC, 8);
    let sink = [
        "--sink",
        "kafka",
        "--kafka-brokers",
        kafka.bootstrap_servers(),
    ];
    let mut a = spawn_relay(&db.url, &sink, "relay-a", mode);
    let b = spawn_relay(&db.url, &sink, "relay-b", mode);
    wait_until(
        "slots split between two relays",
        Duration::from_secs(30),
        || async {
            let o = owners(&db).await;
            o.len() == 2 && o.values().sum::<usize>() == 256 && o.values().all(|n| *n > 60)
        },
    )
    .await;
    let total = 200 * 10;
    for v in 1..=5 {
        let evs: Vec<NewEvent> = (0..200).map(|i| ev(&format!("agg-{i}"), v)).collect();
        db.store.enqueue(&evs).await.unwrap();
    }
    verifier
        .wait_until(Duration::from_secs(30), |r| r.delivered >= 300)
        .await;
    // kill A without warning, mid-stream, then keep producing
    a.signal(libc::SIGKILL);
    a.wait_exit(Duration::from_secs(10));
    for v in 6..=10 {
        let evs: Vec<NewEvent> = (0..200).map(|i| ev(&format!("agg-{i}"), v)).collect();
        db.store.enqueue(&evs).await.unwrap();
    }
    wait_until("B owns every slot", Duration::from_secs(30), || async {
        owners(&db).await.get("relay-b") == Some(&256)
    })
    .await;
    let r = verifier
        .wait_until(Duration::from_secs(90), |r| r.delivered >= total)
        .await;
    assert_eq!(
        r.delivered,
        total,
        "lost events: {r:?}\nB log:\n{}",
        std::fs::read_to_string(b.log()).unwrap_or_default()
    );
    assert_eq!(r.ordering_violations, 0, "{r:?}");
    db.wait_all_sent(Duration::from_secs(30)).await;
    db.cleanup().await;
}

async fn paused_owner_is_fenced(db: TestDb, mode: DispatchMode) {
    let a = spawn_relay(&db.url, &["--sink", "null"], "stale-a", mode);
    wait_until("A owns every slot", Duration::from_secs(20), || async {
        owners(&db).await.get("stale-a") == Some(&256)
    })
    .await;
    // pause A past its leases; B takes every slot over
    a.signal(libc::SIGSTOP);
    let b = spawn_relay(&db.url, &["--sink", "null"], "fresh-b", mode);
    wait_until("B owns every slot", Duration::from_secs(30), || async {
        owners(&db).await.get("fresh-b") == Some(&256)
    })
    .await;
    db.store.enqueue(&[ev("x", 1), ev("x", 2)]).await.unwrap();
    // resume A: its renewals of slots B now holds are refused (fenced) and counted
    a.signal(libc::SIGCONT);
    wait_until(
        "A's stale slot renewals fenced",
        Duration::from_secs(20),
        || async { metric(&a, "ferry_slot_fenced_total").await.unwrap_or(0.0) > 0.0 },
    )
    .await;
    wait_until("delivered", Duration::from_secs(20), || async {
        db.store.status().await.unwrap().pending == 0
    })
    .await;
    // A rejoins: the slots end up split between the two (slot leases hold one owner per slot,
    // so this shows the rebalance, not exclusivity, which the fenced renewals above show)
    wait_until("rebalanced", Duration::from_secs(30), || async {
        let o = owners(&db).await;
        o.values().sum::<usize>() == 256 && o.len() == 2
    })
    .await;
    drop(b);
    db.cleanup().await;
}

/// The relay's database sessions killed by the server again and again while it works
/// (PostgreSQL `pg_terminate_backend`, MariaDB `KILL`: a failover, an operator, a proxy cut),
/// some of them mid-transaction: the relay keeps running, retries, and once the killing stops
/// delivers every intent, each aggregate in version order.
async fn killed_sessions_are_survived(db: TestDb, mode: DispatchMode) {
    if db.backend == ferry_store::Backend::Sqlite {
        eprintln!("not applicable on SQLite: no server sessions to kill");
        db.cleanup().await;
        return;
    }
    // PostgreSQL: the relay's sessions carry an application name of their own
    let url = if db.backend == ferry_store::Backend::Postgres {
        format!("{}&application_name=ferry-killed", db.url)
    } else {
        db.url.clone()
    };
    let mut relay = spawn_relay(&url, &["--sink", "stdout"], "killed", mode);
    let seen: std::sync::Arc<std::sync::Mutex<Vec<(String, i64)>>> = Default::default();
    {
        let (out, seen) = (relay.take_stdout().unwrap(), seen.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                seen.lock().unwrap().push((
                    v["aggregate_id"].as_str().unwrap().to_string(),
                    v["aggregate_version"].as_i64().unwrap(),
                ));
            }
        });
    }
    wait_until("slots owned", Duration::from_secs(30), || async {
        owners(&db).await.get("killed") == Some(&256)
    })
    .await;
    // the killer's statement: every session of the relay (MariaDB: every other session on the
    // test database, the test's own pool included, which reconnects)
    let kill = if db.backend == ferry_store::Backend::Postgres {
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = 'ferry-killed' AND pid <> pg_backend_pid()"
            .to_string()
    } else {
        String::new()
    };
    let aggs = 20;
    let mut killed = 0u64;
    for v in 1..=10i64 {
        let evs: Vec<NewEvent> = (0..aggs).map(|i| ev(&format!("k-{i}"), v)).collect();
        // the test's own connections may be among the killed ones: retry the enqueue
        let mut tries = 0;
        while let Err(e) = db.store.enqueue(&evs).await {
            tries += 1;
            assert!(tries < 20, "enqueue keeps failing: {e}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        killed += if db.backend == ferry_store::Backend::Postgres {
            db.scalar(&kill).await.unwrap_or(0) as u64
        } else {
            db.kill_other_sessions().await.expect("kill the sessions")
        };
    }
    assert!(killed > 0, "no relay session was killed");
    assert!(
        relay.try_exited().is_none(),
        "the relay must survive killed sessions:\n{}",
        relay.tail(60)
    );
    let total = (aggs * 10) as usize;
    let distinct = || {
        seen.lock()
            .unwrap()
            .iter()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    wait_until(
        "every intent delivered",
        Duration::from_secs(60),
        || async { distinct() == total },
    )
    .await;
    // per aggregate, no version is delivered for the first time before its predecessor
    let mut first: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut delivered = std::collections::BTreeSet::new();
    for (a, v) in seen.lock().unwrap().iter() {
        if delivered.insert((a.clone(), *v)) {
            first.entry(a.clone()).or_default().push(*v);
        }
    }
    for (a, vs) in &first {
        assert_eq!(vs, &(1..=10).collect::<Vec<_>>(), "aggregate {a}");
    }
    db.wait_all_sent(Duration::from_secs(30)).await;
    relay.signal(libc::SIGTERM);
    assert_eq!(
        relay.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        relay.tail(40)
    );
    eprintln!("{killed} relay sessions killed");
    db.cleanup().await;
}

ferry_testkit::backend_tests!(modes:
    graceful_shutdown_releases_everything,
    two_relays_split_slots_and_survive_sigkill,
    killed_sessions_are_survived
);

// A SIGSTOPped SQLite writer may hold the single write lock, and no server times it out: the
// paused-owner scenario is only meaningful on PostgreSQL and MariaDB (whose sessions abort after
// 10 s idle in a transaction, releasing the stalled owner's locks).
/// `paused_owner_is_fenced` on `backend`, in row and cursor dispatch.
macro_rules! paused_owner_tests {
    ($backend:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn paused_owner_is_fenced() {
            super::paused_on(ferry_store::Backend::$backend, super::DispatchMode::Row).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn paused_owner_is_fenced_cursor() {
            super::paused_on(ferry_store::Backend::$backend, super::DispatchMode::Cursor).await;
        }
    };
}

async fn paused_on(backend: ferry_store::Backend, mode: DispatchMode) {
    if let Some(db) = TestDb::open(backend).await {
        paused_owner_is_fenced(db, mode).await;
    }
}

mod postgres_paused {
    paused_owner_tests!(Postgres);
}
mod mysql_paused {
    paused_owner_tests!(Mysql);
    /// Starts relay B (cursor dispatch), enqueues two intents of `agg` and waits until B has
    /// delivered them. B needs the stale ticker to stay silent for 30 s before it replaces it
    /// (and, behind a stopped relay, that relay's slot leases to expire); alone this takes ~31 s,
    /// but in CI beside every other suite one run took longer than 90 s, so the bound leaves room
    /// for a loaded machine.
    async fn b_delivers(db: &ferry_testkit::TestDb, agg: &str) -> ferry_testkit::RelayProcess {
        let b = super::spawn_relay(
            &db.url,
            &["--sink", "null"],
            "fresh-b",
            ferry_core::DispatchMode::Cursor,
        );
        db.store
            .enqueue(&[super::ev(agg, 1), super::ev(agg, 2)])
            .await
            .unwrap();
        super::wait_until(
            "delivered by B",
            std::time::Duration::from_secs(180),
            || async { db.store.status().await.unwrap().pending == 0 },
        )
        .await;
        b
    }
    /// A relay stopped for good while it ticks the commit-gate horizon keeps its connection and
    /// the election lock, outside any transaction the server would end: another relay ends that
    /// session once the horizon is 30 s stale, takes over the ticking and delivers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn stopped_ticker_is_replaced() {
        use std::time::Duration;
        let Some(db) = ferry_testkit::TestDb::open(ferry_store::Backend::Mysql).await else {
            return;
        };
        let a = super::spawn_relay(
            &db.url,
            &["--sink", "null"],
            "ticker-a",
            ferry_core::DispatchMode::Cursor,
        );
        super::wait_until("A owns every slot", Duration::from_secs(20), || async {
            super::owners(&db).await.get("ticker-a") == Some(&256)
        })
        .await;
        a.signal(libc::SIGSTOP);
        let b = b_delivers(&db, "t").await;
        a.signal(libc::SIGCONT);
        drop(a);
        drop(b);
        db.cleanup().await;
    }
    /// A session that won the ticker election and stopped before it registered in
    /// `ferry_gate_horizon` (so it never ticked at all) is replaced too: a relay that has seen it hold
    /// the lock unregistered for 30 s ends that session and delivers. (A relay stopped in exactly
    /// this window would otherwise leave the relay beside it waiting for ever.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn unregistered_ticker_is_replaced() {
        use sqlx::{Connection, Executor};
        let Some(db) = ferry_testkit::TestDb::open(ferry_store::Backend::Mysql).await else {
            return;
        };
        let mut squatter = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
        let won: Option<i64> =
            sqlx::query_scalar("SELECT GET_LOCK(CONCAT('ferry_ticker:', DATABASE()), 0)")
                .fetch_one(&mut squatter)
                .await
                .unwrap();
        assert_eq!(won, Some(1), "the squatter holds the election lock");
        let b = b_delivers(&db, "u").await;
        assert!(
            squatter.execute("SELECT 1").await.is_err(),
            "B ended the squatter's session"
        );
        drop(b);
        db.cleanup().await;
    }
}

/// The alert level on a relay's metrics endpoint follows the thresholds it was started with:
/// an intent the broker never takes (no broker listens) turns it to warning past
/// `--oldest-warning`, then to critical past `--oldest-critical`; the SLO gauges are exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn alert_level_follows_the_oldest_intent() {
    let db = TestDb::sqlite().await;
    // Port 1: nothing listens there and no test's mock cluster can take it (they bind ephemeral
    // ports). A free port found now could be taken by another test's mock cluster while this
    // relay still retries it: the "stuck" event was then delivered there, so this test never
    // saw its warning and the other test saw one event too many.
    let dead_broker = "127.0.0.1:1".to_string();
    let a = spawn_relay(
        &db.url,
        &[
            "--sink",
            "kafka",
            "--kafka-brokers",
            &dead_broker,
            "--oldest-warning",
            "2s",
            "--oldest-critical",
            "8s",
        ],
        "alerting",
        DispatchMode::Cursor,
    );
    wait_until("endpoint up, level 0", Duration::from_secs(20), || async {
        metric(&a, "ferry_alert_level").await == Some(0.0)
    })
    .await;
    for (name, value) in [
        ("ferry_publish_within_slo_ratio", 1.0),
        ("ferry_alert_oldest_warning_seconds", 2.0),
        ("ferry_alert_oldest_critical_seconds", 8.0),
        ("ferry_publish_slo_target_seconds", 30.0),
    ] {
        assert_eq!(metric(&a, name).await, Some(value), "{name}");
    }
    db.store.enqueue(&[ev("stuck", 1)]).await.unwrap();
    wait_until("warning", Duration::from_secs(30), || async {
        metric(&a, "ferry_alert_level").await == Some(1.0)
    })
    .await;
    wait_until("critical", Duration::from_secs(30), || async {
        metric(&a, "ferry_alert_level").await == Some(2.0)
    })
    .await;
    drop(a);
    db.cleanup().await;
}

/// `[relay] retention` in the file (and `--retention-batch` on the command line) reach the
/// relay: it deletes the rows it sent once older than the window, and counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_runs_retention_from_its_configuration() {
    let db = TestDb::sqlite().await;
    let cfg = std::env::temp_dir().join(format!("ferry-retention-{}.toml", std::process::id()));
    std::fs::write(&cfg, "[relay]\nretention = \"1s\"\n").unwrap();
    let a = spawn_relay(
        &db.url,
        &[
            "--sink",
            "null",
            "--config",
            cfg.to_str().unwrap(),
            "--retention-batch",
            "2",
        ],
        "retention",
        DispatchMode::Cursor,
    );
    let evs: Vec<_> = (1..=5).map(|v| ev("kept-then-purged", v)).collect();
    db.store.enqueue(&evs).await.unwrap();
    wait_until(
        "5 rows purged by the relay",
        Duration::from_secs(30),
        || async { metric_at_least(&a, "ferry_retention_purged_total", 5.0).await },
    )
    .await;
    assert_eq!(db.count("ferry_outbox").await, 0, "{}", a.tail(20));
    assert_eq!(
        metric(&a, "ferry_retention_failed_runs_total").await,
        Some(0.0)
    );
    // every run is in the histogram of run lengths
    let runs = metric(&a, "ferry_retention_runs_total").await.unwrap();
    let timed = metric(&a, "ferry_retention_run_seconds_count")
        .await
        .unwrap();
    assert!(runs >= 1.0 && timed >= runs, "{runs} runs, {timed} timed");
    assert!(a.tail(40).contains("retention on"), "{}", a.tail(40));
    drop(a);
    let _ = std::fs::remove_file(&cfg);
    db.cleanup().await;
}

/// A Kafka "broker" that accepts connections and never answers (a hung process, a black-holed
/// route): the worst case for a shutdown, since the producer's requests neither complete nor
/// fail. Connections are held open until the process ends.
fn silent_broker() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            held.push(s);
        }
    });
    addr
}

/// Starts a relay (cursor dispatch) whose broker never answers, with intents in flight to it,
/// and waits until it owns every slot and has read them.
async fn relay_stuck_on_a_silent_broker(
    db: &TestDb,
    owner: &str,
    shutdown: &str,
) -> (RelayProcess, String) {
    let broker = silent_broker();
    db.store
        .enqueue(&[ev("held", 1), ev("held", 2), ev("other", 1)])
        .await
        .unwrap();
    let relay = spawn_relay_stopping(
        &db.url,
        &[
            "--sink",
            "kafka",
            "--kafka-brokers",
            &broker,
            "--sink-stall",
            "2s",
        ],
        owner,
        DispatchMode::Cursor,
        shutdown,
    );
    wait_until("slots owned", Duration::from_secs(20), || async {
        owners(db).await.get(owner) == Some(&256)
    })
    .await;
    wait_until(
        "intents read and handed to the sink",
        Duration::from_secs(20),
        || metric_at_least(&relay, "ferry_sink_in_flight_events", 3.0),
    )
    .await;
    (relay, broker)
}

/// SIGTERM ends the relay within `--shutdown-timeout` + 10 s however the broker behaves, and
/// what the broker never confirmed stays unsent. (Before the shutdown watchdog, a relay in this
/// state was still running 15 s after SIGTERM.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_is_bounded_when_the_broker_never_answers() {
    let db = TestDb::sqlite().await;
    let (mut relay, broker) = relay_stuck_on_a_silent_broker(&db, "stuck", "1s").await;
    // the stall is seen: metric, alert level, and a WARN naming the broker
    wait_until("stall reported", Duration::from_secs(20), || async {
        metric_at_least(&relay, "ferry_sink_unacked_seconds", 2.0).await
            && metric(&relay, "ferry_alert_level").await == Some(1.0)
            && relay.tail(200).contains("sink stalled")
    })
    .await;
    assert_stall_warned(&relay, 200, &broker);
    // `ferry status` shows it for that relay (from its membership heartbeat), as a WARNING
    let (code, out) = wait_for_status_line(&db.url, "stuck: sink stalled for").await;
    assert_eq!(code, Some(4), "{out}");
    assert!(
        out.contains("relay stuck: its sink has had no ack for"),
        "{out}"
    );
    // alive, not ready
    assert_eq!(probe(&relay, "/healthz").await.0, 200);
    let (s, body) = probe(&relay, "/ready").await;
    assert_eq!(s, 503);
    assert!(body.contains("sink stalled"), "{body}");
    assert_sigterm_exit_is_bounded(&mut relay, Duration::from_secs(30));
    let st = db.store.status().await.unwrap();
    assert_eq!(
        st.pending, 3,
        "nothing was confirmed, nothing is marked sent"
    );
    db.cleanup().await;
}

/// The bound holds where the Kafka client would wait longer than it: a message timeout as long
/// as the relay accepts below a 40 s claim lease (30 s) and a 1 s shutdown timeout, with
/// events in flight to a broker that never answers. The process exits by 1 s + 10 s (130: the
/// drain was cut short), not when the client gives up on its messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_is_bounded_when_the_client_would_wait_longer() {
    let db = TestDb::sqlite().await;
    let broker = silent_broker();
    db.store
        .enqueue(&[ev("held", 1), ev("other", 1)])
        .await
        .unwrap();
    let log = std::env::temp_dir().join(format!("ferry-relay-patient-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
    cmd.args(["relay", "--database-url", &db.url, "--owner", "patient"])
        .args(["--sink", "kafka", "--kafka-brokers", &broker])
        .args(["--claim-lease", "40s", "--kafka-message-timeout", "30s"])
        .args([
            "--heartbeat",
            "200ms",
            "--slot-ttl",
            "1500ms",
            "--poll-idle",
            "50ms",
        ])
        .args(["--shutdown-timeout", "1s", "--no-migrate"])
        .env("FERRY_LOG", "info");
    let mut relay = RelayProcess::spawn(cmd, log, Stdout::Piped).expect("spawn ferry relay");
    wait_until("in flight", Duration::from_secs(20), || {
        metric_at_least(&relay, "ferry_sink_in_flight_events", 2.0)
    })
    .await;
    assert_sigterm_exit_is_bounded(&mut relay, Duration::from_secs(60));
    assert_eq!(
        db.store.status().await.unwrap().pending,
        2,
        "nothing confirmed, nothing sent"
    );
    db.cleanup().await;
}

/// Runs `ferry status` until its output has `line` (20 s at most).
async fn wait_for_status_line(url: &str, line: &str) -> (Option<i32>, String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (code, out) = ferry_status(url);
        if out.contains(line) || std::time::Instant::now() > deadline {
            return (code, out);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A second SIGTERM (or SIGINT) during the drain exits at once, with 130.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_signal_exits_at_once() {
    let db = TestDb::sqlite().await;
    let (mut relay, _) = relay_stuck_on_a_silent_broker(&db, "impatient", "60s").await;
    relay.signal(libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        relay.try_exited().is_none(),
        "still draining: the broker never answers"
    );
    let t = std::time::Instant::now();
    relay.signal(libc::SIGINT);
    let code = relay.wait_exit(Duration::from_secs(20));
    assert_eq!(code, Some(130), "log:\n{}", relay.tail(40));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(db.store.status().await.unwrap().pending, 3);
    db.cleanup().await;
}

/// A first start on a new database (which starts in row dispatch) sets it to cursor dispatch
/// without a warning: a WARN for normal operation teaches operators to ignore warnings. (It
/// logged `WARN converted the outbox to cursor dispatch` before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_first_start_logs_no_warning() {
    let db = TestDb::sqlite().await;
    let mut relay = spawn_relay(&db.url, &["--sink", "null"], "first", DispatchMode::Cursor);
    wait_until("ready", Duration::from_secs(20), || async {
        probe(&relay, "/ready").await.0 == 200
    })
    .await;
    db.store.enqueue(&[ev("a", 1)]).await.unwrap();
    wait_until("delivered", Duration::from_secs(20), || async {
        db.store.status().await.unwrap().pending == 0
    })
    .await;
    relay.signal(libc::SIGTERM);
    assert_eq!(relay.wait_exit(Duration::from_secs(30)), Some(0));
    let log = std::fs::read_to_string(relay.log()).unwrap();
    assert!(log.contains("outbox set to cursor dispatch"), "{log}");
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains("ERROR"))
        .collect();
    assert!(warnings.is_empty(), "{warnings:#?}");
    db.cleanup().await;
}

/// A tansu broker of this test's own (`FERRY_TEST_TANSU_BIN`, which CI sets), so it can be
/// stopped (SIGSTOP) without touching the other tests' broker. `None`: skipped (a failure under
/// `FERRY_REQUIRE_KAFKA=1`).
struct OwnTansu {
    child: std::process::Child,
    brokers: String,
}

impl OwnTansu {
    async fn start() -> Option<Self> {
        let Ok(bin) = std::env::var("FERRY_TEST_TANSU_BIN") else {
            assert!(
                std::env::var("FERRY_REQUIRE_KAFKA").as_deref() != Ok("1"),
                "FERRY_REQUIRE_KAFKA=1 but FERRY_TEST_TANSU_BIN is not set"
            );
            println!("skipped: FERRY_TEST_TANSU_BIN is not set (no external broker to stop)");
            return None;
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(bin)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start tansu");
        let brokers = format!("127.0.0.1:{port}");
        wait_until("tansu listening", Duration::from_secs(20), || async {
            std::net::TcpStream::connect(&brokers).is_ok()
        })
        .await;
        Some(Self { child, brokers })
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for OwnTansu {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Against a real Kafka-protocol broker (tansu) that stops answering (SIGSTOP): the relay logs
/// `sink stalled` at WARN naming the broker and exports the stall within a minute, `ferry
/// status` shows it; once the broker answers again everything is delivered; a relay told to stop
/// during a stall exits within its bound (shutdown timeout + 10 s), and the next one delivers
/// what it left unsent. A consumer on the broker sees every intent (duplicates allowed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_real_broker_that_stops_answering_is_seen_and_survived() {
    let Some(tansu) = OwnTansu::start().await else {
        return;
    };
    let b = tansu.brokers.clone();
    let topic = format!("ferry-stall-{}", std::process::id());
    ferry_testkit::kafka::create_topic(&b, &[], &topic, 2, 1)
        .await
        .expect("create topic");
    let verifier = ferry_testkit::verify::Verifier::start(&b, &topic, 2).expect("verifier");
    let db = TestDb::sqlite().await;
    let batch = |from: i64, n: i64| -> Vec<NewEvent> {
        (from..from + n)
            .map(|i| ferry_testkit::intent(&topic, &format!("agg-{}", i % 7), i / 7 + 1))
            .collect()
    };
    // versions per aggregate must stay consecutive: ids 0.. in order, 7 aggregates
    db.store.enqueue(&batch(0, 70)).await.unwrap();
    let args = [
        "--sink",
        "kafka",
        "--kafka-brokers",
        &b,
        "--sink-stall",
        "5s",
    ];
    let mut relay = spawn_relay_stopping(&db.url, &args, "stall-a", DispatchMode::Cursor, "1s");
    db.wait_all_sent(Duration::from_secs(60)).await;
    // the broker stops answering
    tansu.signal(libc::SIGSTOP);
    db.store.enqueue(&batch(70, 70)).await.unwrap();
    wait_until("stall seen", Duration::from_secs(60), || async {
        metric_at_least(&relay, "ferry_sink_unacked_seconds", 5.0).await
            && relay.tail(300).contains("sink stalled")
    })
    .await;
    assert_stall_warned(&relay, 300, &b);
    let (code, out) = wait_for_status_line(&db.url, "stall-a: sink stalled for").await;
    assert_eq!(code, Some(4), "{out}");
    // it answers again: everything goes out
    tansu.signal(libc::SIGCONT);
    db.wait_all_sent(Duration::from_secs(90)).await;
    wait_until("recovery logged", Duration::from_secs(30), || async {
        relay.tail(300).contains("sink answering again")
    })
    .await;
    // a stop during a stall ends within the bound; the next relay sends what it left
    tansu.signal(libc::SIGSTOP);
    db.store.enqueue(&batch(140, 70)).await.unwrap();
    wait_until("stalled again", Duration::from_secs(60), || {
        metric_at_least(&relay, "ferry_sink_unacked_seconds", 5.0)
    })
    .await;
    assert_sigterm_exit_is_bounded(&mut relay, Duration::from_secs(40));
    tansu.signal(libc::SIGCONT);
    let relay = spawn_relay(&db.url, &args, "stall-b", DispatchMode::Cursor);
    db.wait_all_sent(Duration::from_secs(90)).await;
    let r = verifier
        .wait_until(Duration::from_secs(60), |r| r.delivered >= 210)
        .await;
    assert_eq!((r.delivered, r.ordering_violations), (210, 0), "{r:?}");
    drop(relay);
    db.cleanup().await;
}
