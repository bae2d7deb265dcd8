//! Binary payloads (Avro, Protobuf): stored and read back byte for byte beside JSON text, from a
//! plain `INSERT` and from the Rust API; the schema holds exactly one payload per row; the
//! migration that adds them keeps the text rows of an existing table.
use ferry_core::{NewEvent, Payload};

use super::relay::{ev, req, LONG};
use crate::db::TestDb;
use crate::fixtures::{plain_insert_binary, BINARY_PAYLOAD};

/// A plain `INSERT` of bytes and an enqueue of bytes through the API are claimed and recorded
/// with exactly their bytes, next to a JSON text row; JSON text is still checked, bytes never
/// are; a row with no payload (and, where there are two columns, with both) is refused.
pub async fn binary_payloads_round_trip(db: TestDb) {
    db.exec(&plain_insert_binary(
        db.backend,
        "orders",
        "bin-a",
        1,
        BINARY_PAYLOAD,
    ))
    .await
    .unwrap();
    let mut api = NewEvent::new("bin-b", 1, "orders", "OrderProto", BINARY_PAYLOAD.to_vec())
        .with_id("e-bin-b-1");
    db.store
        .enqueue(&[api.clone(), ev("text-c", 1)])
        .await
        .unwrap();
    // An empty message is a valid Protobuf message.
    api.payload = Payload::Bytes(Vec::new());
    api.aggregate_version = 2;
    api.event_id = Some("e-bin-b-2".into());
    db.store.enqueue(&[api]).await.unwrap();

    let mut claimed = db.store.claim(&req(10, LONG)).await.unwrap();
    claimed.sort_by(|a, b| a.token.event_id.cmp(&b.token.event_id));
    let got: Vec<(&str, &Payload)> = claimed
        .iter()
        .map(|e| (e.token.event_id.as_str(), &e.payload))
        .collect();
    let bytes = Payload::Bytes(BINARY_PAYLOAD.to_vec());
    let text = Payload::Text(r#"{"agg":"text-c","v":1}"#.into());
    assert_eq!(
        got,
        vec![
            ("e-bin-a-1", &bytes),
            ("e-bin-b-1", &bytes),
            ("e-text-c-1", &text)
        ],
        "v2 of bin-b waits for v1"
    );
    for id in ["e-bin-a-1", "e-bin-b-1"] {
        let rec = db.store.record(id).await.unwrap().unwrap();
        assert_eq!(rec.payload.as_bytes(), BINARY_PAYLOAD, "{id}");
    }
    let empty = db.store.record("e-bin-b-2").await.unwrap().unwrap();
    assert_eq!(empty.payload, Payload::Bytes(Vec::new()));

    // JSON text is checked as before; bytes that do not parse as JSON are not text.
    let bad = NewEvent::new("bin-d", 1, "orders", "OrderChanged", "{\"unterminated\": ");
    let err = db.store.enqueue(&[bad]).await.unwrap_err();
    assert!(
        matches!(err, ferry_core::EnqueueError::InvalidJson { .. }),
        "{err}"
    );
    assert_eq!(
        db.count("ferry_outbox WHERE aggregate_id = 'bin-d'").await,
        0
    );

    // Exactly one payload per row.
    let neither = match db.backend {
        ferry_store::Backend::Sqlite => {
            "INSERT INTO ferry_outbox_insert (aggregate_id, aggregate_version, topic, event_type, payload) \
             VALUES ('bin-e', 1, 'orders', 'OrderProto', NULL)"
        }
        _ => {
            "INSERT INTO ferry_outbox (aggregate_id, aggregate_version, topic, event_type) \
             VALUES ('bin-e', 1, 'orders', 'OrderProto')"
        }
    };
    assert!(db.exec(neither).await.is_err(), "a row without a payload");
    let bytes_literal = match db.backend {
        ferry_store::Backend::Postgres => Some("decode('01', 'hex')"),
        ferry_store::Backend::Mysql => Some("X'01'"),
        ferry_store::Backend::Sqlite => None,
    };
    if let Some(lit) = bytes_literal {
        let both = format!(
            "INSERT INTO ferry_outbox (aggregate_id, aggregate_version, topic, event_type, \
             payload, payload_bytes) VALUES ('bin-f', 1, 'orders', 'OrderProto', '{{}}', {lit})"
        );
        assert!(db.exec(&both).await.is_err(), "a row with both payloads");
    }
    assert_eq!(
        db.count("ferry_outbox WHERE aggregate_id IN ('bin-e', 'bin-f')")
            .await,
        0
    );
}

/// The binary-payload migration applies to a table that already holds text rows (the schema
/// is set back to before it first): they read back as the same text, and bytes can be written
/// afterwards. SQLite needs no migration (a BLOB goes in `payload`).
pub async fn binary_migration_keeps_text_rows(db: TestDb) {
    let revert: &[&str] = match db.backend {
        ferry_store::Backend::Postgres => &[
            "DROP VIEW ferry_outbox_cursor_view",
            "DROP TRIGGER ferry_outbox_immutable ON ferry_outbox",
            "ALTER TABLE ferry_outbox DROP CONSTRAINT ferry_outbox_payload_one",
            "ALTER TABLE ferry_outbox DROP COLUMN payload_bytes, ALTER COLUMN payload SET NOT NULL",
        ],
        ferry_store::Backend::Mysql => &[
            "DROP VIEW ferry_outbox_cursor_view",
            "ALTER TABLE ferry_outbox DROP CONSTRAINT ferry_outbox_payload_one",
            "ALTER TABLE ferry_outbox DROP COLUMN payload_bytes, \
             MODIFY payload LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL",
        ],
        ferry_store::Backend::Sqlite => &[],
    };
    let version = match db.backend {
        ferry_store::Backend::Postgres => ferry_store::MIGRATIONS_POSTGRES,
        ferry_store::Backend::Mysql => ferry_store::MIGRATIONS_MYSQL,
        ferry_store::Backend::Sqlite => ferry_store::MIGRATIONS_SQLITE,
    }
    .iter()
    .find(|m| m.name == "binary_payload")
    .map(|m| m.version);
    for sql in revert {
        db.exec(sql).await.unwrap();
    }
    if let Some(v) = version {
        db.exec(&format!(
            "DELETE FROM ferry_schema_migrations WHERE version = {v}"
        ))
        .await
        .unwrap();
    }
    // text rows written under the old schema (by a plain INSERT: this build's enqueue names
    // payload_bytes)
    let table = match db.backend {
        ferry_store::Backend::Sqlite => "ferry_outbox_insert",
        _ => "ferry_outbox",
    };
    for v in 1..=3 {
        db.exec(&format!(
            "INSERT INTO {table} (event_id, aggregate_id, aggregate_version, topic, event_type, payload) \
             VALUES ('e-old-{v}', 'old', {v}, 'orders', 'OrderChanged', '{{\"agg\":\"old\",\"v\":{v}}}')"
        ))
        .await
        .unwrap();
    }

    let applied = ferry_store::migrate_url(&db.url).await.unwrap();
    assert_eq!(applied, version.into_iter().collect::<Vec<_>>());
    db.exec(&plain_insert_binary(
        db.backend,
        "orders",
        "old",
        4,
        BINARY_PAYLOAD,
    ))
    .await
    .unwrap();
    for v in 1..=3 {
        let rec = db
            .store
            .record(&format!("e-old-{v}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            rec.payload,
            Payload::Text(format!(r#"{{"agg":"old","v":{v}}}"#))
        );
    }
    let rec = db.store.record("e-old-4").await.unwrap().unwrap();
    assert_eq!(rec.payload, Payload::Bytes(BINARY_PAYLOAD.to_vec()));
}
