//! Enqueueing: in the caller's transaction or not, refused when invalid, the same through a
//! plain SQL `INSERT`; intents are immutable.
use std::collections::HashSet;

use ferry_core::{EnqueueError, EventState, NewEvent};

use super::relay::{ev, req, tokens, LONG};
use crate::db::{AnyDb, TestDb};

/// Order 7 and its one intent `e-7-1`, committed or rolled back.
async fn place_order_7(db: &TestDb, commit: bool) {
    db.place_order(
        7,
        &[
            NewEvent::new("order-7", 1, "orders", "OrderCreated", r#"{"orderId":7}"#)
                .with_id("e-7-1"),
        ],
        commit,
    )
    .await
    .unwrap();
}

/// A business transaction rolled back after its enqueue leaves neither the order nor the intent.
pub async fn rollback_leaves_neither_order_nor_intent(db: TestDb) {
    place_order_7(&db, false).await;
    assert_eq!(db.count("orders").await, 0);
    assert_eq!(db.count("ferry_outbox").await, 0);
    assert!(db.store.record("e-7-1").await.unwrap().is_none());
    assert!(db.store.claim(&req(10, LONG)).await.unwrap().is_empty());
}

/// A committed intent is visible, and claimable, through a new connection pool.
pub async fn committed_intent_visible_after_reconnect(db: TestDb) {
    place_order_7(&db, true).await;
    let fresh = db.reopen().await;
    let rec = fresh
        .record("e-7-1")
        .await
        .unwrap()
        .expect("intent visible");
    assert_eq!(rec.state, EventState::Pending);
    assert_eq!(rec.payload, r#"{"orderId":7}"#);
    assert_eq!(db.count("orders WHERE id = 7").await, 1);
    let got = fresh.claim(&req(10, LONG)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].token.event_id, "e-7-1");
}

/// Several intents enqueued in the caller's own transaction commit together with its business row.
pub async fn multi_row_enqueue_in_caller_transaction(db: TestDb) {
    let evs: Vec<NewEvent> = (1..=250).map(|v| ev("bulk", v)).collect();
    let ids = db.place_order(1, &evs, true).await.unwrap();
    assert_eq!(ids.len(), 250);
    assert_eq!(db.count("ferry_outbox").await, 250);
    assert_eq!(
        db.count("orders").await,
        1,
        "the business row committed with them"
    );
    let generated = db
        .store
        .enqueue(&[NewEvent::new("gen", 1, "t", "T", "{}")])
        .await
        .unwrap();
    assert_eq!(uuid_version(&generated[0]), Some(7));
    let seen: HashSet<_> = ids.into_iter().collect();
    assert_eq!(seen.len(), 250);
}

fn uuid_version(s: &str) -> Option<u8> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    (hex.len() == 32)
        .then(|| u8::from_str_radix(&hex[12..13], 16).ok())
        .flatten()
}

/// Invalid events and requests are refused with a clear error and write nothing.
pub async fn bad_inputs_are_refused_and_write_nothing(db: AnyDb) {
    db.store.enqueue(&[ev("order-1", 1)]).await.unwrap();
    let before = db.count("ferry_outbox", |_| true).await;
    // duplicate (aggregate, version), against the database, names both
    let e = db
        .store
        .enqueue(&[ev("order-1", 1).with_id("other-id")])
        .await
        .unwrap_err();
    let order_1_v1 = EnqueueError::DuplicateVersion {
        aggregate_id: "order-1".into(),
        version: 1,
    };
    assert_eq!(e, order_1_v1);
    // ... also inside a multi-row insert, and the rest of the batch is not written
    let e = db
        .store
        .enqueue(&[ev("order-2", 1), ev("order-1", 1).with_id("x2")])
        .await
        .unwrap_err();
    assert_eq!(e, order_1_v1);
    // ... and inside the caller's business transaction, which rolls back
    if let Some(sql) = db.sql() {
        let e = sql
            .place_order(99, &[ev("order-1", 1).with_id("x3")], true)
            .await
            .unwrap_err();
        assert!(
            matches!(e, EnqueueError::DuplicateVersion { ref aggregate_id, version: 1 } if aggregate_id == "order-1"),
            "{e}"
        );
    }
    let e = db
        .store
        .enqueue(&[ev("order-9", 1).with_id("e-order-1-1")])
        .await
        .unwrap_err();
    assert_eq!(
        e,
        EnqueueError::DuplicateEventId {
            event_id: "e-order-1-1".into()
        }
    );
    let mut bad = ev("order-3", 1);
    bad.payload = "{\"unterminated\": ".into();
    assert!(matches!(
        db.store.enqueue(&[bad]).await,
        Err(EnqueueError::InvalidJson { .. })
    ));
    let mut big = ev("order-3", 1);
    big.payload = format!("\"{}\"", "x".repeat(2 * 1024 * 1024)).into();
    assert!(matches!(
        db.store.enqueue(&[big]).await,
        Err(EnqueueError::PayloadTooLarge { .. })
    ));
    let mut e1 = ev("order-3", 1);
    e1.topic = String::new();
    assert_eq!(
        db.store.enqueue(&[e1]).await.unwrap_err(),
        EnqueueError::Empty { field: "topic" }
    );
    // the same refusals on every backend: PostgreSQL cannot store a NUL, the others could
    let mut nul = ev("order-3", 1);
    nul.aggregate_id = "order\0-3".into();
    assert!(matches!(
        db.store.enqueue(&[nul]).await,
        Err(EnqueueError::InvalidText {
            field: "aggregate_id",
            ..
        })
    ));
    let mut topic = ev("order-3", 1);
    topic.topic = "orders v1".into();
    assert!(matches!(
        db.store.enqueue(&[topic]).await,
        Err(EnqueueError::InvalidText { field: "topic", .. })
    ));
    let mut e2 = ev("order-3", 1);
    e2.key = Some("  ".into());
    assert_eq!(
        db.store.enqueue(&[e2]).await.unwrap_err(),
        EnqueueError::Empty { field: "key" }
    );
    let e3 = ev("order-3", 0);
    assert!(matches!(
        db.store.enqueue(&[e3]).await,
        Err(EnqueueError::BadVersion { version: 0, .. })
    ));
    let e4 = ev("order-3", -5);
    let msg = db.store.enqueue(&[e4]).await.unwrap_err().to_string();
    assert!(msg.contains("order-3") && msg.contains("-5"), "{msg}");
    assert_eq!(
        db.count("ferry_outbox", |_| true).await,
        before,
        "a refused enqueue wrote something"
    );
    if let Some(sql) = db.sql() {
        assert_eq!(
            sql.count("orders").await,
            0,
            "the rolled-back business row is gone"
        );
    }
}

/// A SQL `UPDATE` of an intent column is refused by the immutability trigger.
pub async fn intent_columns_are_immutable(db: TestDb) {
    db.store.enqueue(&[ev("I", 1)]).await.unwrap();
    let err = db
        .exec("UPDATE ferry_outbox SET payload = '{}' WHERE event_id = 'e-I-1'")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("immutable"), "{err}");
    let err = db
        .exec("UPDATE ferry_outbox SET aggregate_version = 2 WHERE event_id = 'e-I-1'")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("immutable"), "{err}");
    assert_eq!(
        db.store.record("e-I-1").await.unwrap().unwrap().payload,
        r#"{"agg":"I","v":1}"#
    );
}

/// A producer in any language: one plain INSERT that leaves out shard_slot, msg_key, event_id,
/// headers and the timestamps (SQLite: into the `ferry_outbox_insert` view). The database fills
/// them as the Rust API does (the slot is `ferry_core::slot_for`, also for non-ASCII ids), and
/// the rows are claimed and delivered like any other.
pub async fn plain_insert_fills_what_the_rust_api_fills(db: TestDb) {
    let keys = [
        "order-7",
        "a",
        "customer:81f3",
        "ünïcødé-ägg",
        "注文-42",
        &"x".repeat(255),
    ];
    let table = match db.backend {
        ferry_store::Backend::Sqlite => "ferry_outbox_insert",
        _ => "ferry_outbox",
    };
    for (i, k) in keys.iter().enumerate() {
        // the ids come from this test, not the outside world: quoting is safe here
        db.exec(&format!(
            "INSERT INTO {table} (aggregate_id, aggregate_version, topic, event_type, payload) \
             VALUES ('{k}', 1, 'orders', 'OrderPlaced', '{{\"n\":{i}}}')"
        ))
        .await
        .unwrap();
    }
    // a producer that fills everything itself is untouched, even a slot that is not the
    // aggregate's (the database does not check a slot it is given: schema.md §2.1)
    let given = (ferry_core::slot_for("order-7") + 1) % ferry_core::SLOT_COUNT;
    db.exec(&format!(
        "INSERT INTO {table} (event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key, event_type, headers, payload) \
         VALUES ('mine-1', 'order-7', 2, {given}, 'orders', 'k-7', 'OrderPaid', '{{\"h\":\"v\"}}', '{{}}')"
    ))
    .await
    .unwrap();
    // PostgreSQL leaves a key that was left out NULL (the aggregate id, read with coalesce)
    crate::conformance::assert_keys_left_null(&db, keys.len() as i64).await;
    let claimed = db.store.claim(&req(100, LONG)).await.unwrap();
    assert_eq!(claimed.len(), keys.len(), "v2 of order-7 waits for v1");
    for c in &claimed {
        assert_eq!(
            c.shard_slot,
            ferry_core::slot_for(&c.aggregate_id),
            "{}",
            c.aggregate_id
        );
        assert_eq!(c.key, c.aggregate_id);
        assert_eq!(c.token.event_id.len(), 36, "a UUID: {}", c.token.event_id);
        assert!(
            c.created_at > 1_700_000_000_000_000,
            "µs since the epoch: {}",
            c.created_at
        );
        assert_eq!(c.headers, "{}");
    }
    let ids: HashSet<&str> = claimed.iter().map(|c| c.token.event_id.as_str()).collect();
    assert_eq!(ids.len(), keys.len(), "distinct event ids");
    if db.backend == ferry_store::Backend::Postgres {
        // UUIDv7, as the Rust API's: version 7, variant 10, the Unix milliseconds of the insert
        // in the first 48 bits, so ids filled later sort later (MariaDB's UUID() is version 1,
        // SQLite's view fills a UUIDv4)
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let mut in_order: Vec<_> = claimed.iter().collect();
        in_order.sort_by_key(|c| c.token.seq);
        let mut last = 0;
        for c in in_order {
            let id = &c.token.event_id;
            assert_eq!(&id[14..15], "7", "version 7: {id}");
            assert!("89ab".contains(&id[19..20]), "variant 10: {id}");
            let ms = i64::from_str_radix(&format!("{}{}", &id[0..8], &id[9..13]), 16).unwrap();
            assert!(
                (now_ms - 60_000..=now_ms + 1_000).contains(&ms),
                "{id}: {ms} ms, now {now_ms}"
            );
            assert!(ms >= last, "{id} was filled after a later id");
            last = ms;
        }
    }
    assert_eq!(
        db.store.ack(&tokens(&claimed)).await.unwrap().applied(),
        keys.len()
    );
    let mine = db.store.claim(&req(100, LONG)).await.unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!(
        (
            mine[0].token.event_id.as_str(),
            mine[0].key.as_str(),
            mine[0].shard_slot
        ),
        ("mine-1", "k-7", given)
    );
    assert_eq!(mine[0].headers, r#"{"h":"v"}"#);
}

/// A claim, and the lookup of a claim by its id, carry the message key: the aggregate id when
/// the producer gave none or gave the aggregate id itself (PostgreSQL then stores no key,
/// `msg_key` NULL: migration 16), the producer's own otherwise.
pub async fn keys_are_claimed_whether_stored_or_implied(db: TestDb) {
    let keyed = |agg: &str, v, key: &str| NewEvent {
        key: Some(key.into()),
        ..ev(agg, v)
    };
    let evs = [ev("k", 1), keyed("j", 1, "j"), keyed("m", 1, "route-9")];
    db.store.enqueue(&evs).await.unwrap();
    crate::conformance::assert_keys_left_null(&db, 2).await;
    let keys = |events: Vec<ferry_core::ClaimedEvent>| {
        let mut k: Vec<(String, String)> = events
            .into_iter()
            .map(|e| (e.aggregate_id, e.key))
            .collect();
        k.sort();
        k
    };
    let want: Vec<(String, String)> = [("j", "j"), ("k", "k"), ("m", "route-9")]
        .map(|(a, k)| (a.into(), k.into()))
        .into();
    let claimed = db.store.claim(&req(10, LONG)).await.unwrap();
    let claim_id = claimed[0].token.claim_id.clone();
    assert_eq!(keys(claimed), want);
    let found = db.store.lookup_claim(&claim_id).await.unwrap();
    assert_eq!(keys(found), want);
}
