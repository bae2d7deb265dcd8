//! Requests, claimed events and intents the tests build over and over.

/// An unfenced claim over every slot of up to `limit` events, leased for `lease`.
pub fn claim_all(limit: usize, lease: std::time::Duration) -> ferry_core::ClaimRequest {
    ferry_core::ClaimRequest::new((0..ferry_core::SLOT_COUNT).collect(), limit, lease)
}

/// A retry outcome for `token`: due again after `delay`, with `error` as its `last_error`.
pub fn retry_item(
    token: &ferry_core::ClaimToken,
    delay: std::time::Duration,
    error: &str,
) -> ferry_core::RetryItem {
    ferry_core::RetryItem {
        token: token.clone(),
        delay,
        error: error.into(),
    }
}

/// The token of `claimed`'s event of aggregate `agg`; panics when there is none.
pub(crate) fn token_of(claimed: &[ferry_core::ClaimedEvent], agg: &str) -> ferry_core::ClaimToken {
    let e = claimed.iter().find(|e| e.aggregate_id == agg);
    e.unwrap_or_else(|| panic!("no claimed event of {agg}"))
        .token
        .clone()
}

/// A purge of every SENT row (no age limit, no consumer filter), `batch` rows per delete
/// transaction; set other fields with struct update syntax.
pub fn purge_all(batch: usize) -> ferry_core::PurgeRequest<'static> {
    ferry_core::PurgeRequest {
        older_than: std::time::Duration::ZERO,
        batch,
        consumer: None,
        dry_run: false,
        vacuum: false,
    }
}

/// `n` claimed events for sending straight to a sink (no store): aggregates `order-{i}` for `i`
/// in `first..first + n`, each at version 1, keyed by its aggregate, with `payload`.
pub fn claimed_events(
    topic: &str,
    first: usize,
    n: usize,
    payload: &str,
) -> Vec<ferry_core::ClaimedEvent> {
    (first..first + n)
        .map(|i| {
            let agg = format!("order-{i}");
            ferry_core::ClaimedEvent {
                token: ferry_core::ClaimToken {
                    seq: i as i64 + 1,
                    event_id: format!("01890a5d-ac96-774b-bcce-{i:012x}"),
                    claim_id: "01890a5d-ac96-774b-bcce-00000000ffff".into(),
                    claim_version: 1,
                },
                shard_slot: ferry_core::slot_for(&agg),
                key: agg.clone(),
                aggregate_id: agg,
                aggregate_version: 1,
                topic: topic.into(),
                event_type: "OrderCreated".into(),
                headers: "{}".into(),
                payload: payload.into(),
                attempts: 0,
                created_at: 0,
            }
        })
        .collect()
}

/// A test intent of aggregate `agg`, version `v`, on `topic`: its id is `e-{agg}-{v}` (so a test
/// can name it) and its payload `{"agg":…,"v":…}` (so a reader can tell what it got).
pub fn intent(topic: &str, agg: &str, v: i64) -> ferry_core::NewEvent {
    ferry_core::NewEvent::new(
        agg,
        v,
        topic,
        "OrderChanged",
        format!(r#"{{"agg":"{agg}","v":{v}}}"#),
    )
    .with_id(format!("e-{agg}-{v}"))
}

/// A Protobuf-like payload that is not text: a varint field, 0x00, an invalid UTF-8 sequence
/// (0xC3 0x28), 0xFF and 0xFE, a lone continuation byte (0x80), and a trailing 0x00.
pub const BINARY_PAYLOAD: &[u8] = &[
    0x08, 0x96, 0x01, 0x00, 0x12, 0x02, 0xc3, 0x28, 0xff, 0xfe, 0x1a, 0x01, 0x80, 0x00,
];

/// A producer's plain `INSERT` (no Rust API) of a binary-payload intent of aggregate `agg`,
/// version `v`, id `e-{agg}-{v}`, on `backend`: `payload_bytes` on PostgreSQL and MariaDB, a
/// BLOB in `payload` through SQLite's `ferry_outbox_insert` view (docs/schema.md, "Binary
/// payloads"). The bytes go in as a hex literal (test data, not input).
pub fn plain_insert_binary(
    backend: ferry_store::Backend,
    topic: &str,
    agg: &str,
    v: i64,
    bytes: &[u8],
) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let (table, column, value) = match backend {
        ferry_store::Backend::Postgres => (
            "ferry_outbox",
            "payload_bytes",
            format!("decode('{hex}', 'hex')"),
        ),
        ferry_store::Backend::Mysql => ("ferry_outbox", "payload_bytes", format!("X'{hex}'")),
        ferry_store::Backend::Sqlite => ("ferry_outbox_insert", "payload", format!("X'{hex}'")),
    };
    format!(
        "INSERT INTO {table} (event_id, aggregate_id, aggregate_version, topic, event_type, {column}) \
         VALUES ('e-{agg}-{v}', '{agg}', {v}, '{topic}', 'OrderProto', {value})"
    )
}
