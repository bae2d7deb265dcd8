//! Every bad input to `ferry` gets one clear line naming the key and what is accepted; no
//! password is ever printed.
use std::process::Command;

mod support;
use support::{assert_ok, assert_one_clear_line, ferry, ferry_on, printed};

/// A SQLite URL in a fresh directory; the file does not exist yet.
fn sqlite_url() -> (ferry_store_dir::Dir, String) {
    let d = ferry_store_dir::Dir::new();
    let url = format!("sqlite://{}/cli.db", d.0.display());
    (d, url)
}

/// [`sqlite_url`], its outbox created by `ferry migrate` (no other command creates a file).
fn migrated_sqlite_url() -> (ferry_store_dir::Dir, String) {
    let (d, url) = sqlite_url();
    let o = ferry(&["migrate", "--database-url", &url]);
    assert!(o.status.success(), "{}", printed(&o));
    (d, url)
}

mod ferry_store_dir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Self {
            let p = std::env::temp_dir().join(format!(
                "ferry-cli-{}-{}",
                std::process::id(),
                rand_suffix()
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn rand_suffix() -> u128 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    }
}

/// `ferry status --database-url url` exits `code`; what it printed.
#[track_caller]
fn status_exits(url: &str, code: i32) -> String {
    let o = ferry(&["status", "--database-url", url]);
    let text = printed(&o);
    assert_eq!(o.status.code(), Some(code), "{text}");
    text
}

/// `ferry relay --database-url <a fresh SQLite file> FLAG VALUE` exits 2 with `needles` on its
/// first line, for each `(FLAG, VALUE, needles)`.
fn relay_refuses(cases: &[(&str, &str, &[&str])]) {
    let (_d, url) = migrated_sqlite_url();
    for (flag, value, needles) in cases {
        let o = ferry(&["relay", "--database-url", &url, flag, value]);
        assert_one_clear_line(&o, 2, needles);
    }
}

#[test]
fn relay_values_out_of_range_name_the_key() {
    relay_refuses(&[
        ("--batch-size", "0", &["batch_size", "between 1 and 10000"]),
        ("--workers", "300", &["workers", "between 1 and 256"]),
        ("--in-flight", "0", &["max_in_flight"]),
        // too large to be meant: refused before any deadline arithmetic could overflow
        (
            "--heartbeat",
            "9300000000000000000s",
            &["heartbeat", "at most 7d"],
        ),
        ("--slot-ttl", "8d", &["slot_ttl", "at most 7d"]),
        ("--retention", "0", &["retention", "longer than 0"]),
        ("--retention", "3651d", &["retention", "at most 3650d"]),
        (
            "--retention-batch",
            "10",
            &["--retention-batch", "need", "--retention"],
        ),
        ("--kafka-linger", "16m", &["sink.linger", "at most 15m"]),
        (
            "--kafka-message-timeout",
            "90s",
            &["sink.message_timeout", "claim_lease"],
        ),
    ]);
}

#[test]
fn unparsable_values_name_the_flag() {
    relay_refuses(&[
        ("--workers", "abc", &["--workers"]),
        (
            "--claim-lease",
            "5x",
            &["relay.claim_lease", "unknown unit"],
        ),
        ("--claim-lease", "1e30s", &["relay.claim_lease"]),
        ("--heartbeat", "10", &["relay.heartbeat", "no unit"]),
        (
            "--retention",
            "7 days",
            &["relay.retention", "unknown unit"],
        ),
        ("--sink", "kafkaa", &["sink.kind", "kafka, stdout or null"]),
        (
            "--metrics-listen",
            "everywhere",
            &["metrics.listen", "host:port"],
        ),
        (
            "--kafka-property",
            "novalue",
            &["--kafka-property", "KEY=VALUE"],
        ),
    ]);
}

#[test]
fn config_file_errors_name_the_key() {
    let d = ferry_store_dir::Dir::new();
    let cfg = d.0.join("ferry.toml");
    let cases: [(&str, &[&str]); 5] = [
        (
            "database_url = \"sqlite://x.db\"\n[relay]\nbatchsize = 5\n",
            &["batchsize", "ferry.toml"],
        ),
        (
            "database_url = \"sqlite://x.db\"\n[relay]\nslot_ttl = \"fast\"\n",
            &["relay.slot_ttl", "fast"],
        ),
        ("[relay]\nworkers = \"four\"\n", &["workers"]),
        (
            "database_url = \"sqlite://x.db\"\n[relay]\nretention = \"1d\"\nretention_batch = 0\n",
            &["retention_batch", "between 1 and 100000"],
        ),
        (
            "database_url = \"sqlite://x.db\"\n[relay]\nretention_vacuum = true\n",
            &["relay.retention_vacuum", "need relay.retention"],
        ),
    ];
    for (file, needles) in cases {
        std::fs::write(&cfg, file).unwrap();
        let o = ferry(&["relay", "--config", cfg.to_str().unwrap()]);
        assert_one_clear_line(&o, 2, needles);
    }
    let o = ferry(&["status", "--config", "/nonexistent/ferry.toml"]);
    assert_one_clear_line(
        &o,
        2,
        &["cannot read config file", "/nonexistent/ferry.toml"],
    );
}

#[test]
fn database_url_problems_are_clear_and_redacted() {
    let o = ferry(&["status"]);
    assert_one_clear_line(&o, 2, &["--database-url", "FERRY_DATABASE_URL"]);
    let o = ferry(&[
        "status",
        "--database-url",
        "redis://admin:hunter2@127.0.0.1/0",
    ]);
    assert_one_clear_line(&o, 2, &["unsupported scheme", "postgres://"]);
    assert!(!printed(&o).contains("hunter2"), "{}", printed(&o));
    let o = ferry(&[
        "status",
        "--database-url",
        "postgres://admin:hunter2@127.0.0.1:1/db",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", printed(&o));
    assert!(
        printed(&o).contains("admin:***@127.0.0.1:1"),
        "{}",
        printed(&o)
    );
    assert!(!printed(&o).contains("hunter2"), "{}", printed(&o));
    // the cause, not only the pool's "timed out"
    assert!(printed(&o).contains("refused"), "{}", printed(&o));
    // --help never prints an env var's secret value
    let o = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["relay", "--help"])
        .env("FERRY_DATABASE_URL", "postgres://admin:hunter2@db/x")
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(!printed(&o).contains("hunter2"));
    assert!(
        printed(&o).contains("FERRY_BATCH_SIZE"),
        "help lists env vars"
    );
}

#[test]
fn enqueue_status_and_quarantine_commands() {
    let (_d, url) = sqlite_url();
    let o = ferry(&["migrate", "--database-url", &url]);
    let all: Vec<i64> = ferry_store::MIGRATIONS_SQLITE
        .iter()
        .map(|m| m.version)
        .collect();
    assert_ok(&o, &[&format!("applied migrations {all:?}")]);
    let o = ferry(&["migrate", "--database-url", &url]);
    assert_ok(&o, &["up to date"]);
    let ev = r#"{"event_id":"e-7-1","aggregate_id":"order-7","aggregate_version":1,"topic":"orders","event_type":"OrderCreated","payload":"{\"orderId\":7}"}"#;
    let o = ferry(&["enqueue", "--database-url", &url, "--event", ev]);
    assert!(o.status.success(), "{}", printed(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "e-7-1");
    // duplicate (aggregate, version) names both
    let dup = ev.replace("e-7-1", "e-7-1b");
    let o = ferry(&["enqueue", "--database-url", &url, "--event", &dup]);
    assert_one_clear_line(&o, 2, &["order-7", "version 1"]);
    let badjson = ev
        .replace(r#""payload":"{\"orderId\":7}""#, r#""payload":"{oops""#)
        .replace("e-7-1", "e-7-2")
        .replace("\"aggregate_version\":1", "\"aggregate_version\":2");
    let o = ferry(&["enqueue", "--database-url", &url, "--event", &badjson]);
    assert_one_clear_line(&o, 2, &["not valid JSON"]);
    let o = ferry(&["enqueue", "--database-url", &url, "--event", "{not json"]);
    assert_one_clear_line(&o, 2, &["invalid event JSON"]);
    let o = ferry(&["enqueue", "--database-url", &url]);
    assert_one_clear_line(&o, 2, &["--event", "--file"]);
    // status: OK while young; WARNING past a 0s threshold (exit 4, not 2: bad usage), then
    // CRITICAL (exit 5)
    let o = ferry(&["status", "--database-url", &url, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", printed(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["outbox"]["pending"], 1);
    let o = ferry(&["status", "--database-url", &url, "--oldest-warning", "0s"]);
    assert_eq!(o.status.code(), Some(4), "{}", printed(&o));
    assert!(printed(&o).contains("WARNING"));
    let o = ferry(&[
        "status",
        "--database-url",
        &url,
        "--oldest-warning",
        "0s",
        "--oldest-critical",
        "0s",
    ]);
    assert_eq!(o.status.code(), Some(5), "{}", printed(&o));
    // operator commands on a non-quarantined / unknown event are refused clearly
    let o = ferry(&["quarantine", "requeue", "e-7-1", "--database-url", &url]);
    assert_one_clear_line(&o, 2, &["e-7-1", "PENDING", "not QUARANTINED"]);
    let o = ferry(&["quarantine", "skip", "nope", "--database-url", &url]);
    assert_one_clear_line(&o, 2, &["no outbox event"]);
    let o = ferry(&["quarantine", "list", "--database-url", &url]);
    assert_ok(&o, &["no quarantined events"]);
    // a limit the server would refuse (or read as "no limit") is refused by the flag
    for limit in ["0", "18446744073709551615"] {
        let o = ferry(&[
            "quarantine",
            "list",
            "--limit",
            limit,
            "--database-url",
            &url,
        ]);
        assert_one_clear_line(&o, 2, &["--limit"]);
    }
}

#[test]
fn purge_and_reconcile_commands() {
    let (_d, url) = migrated_sqlite_url();
    let ev = r#"{"event_id":"e-7-1","aggregate_id":"order-7","aggregate_version":1,"topic":"orders","event_type":"OrderCreated","payload":"{}"}"#;
    assert!(ferry(&["enqueue", "--database-url", &url, "--event", ev])
        .status
        .success());
    let o = ferry(&[
        "purge",
        "--database-url",
        &url,
        "--older-than",
        "7d",
        "--dry-run",
    ]);
    assert_ok(&o, &["would delete 0 SENT rows"]);
    for bad in ["soon", "-1d"] {
        let o = ferry(&["purge", "--database-url", &url, "--older-than", bad]);
        assert_one_clear_line(&o, 2, &["--older-than", bad]);
    }
    let o = ferry(&[
        "purge",
        "--database-url",
        &url,
        "--older-than",
        "1h",
        "--batch",
        "0",
    ]);
    assert_one_clear_line(&o, 2, &["--batch"]);
    let reconcile = |args: &[&str]| ferry_on(&url, "reconcile", args);
    // one pending intent under the watermark, and it is listed as not yet published
    let o = reconcile(&["--watermark", "1", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", printed(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["report"]["total"], 1);
    assert_eq!(v["report"]["not_yet_published"], 1);
    let o = reconcile(&["--watermark", "last tuesday"]);
    assert_one_clear_line(
        &o,
        2,
        &["--watermark", "RFC", "seq"].map(|s| if s == "RFC" { "UTC time" } else { s }),
    );
    let o = reconcile(&[
        "--watermark",
        "2999-01-01T00:00:00Z",
        "--business-table",
        "orders;--",
    ]);
    assert_one_clear_line(&o, 2, &["invalid business table"]);
    let o = reconcile(&["--watermark", "1", "--list-limit", "18446744073709551615"]);
    assert_one_clear_line(&o, 2, &["--list-limit"]);
}

/// The `relay started` log line of `ferry relay <extra>` on a fresh SQLite file (the relay is
/// killed once it printed it).
fn relay_started_line(extra: &[&str], env: &[(&str, &str)]) -> String {
    use std::io::{BufRead, BufReader};
    let (_d, url) = migrated_sqlite_url();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
    cmd.args([
        "relay",
        "--database-url",
        &url,
        "--sink",
        "null",
        "--metrics-listen",
        "off",
    ])
    .args(extra)
    .env_remove("FERRY_DATABASE_URL")
    .env_remove("FERRY_CONFIG")
    .env_remove("FERRY_WORKERS")
    .env("FERRY_LOG", "info")
    .env("NO_COLOR", "1")
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn ferry relay");
    let stderr = child.stderr.take().unwrap();
    let mut found = String::new();
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap_or_default();
        if line.contains("relay started") {
            found = line;
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        !found.is_empty(),
        "ferry relay never logged 'relay started'"
    );
    found
}

#[test]
fn relay_on_sqlite_defaults_to_one_worker_unless_told() {
    let line = relay_started_line(&[], &[]);
    assert!(line.contains("workers=1"), "{line}");
    let line = relay_started_line(&["--workers", "3"], &[]);
    assert!(line.contains("workers=3"), "{line}");
    let line = relay_started_line(&[], &[("FERRY_WORKERS", "2")]);
    assert!(line.contains("workers=2"), "{line}");
}

/// Logs: a bad filter is refused with one clear line; `--log-format json` writes one JSON object
/// per line; text logs written to a pipe carry no ANSI colour codes.
#[test]
fn log_flags_are_checked_and_honoured() {
    let o = ferry(&[
        "status",
        "--log",
        "ferry_relay=[",
        "--database-url",
        "sqlite://x.db",
    ]);
    assert_one_clear_line(&o, 2, &["--log", "FERRY_LOG", "ferry_relay=debug"]);
    let (_d, url) = sqlite_url();
    let o = ferry(&[
        "migrate",
        "--database-url",
        &url,
        "--log-format",
        "json",
        "--log",
        "debug",
    ]);
    assert!(o.status.success(), "{}", printed(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "no log lines at debug");
    for l in &lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{l}");
    }
    let (_d, url) = sqlite_url();
    let o = ferry(&["migrate", "--database-url", &url, "--log", "debug"]);
    assert!(o.status.success(), "{}", printed(&o));
    assert!(!o.stderr.is_empty(), "no log lines at debug");
    assert!(!o.stderr.contains(&0x1b), "ANSI escape in piped logs");
    let o = ferry(&["status", "--log-format", "xml"]);
    assert_eq!(o.status.code(), Some(2), "{}", printed(&o));
    assert!(printed(&o).contains("json"), "{}", printed(&o));
}

/// Kafka properties that weaken delivery or order are refused at start, in both dispatch modes,
/// naming the property and why; allowed by name, the relay runs and warns.
#[test]
fn kafka_properties_that_weaken_delivery_are_refused() {
    let (_d, url) = migrated_sqlite_url();
    let cases: &[(&str, &[&str])] = &[
        ("acks=1", &["acks=1", "failover"]),
        (
            "enable.idempotence=false",
            &["enable.idempotence", "reorder"],
        ),
        ("enable.gapless.guarantee=false", &["gapless", "gap"]),
        (
            "max.in.flight.requests.per.connection=10",
            &["max.in.flight.requests.per.connection=10", "at most 5"],
        ),
        (
            "message.timeout.ms=3600000",
            &["message.timeout.ms", "claim lease"],
        ),
        (
            "delivery.timeout.ms=0",
            &["delivery.timeout.ms", "claim lease"],
        ),
        ("retries=0", &["retries=0"]),
    ];
    for mode in ["cursor", "row"] {
        for (prop, needles) in cases {
            let o = ferry(&[
                "relay",
                "--database-url",
                &url,
                "--dispatch",
                mode,
                "--kafka-property",
                prop,
            ]);
            let mut all = needles.to_vec();
            all.push("--allow-unsafe-kafka-property");
            assert_one_clear_line(&o, 2, &all);
        }
    }
    // an allowance for a property that is not set is a typo: refused
    let o = ferry(&[
        "relay",
        "--database-url",
        &url,
        "--allow-unsafe-kafka-property",
        "ackz",
    ]);
    assert_one_clear_line(&o, 2, &["ackz", "no such Kafka property"]);
    // safe values pass the check (the next setting checked, the metrics address, then fails:
    // no broker is needed to see that the Kafka properties got past)
    let o = ferry(&[
        "relay",
        "--database-url",
        &url,
        "--kafka-property",
        "acks=all",
        "--kafka-property",
        "enable.idempotence=true",
        "--kafka-property",
        "message.timeout.ms=5000",
        "--metrics-listen",
        "everywhere",
    ]);
    assert_one_clear_line(&o, 2, &["metrics"]);
}

/// A relay started while its database does not answer waits for it (one WARN, not one per
/// attempt) and stops cleanly on SIGTERM meanwhile; credentials the server refuses end it at
/// once with exit 1. (It exited 1 at the first refused connection before.)
#[test]
fn relay_waits_for_a_database_that_is_down_and_refuses_bad_credentials() {
    let log = std::env::temp_dir().join(format!("ferry-db-down-{}.log", std::process::id()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args([
            "relay",
            "--database-url",
            "postgres://postgres@127.0.0.1:1/test",
            "--sink",
            "null",
            "--metrics-listen",
            "off",
        ])
        .env("FERRY_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // the first attempt ends after the pool's acquire timeout (10 s), then the WARN
    let t = std::time::Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("opening the database failed")
    {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(40),
            "no WARN:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the relay must wait for the database:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "no exit after SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert_eq!(status.code(), Some(0), "{text}");
    assert_eq!(
        text.matches("opening the database failed").count(),
        1,
        "one WARN per minute, not one per attempt:\n{text}"
    );
    assert!(text.contains("refused"), "{text}");
    // refused credentials do not pass by themselves: exit 1 at once
    if let Some(url) = ferry_testkit::env_url(ferry_store::Backend::Mysql) {
        let bad = url.replacen("root@", "root:wrong@", 1);
        assert_ne!(bad, url, "the MariaDB test URL names the root user: {url}");
        let t = std::time::Instant::now();
        let o = ferry(&[
            "relay",
            "--database-url",
            &bad,
            "--sink",
            "null",
            "--metrics-listen",
            "off",
        ]);
        assert_eq!(o.status.code(), Some(1), "{}", printed(&o));
        assert!(printed(&o).contains("Access denied"), "{}", printed(&o));
        assert!(!printed(&o).contains("wrong@"), "{}", printed(&o));
        assert!(t.elapsed() < std::time::Duration::from_secs(15));
    }
}

/// `ferry enqueue --payload-file F [--binary]`: bytes are enqueued as bytes; a file that is not
/// UTF-8 needs `--binary`; every misuse gets one clear line and exit 2.
#[test]
fn enqueue_binary_payloads() {
    let (d, url) = sqlite_url();
    assert!(ferry(&["migrate", "--database-url", &url]).status.success());
    let bin = d.0.join("reading.pb");
    std::fs::write(&bin, [0x08, 0x96, 0x01, 0x00, 0xc3, 0x28, 0xff]).unwrap();
    let json = d.0.join("payload.json");
    std::fs::write(&json, br#"{"points":10}"#).unwrap();
    let (bin, json) = (bin.to_str().unwrap(), json.to_str().unwrap());
    let ev = |v: i64| {
        format!(
            r#"{{"event_id":"e-s-{v}","aggregate_id":"s","aggregate_version":{v},"topic":"orders","event_type":"ReadingTaken"}}"#
        )
    };
    let enqueue = |extra: &[&str]| ferry_on(&url, "enqueue", extra);
    let o = enqueue(&["--event", &ev(1), "--payload-file", bin, "--binary"]);
    assert!(o.status.success(), "{}", printed(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "e-s-1");
    let o = enqueue(&["--event", &ev(2), "--payload-file", json]);
    assert!(o.status.success(), "{}", printed(&o));
    // bytes in a JSON line: an array of byte values
    let line = ev(3).replace(r#""event_type""#, r#""payload":[0,255,254],"event_type""#);
    let o = enqueue(&["--event", &line]);
    assert!(o.status.success(), "{}", printed(&o));

    let o = enqueue(&["--event", &ev(4), "--payload-file", bin]);
    assert_one_clear_line(&o, 2, &["not UTF-8", "--binary"]);
    let o = enqueue(&["--event", &ev(4), "--payload-file", json, "--binary"]);
    assert!(
        o.status.success(),
        "JSON bytes are bytes too: {}",
        printed(&o)
    );
    let o = enqueue(&[
        "--event",
        &line.replace("e-s-3", "e-s-5").replace(":3,", ":5,"),
        "--payload-file",
        bin,
    ]);
    assert_one_clear_line(&o, 2, &["\"payload\"", "keep one"]);
    let o = enqueue(&[
        "--event",
        &ev(6),
        "--payload-file",
        "/nonexistent/f.pb",
        "--binary",
    ]);
    assert_one_clear_line(&o, 2, &["cannot read /nonexistent/f.pb"]);
    // clap names the missing flag (on its second line)
    let o = enqueue(&["--event", &ev(6), "--binary"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(printed(&o).contains("--payload-file"), "{}", printed(&o));
    let o = enqueue(&["--file", json, "--payload-file", bin]);
    assert_eq!(o.status.code(), Some(2));
    assert!(printed(&o).contains("--event"), "{}", printed(&o));
    let o = ferry(&["status", "--database-url", &url, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["outbox"]["pending"], 4, "e-s-1 to e-s-4");
}

/// `ferry pause` / `ferry resume`: each bad input is refused with one clear line (exit 2,
/// nothing changed); a pause shows in `ferry status` (who, why; exit 4) until it is resumed.
#[test]
fn pause_and_resume_commands() {
    let (_d, url) = migrated_sqlite_url();
    let ev = r#"{"event_id":"e-7-1","aggregate_id":"order-7","aggregate_version":1,"topic":"orders","event_type":"OrderCreated","payload":"{}"}"#;
    let o = ferry(&["enqueue", "--database-url", &url, "--event", ev]);
    assert!(o.status.success(), "{}", printed(&o));
    let pause = |args: &[&str]| ferry_on(&url, "pause", args);
    let resume = |args: &[&str]| ferry_on(&url, "resume", args);
    assert_one_clear_line(&pause(&["--reason", "x"]), 2, &["--topic", "--all"]);
    assert_one_clear_line(&pause(&["--topic", "orders"]), 2, &["--reason"]);
    let o = pause(&["--topic", "orders", "--reason", " "]);
    assert_one_clear_line(&o, 2, &["--reason"]);
    let o = pause(&["--topic", "ordres", "--reason", "x"]);
    assert_one_clear_line(&o, 2, &["ordres", "--force"]);
    let o = resume(&["--topic", "orders"]);
    assert_one_clear_line(&o, 2, &["orders", "not paused"]);
    assert_one_clear_line(&resume(&["--all"]), 2, &["nothing is paused"]);
    status_exits(&url, 0);
    let o = pause(&[
        "--topic",
        "orders",
        "--reason",
        "broker maintenance",
        "--operator",
        "alice",
    ]);
    assert_ok(&o, &["paused topic orders"]);
    let text = status_exits(&url, 4);
    assert!(
        text.contains("topic orders: since") && text.contains("by alice: broker maintenance"),
        "{text}"
    );
    let o = resume(&["--topic", "orders", "--operator", "bob"]);
    assert_ok(&o, &["resumed topic orders"]);
    status_exits(&url, 0);
}

/// Only `ferry migrate` creates a SQLite file. Every other command refuses a path where there is
/// none, saying so, and leaves nothing behind: a mistyped path must not become a new, empty
/// outbox that `status` calls healthy and a relay "delivers" from. A relay waits for the file
/// (an application that creates it may start after the relay) and starts once it is there.
#[test]
fn a_missing_sqlite_file_is_not_created() {
    use std::io::{BufRead, BufReader};
    let (d, _) = sqlite_url();
    let path = d.0.join("typo.db");
    let url = format!("sqlite://{}", path.display());
    let ev = r#"{"aggregate_id":"order-7","aggregate_version":1,"topic":"orders","event_type":"OrderCreated","payload":"{}"}"#;
    let commands: &[&[&str]] = &[
        &["status"],
        &["enqueue", "--event", ev],
        &["purge", "--older-than", "7d"],
        &["quarantine", "list"],
        &["pause", "--all", "--reason", "x"],
        &["reconcile", "--watermark", "1"],
    ];
    for args in commands {
        let o = ferry_on(&url, args[0], &args[1..]);
        let want = ["no SQLite database at", "typo.db", "ferry migrate"];
        assert_one_clear_line(&o, 1, &want);
        let left: Vec<_> = std::fs::read_dir(&d.0).unwrap().flatten().collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
    let mut relay = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["relay", "--database-url", &url, "--sink", "null"])
        .args(["--metrics-listen", "off"])
        .env_remove("FERRY_DATABASE_URL")
        .env_remove("FERRY_CONFIG")
        .env("FERRY_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn ferry relay");
    let mut lines = BufReader::new(relay.stderr.take().unwrap()).lines();
    let mut next_line = |what: &str| loop {
        match lines.next() {
            Some(Ok(l)) if l.contains(what) => break l,
            Some(_) => {}
            None => panic!("the relay ended before logging {what:?}"),
        }
    };
    let waiting = next_line("opening the database failed");
    assert!(waiting.contains("no SQLite database at"), "{waiting}");
    assert!(!path.exists(), "the relay created {}", path.display());
    assert!(ferry(&["migrate", "--database-url", &url]).status.success());
    next_line("relay started");
    let _ = relay.kill();
    let _ = relay.wait();
}

/// A command whose reader has gone (`ferry status | head -1` once head has its line) ends by
/// SIGPIPE, as Unix tools do: no panic, nothing on stderr.
#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let (_d, url) = migrated_sqlite_url();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["status", "--database-url", &url])
        .env_remove("FERRY_DATABASE_URL")
        .env_remove("FERRY_CONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn ferry status");
    // the reader is gone before the first line is written
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.signal(), Some(13), "{:?}: {stderr}", o.status);
    assert!(stderr.is_empty(), "{stderr}");
}
