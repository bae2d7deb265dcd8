//! Retention (purge), reconciliation and the status counts.
use std::time::Duration;

use ferry_core::{ClaimRequest, ClaimToken, EventState, StoreErrorKind};

use super::relay::{claim_eventually, enqueue_and_claim, ev, req, LONG};
use crate::db::{AnyDb, TestDb};
use crate::fixtures::token_of;

/// The Inbox columns purge and reconcile read: the dedupe rows, and each aggregate's contiguous
/// mark (a version it covers counts as consumed even when its row was pruned).
const INBOX_DDL: [&str; 2] = [
    "CREATE TABLE ferry_inbox (consumer VARCHAR(255) NOT NULL, event_id VARCHAR(255) NOT NULL, PRIMARY KEY (consumer, event_id))",
    "CREATE TABLE ferry_inbox_aggregate (consumer VARCHAR(255) NOT NULL, aggregate_id VARCHAR(255) NOT NULL, applied_upto BIGINT NOT NULL, PRIMARY KEY (consumer, aggregate_id))",
];

/// Purge deletes only SENT rows older than the cut-off (with a consumer named, only the ones its
/// Inbox recorded).
pub async fn purge_deletes_only_old_sent_rows(db: AnyDb) {
    let (c, t) = enqueue_and_claim(&*db.store, "p", 5, 4).await;
    assert_eq!(c.len(), 4);
    db.store.ack(&t[0..3]).await.unwrap();
    // t[3] stays CLAIMED; p-4 stays PENDING; one more quarantined
    db.store.enqueue(&[ev("q", 1)]).await.unwrap();
    let qc = claim_eventually(
        &*db.store,
        &ClaimRequest::new(vec![ferry_core::slot_for("q")], 1, LONG),
        Duration::from_secs(5),
    )
    .await;
    db.store
        .quarantine(&[(qc[0].token.clone(), "bad".into())])
        .await
        .unwrap();
    assert_eq!(
        db.store
            .purge_sent(&ferry_core::PurgeRequest {
                older_than: Duration::from_secs(3600),
                ..crate::fixtures::purge_all(100)
            })
            .await
            .unwrap(),
        0,
        "nothing old enough"
    );
    assert_eq!(
        db.store
            .purge_sent(&ferry_core::PurgeRequest {
                dry_run: true,
                ..crate::fixtures::purge_all(100)
            })
            .await
            .unwrap(),
        3,
        "dry run counts"
    );
    assert_eq!(
        db.count("ferry_outbox", |_| true).await,
        6,
        "dry run deletes nothing"
    );
    assert_eq!(
        db.store
            .purge_sent(&crate::fixtures::purge_all(2))
            .await
            .unwrap(),
        3,
        "two bounded batches"
    );
    assert_eq!(db.count("ferry_outbox", |_| true).await, 3);
    assert_eq!(
        db.count("ferry_outbox WHERE state = 'SENT'", |r| r.state
            == EventState::Sent)
            .await,
        0
    );
    assert_eq!(
        db.count(
            "ferry_outbox WHERE state IN ('PENDING', 'CLAIMED', 'QUARANTINED')",
            |r| matches!(
                r.state,
                EventState::Pending | EventState::Claimed | EventState::Quarantined
            )
        )
        .await,
        3
    );
    // with a consumer, only rows its Inbox recorded go (the Inbox is a SQL table: a store
    // without one refuses rather than guessing)
    let Some(sql) = db.sql() else {
        assert!(db
            .store
            .purge_sent(&ferry_core::PurgeRequest {
                consumer: Some("billing"),
                ..crate::fixtures::purge_all(10)
            })
            .await
            .is_err());
        return;
    };
    for ddl in INBOX_DDL {
        sql.exec(ddl).await.unwrap();
    }
    db.store.enqueue(&[ev("r", 1), ev("s", 1)]).await.unwrap();
    let slots = vec![ferry_core::slot_for("r"), ferry_core::slot_for("s")];
    let got = db
        .store
        .claim(&ClaimRequest::new(slots, 10, LONG))
        .await
        .unwrap();
    let toks: Vec<ClaimToken> = got
        .iter()
        .filter(|e| e.aggregate_id == "r" || e.aggregate_id == "s")
        .map(|e| e.token.clone())
        .collect();
    assert_eq!(db.store.ack(&toks).await.unwrap().applied(), 2);
    sql.exec("INSERT INTO ferry_inbox (consumer, event_id) VALUES ('billing', 'e-r-1')")
        .await
        .unwrap();
    let purge_consumed = || async {
        let req = ferry_core::PurgeRequest {
            consumer: Some("billing"),
            ..crate::fixtures::purge_all(10)
        };
        db.store.purge_sent(&req).await
    };
    assert_eq!(purge_consumed().await.unwrap(), 1);
    assert!(db.store.record("e-r-1").await.unwrap().is_none());
    assert!(
        db.store.record("e-s-1").await.unwrap().is_some(),
        "unconsumed SENT row kept"
    );
    // an Inbox row pruned behind the consumer's mark: consumed all the same
    sql.exec("INSERT INTO ferry_inbox_aggregate VALUES ('billing', 's', 1)")
        .await
        .unwrap();
    assert_eq!(purge_consumed().await.unwrap(), 1);
    assert!(db.store.record("e-s-1").await.unwrap().is_none());
}

/// Reconcile classifies every intent of the business table exactly once.
pub async fn reconcile_classifies_every_intent_once(db: TestDb) {
    for ddl in INBOX_DDL {
        db.exec(ddl).await.unwrap();
    }
    // orders 1..4 exist; intents for orders 1..3 and 5 (6 intents under the watermark)
    for id in 1..=4 {
        db.exec(&format!("INSERT INTO orders VALUES ({id}, 'CREATED', 1)"))
            .await
            .unwrap();
    }
    let evs = vec![
        ev("order-1", 1),
        ev("order-2", 1),
        ev("order-3", 1),
        ev("order-3", 2),
        ev("order-5", 1),
        ev("order-5", 2),
    ];
    db.store.enqueue(&evs).await.unwrap();
    db.store.enqueue(&[ev("order-9", 1)]).await.unwrap(); // above the watermark
    let wm = ferry_core::Watermark::Seq(6);
    // up to the watermark, as `consumer`, against the business table `table` (ids in `id`,
    // aggregates `order-<id>`)
    let request = |consumer: Option<&str>, table: Option<&str>| ferry_core::ReconcileRequest {
        watermark: wm,
        consumer: consumer.map(Into::into),
        business: table.map(|table| ferry_core::BusinessTable {
            table: table.into(),
            id_column: "id".into(),
            aggregate_prefix: "order-".into(),
            max_id: None,
        }),
        list_limit: 10,
    };
    let c = db.store.claim(&req(10, LONG)).await.unwrap();
    let by = |agg: &str| token_of(&c, agg);
    db.store.ack(&[by("order-1"), by("order-2")]).await.unwrap();
    db.exec("INSERT INTO ferry_inbox (consumer, event_id) VALUES ('billing', 'e-order-1-1')")
        .await
        .unwrap();
    db.store
        .quarantine(&[(by("order-5"), "schema".into())])
        .await
        .unwrap();
    // order-3 v1 stays CLAIMED (unknown), v2 PENDING behind it; order-5 v2 PENDING behind quarantine
    let r = db
        .store
        .reconcile(&request(Some("billing"), Some("orders")))
        .await
        .unwrap();
    assert_eq!(r.total, 6, "{r:?}");
    // (consumed, published awaiting consumption, unknown, not yet published, quarantined, skipped)
    let classes = |r: &ferry_core::ReconcileReport| {
        (
            r.consumed,
            r.published_awaiting_consumption,
            r.outcome_unknown,
            r.not_yet_published,
            r.quarantined,
            r.skipped,
        )
    };
    assert_eq!(classes(&r), (1, 1, 1, 2, 1, 0), "{r:?}");
    assert!(r.classes_sum_to_total());
    assert_eq!(r.unknown_ids, vec!["e-order-3-1".to_string()]);
    assert_eq!(r.quarantined_ids, vec!["e-order-5-1".to_string()]);
    assert!(r.oldest_not_published_age_us.unwrap_or(-1) >= 0);
    assert_eq!(
        (r.business_rows, r.business_without_intent),
        (Some(4), Some(1))
    );
    assert_eq!(r.business_without_intent_ids, vec![4]);
    // order-2 v1's Inbox row pruned behind the consumer's mark, and a mark over the CLAIMED
    // order-3 v1 (the consumer got it before the relay recorded the ack): both consumed
    db.exec("INSERT INTO ferry_inbox_aggregate VALUES ('billing', 'order-2', 1), ('billing', 'order-3', 1)")
        .await
        .unwrap();
    let r = db
        .store
        .reconcile(&request(Some("billing"), None))
        .await
        .unwrap();
    assert_eq!(classes(&r), (3, 0, 0, 2, 1, 0), "{r:?}");
    assert!(r.unknown_ids.is_empty(), "{r:?}");
    // without an Inbox, consumption is not claimed: SENT rows are "published, awaiting"
    let r = db.store.reconcile(&request(None, None)).await.unwrap();
    assert_eq!(
        (r.total, r.consumed, r.published_awaiting_consumption),
        (6, 0, 2)
    );
    // identifiers are validated, never interpolated as given
    let bad = request(None, Some("orders; DROP TABLE orders"));
    let e = db.store.reconcile(&bad).await.unwrap_err().to_string();
    assert!(e.contains("invalid business table"), "{e}");
    assert_eq!(db.count("orders").await, 4);
}

/// The relays' status poll: a store that shares its counts between relays (PostgreSQL, MariaDB) returns
/// the stored count while it is fresher than `max_age`; every store counts afresh with
/// `max_age` zero, and agrees with `status()`.
pub async fn shared_status_is_counted_once_per_max_age(db: AnyDb) {
    db.store
        .enqueue(&[ev("s-1", 1), ev("s-2", 1)])
        .await
        .unwrap();
    let hour = Duration::from_secs(3600);
    assert_eq!(db.store.shared_status(hour).await.unwrap().pending, 2);
    db.store.enqueue(&[ev("s-3", 1)]).await.unwrap();
    let shared = matches!(db.store.backend(), "postgres" | "mysql");
    let again = db.store.shared_status(hour).await.unwrap();
    assert_eq!(again.pending, if shared { 2 } else { 3 });
    assert!(again.oldest_unfinished_age_us.is_some_and(|a| a >= 0));
    let fresh = db.store.shared_status(Duration::ZERO).await.unwrap();
    assert_eq!(fresh.pending, 3);
    assert_eq!(fresh.pending, db.store.status().await.unwrap().pending);
    // the stored count moved on: a long max_age now returns 3
    assert_eq!(db.store.shared_status(hour).await.unwrap().pending, 3);
    if !shared {
        return;
    }
    // Another relay holds the counting lease. With a count stored, the stored count comes
    // back, even an old one; with none stored yet, a Conflict to ask again later, not a
    // second walk of the backlog.
    let sql = db.sql().expect("a SQL database");
    let lease = if db.store.backend() == "postgres" {
        "UPDATE ferry_status_cache SET computing_until = now() + interval '1 minute'"
    } else {
        "UPDATE ferry_status_cache SET computing_until = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE"
    };
    sql.exec(lease).await.unwrap();
    db.store.enqueue(&[ev("s-4", 1)]).await.unwrap();
    let stored = db.store.shared_status(Duration::ZERO).await.unwrap();
    assert_eq!(
        stored.pending, 3,
        "the stored count while another relay counts"
    );
    sql.exec("UPDATE ferry_status_cache SET computed_at = NULL")
        .await
        .unwrap();
    let busy = db.store.shared_status(Duration::ZERO).await.unwrap_err();
    assert_eq!(busy.kind(), StoreErrorKind::Conflict, "{busy}");
    assert_eq!(db.store.status().await.unwrap().pending, 4);
}

/// The outbox's size grows with its rows: 400 intents of 1,000-byte payloads add at least
/// 400,000 bytes to the table, and the indexes are counted apart. MariaDB's figures are InnoDB
/// statistics, recounted here by `ANALYZE TABLE` as an operator would.
pub async fn outbox_size_grows_with_the_rows(db: TestDb) {
    let size = || async {
        if db.backend == ferry_store::Backend::Mysql {
            db.exec("ANALYZE TABLE ferry_outbox").await.unwrap();
        }
        let s = db.store.outbox_size().await.unwrap();
        s.expect("a SQL store reports its outbox's size")
    };
    let before = size().await;
    assert!(
        before.table_bytes > 0 && before.index_bytes > 0,
        "{before:?}"
    );
    let pad = "x".repeat(1000 - r#"{"pad":""}"#.len());
    let events: Vec<_> = (0..400)
        .map(|i| {
            let mut e = ev(&format!("size-{i}"), 1);
            e.payload = format!(r#"{{"pad":"{pad}"}}"#).into();
            e
        })
        .collect();
    for chunk in events.chunks(100) {
        db.store.enqueue(chunk).await.unwrap();
    }
    let after = size().await;
    assert!(
        after.table_bytes - before.table_bytes >= 400_000,
        "{before:?} → {after:?}"
    );
    assert!(after.index_bytes > 0 && !after.source.is_empty());
}
