//! `ferry quarantine requeue|skip` by filter: the flags, the confirmation rule (a dry run
//! unless `--yes`), the record `ferry status` shows, and a clear error (exit 2) for every bad
//! input. The store side runs on every backend in both dispatch modes in the conformance
//! suites (`bulk_requeue_moves_exactly_the_matching_events`, `bulk_skip_releases_successors_in_order`).
use std::process::Output;
use std::time::Duration;

mod support;
use support::{assert_ok, assert_one_clear_line, ferry, printed};

/// Refused as bad input: exit 2, every needle on the first line.
#[track_caller]
fn refused(o: &Output, needles: &[&str]) {
    assert_one_clear_line(o, 2, needles);
}

/// A migrated SQLite database with v1 of four aggregates quarantined (three on `orders`, two of
/// them denied, one too large; one on `payments`), v2 of `order-1` waiting behind its v1.
async fn quarantined(url: &str) {
    let store = ferry_store::connect(url, &ferry_store::ConnectOptions::default())
        .await
        .unwrap();
    let ev = |topic: &str, agg: &str, v: i64| ferry_testkit::intent(topic, agg, v);
    store
        .enqueue(&[
            ev("orders", "order-1", 1),
            ev("orders", "order-1", 2),
            ev("orders", "order-2", 1),
            ev("orders", "order-3", 1),
            ev("payments", "pay-1", 1),
        ])
        .await
        .unwrap();
    let claimed = store
        .claim(&ferry_testkit::claim_all(10, Duration::from_secs(60)))
        .await
        .unwrap();
    let items: Vec<_> = claimed
        .iter()
        .map(|c| {
            let error = if c.aggregate_id == "order-3" {
                "MSG_SIZE_TOO_LARGE"
            } else {
                "TOPIC_AUTHORIZATION_FAILED"
            };
            (c.token.clone(), error.to_string())
        })
        .collect();
    assert_eq!(store.quarantine(&items).await.unwrap().applied(), 4);
}

#[tokio::test]
async fn bulk_quarantine_flags_confirmation_and_record() {
    let dir = ferry_testkit::TempDir::new("ferry-cli-bulk").unwrap();
    let url = format!("sqlite://{}/bulk.db", dir.path().display());
    quarantined(&url).await;
    let q = |args: &[&str]| {
        let mut all = vec!["quarantine"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--database-url", &url]);
        ferry(&all)
    };

    // bad input: exit 2, one clear line, nothing changed
    let refusal = "refusing to act on every quarantined event; give a filter";
    refused(&q(&["requeue"]), &[refusal]);
    refused(&q(&["skip", "--yes", "--reason", "x"]), &[refusal]);
    refused(
        &q(&["requeue", "e-order-1-1", "--where-topic", "orders"]),
        &["--where-topic"],
    );
    refused(
        &q(&["skip", "--where-topic", "orders", "--dry-run", "--yes"]),
        &["--dry-run"],
    );
    refused(
        &q(&["requeue", "--since", "yesterday"]),
        &["invalid --since", "2026-12-06T08:00:00Z"],
    );
    refused(
        &q(&[
            "requeue",
            "--since",
            "2026-12-06T10:00:00Z",
            "--until",
            "2026-12-06T09:00:00Z",
        ]),
        &["--since must be earlier than --until"],
    );
    refused(
        &q(&["requeue", "--where-topic", "", "--dry-run"]),
        &["topic filter is empty"],
    );
    refused(
        &q(&["requeue", "--where-topic", "orders", "--yes"]),
        &["--reason"],
    );
    assert_ok(
        &q(&["list"]),
        &["e-order-1-1", "e-order-2-1", "e-order-3-1", "e-pay-1-1"],
    );

    // without --yes: a dry run that counts, lists and says how to act
    let denied = ["--where-topic", "orders", "--where-error", "AUTHORIZATION"];
    let o = q(&[&["requeue"][..], &denied].concat());
    assert_ok(
        &o,
        &[
            "2 quarantined event(s) match",
            "e-order-1-1, e-order-2-1",
            "add --yes",
        ],
    );
    assert_ok(
        &q(&[&["requeue", "--dry-run"][..], &denied].concat()),
        &["2 quarantined", "dry run: nothing changed"],
    );
    let after_dry = printed(&q(&["list", "--json"]));
    assert_eq!(after_dry.matches("\"event_id\"").count(), 4, "{after_dry}");

    // --yes acts on what matches, records it; the rest stays quarantined
    let o = q(&[
        &[
            "requeue",
            "--yes",
            "--reason",
            "ACL granted",
            "--operator",
            "bob",
        ][..],
        &denied,
    ]
    .concat());
    assert_ok(&o, &["requeued", "2 quarantined event(s)"]);
    let o = q(&[
        "skip",
        "--where-error",
        "TOO_LARGE",
        "--yes",
        "--reason",
        "oversized, re-published as e-9",
    ]);
    assert_ok(&o, &["skipped", "1 quarantined event(s)"]);
    let left = printed(&q(&["list", "--json"]));
    assert!(
        left.contains("e-pay-1-1") && !left.contains("e-order-"),
        "{left}"
    );

    // status shows the record, newest first; --json carries it
    let o = ferry(&["status", "--database-url", &url, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let a = v["operator_actions"].as_array().expect("operator_actions");
    assert_eq!(a.len(), 2, "{v}");
    assert_eq!(a[0]["action"], "skip");
    assert_eq!(a[0]["count"], 1);
    assert_eq!(a[1]["action"], "requeue");
    assert_eq!(a[1]["operator"], "bob");
    assert_eq!(a[1]["reason"], "ACL granted");
    assert_eq!(a[1]["count"], 2);
    assert_eq!(a[1]["dispatch"], "row");
    assert_eq!(a[1]["filter"]["topic"], "orders");
    assert_eq!(a[1]["filter"]["error_contains"], "AUTHORIZATION");
    let o = ferry(&["status", "--database-url", &url]);
    let t = printed(&o);
    assert!(t.contains("operator actions:"), "{t}");
    assert!(t.contains("bob requeue 2 event(s)"), "{t}");

    // the single-event form is unchanged
    assert_ok(
        &q(&["requeue", "e-pay-1-1", "--operator", "carol"]),
        &["requeued e-pay-1-1"],
    );
}
