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
