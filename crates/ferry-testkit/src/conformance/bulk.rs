//! Bulk operator actions on quarantined events, in both dispatch modes: the store suite runs
//! [`row`]'s cases, the cursor suite [`cursor`]'s (the same cases, each in its mode).
//!
//! Each case quarantines v1 of some aggregates (row dispatch: claimed and quarantined; cursor
//! dispatch: read and advanced past with a quarantine exception, later versions held behind
//! it), then acts on them by filter ([`ferry_core::OutboxStore::bulk_quarantine`]).
use std::time::Duration;

use ferry_core::{
    BulkOutcome, BulkRequest, BulkVerb, DispatchMode, EventState, ExceptionKind, ExceptionOutcomes,
    NewException, QuarantineFilter, SlotFence, StoreErrorKind,
};

use super::cursor::relay::{advance_each, cs, owned, read_req, read_until};
use crate::db::TestDb;

const LONG: Duration = Duration::from_secs(60);
/// The owner of every slot in cursor dispatch.
const OWNER: &str = "a";

/// One aggregate of a case: its id, its topic, how many versions, and v1's quarantine error.
struct Agg(&'static str, &'static str, i64, &'static str);

/// Enqueues every version of `aggs` and quarantines each v1 with its error in `mode`; the later
/// versions wait behind it (row dispatch: PENDING; cursor dispatch: held exceptions).
async fn quarantine_v1s(db: &TestDb, mode: DispatchMode, aggs: &[Agg]) {
    let events: Vec<_> = aggs
        .iter()
        .flat_map(|a| (1..=a.2).map(move |v| crate::fixtures::intent(a.1, a.0, v)))
        .collect();
    let error_of = |agg: &str| aggs.iter().find(|a| a.0 == agg).map(|a| a.3.to_string());
    match mode {
        DispatchMode::Row => {
            db.store.enqueue(&events).await.unwrap();
            let claimed = db
                .store
                .claim(&crate::fixtures::claim_all(100, LONG))
                .await
                .unwrap();
            assert_eq!(claimed.len(), aggs.len(), "v1 of each aggregate is claimed");
            let items: Vec<_> = claimed
                .iter()
                .map(|c| (c.token.clone(), error_of(&c.aggregate_id).unwrap()))
                .collect();
            assert_eq!(
                db.store.quarantine(&items).await.unwrap().applied(),
                aggs.len()
            );
        }
        DispatchMode::Cursor => {
            let cursors = owned(db, OWNER).await;
            db.store.enqueue(&events).await.unwrap();
            // on PostgreSQL another test's open transaction can hold the read horizon back
            let b = read_until(db, &read_req(&cursors, 100), events.len()).await;
            assert_eq!(b.events.len(), events.len(), "every intent is read");
            let exceptions = b
                .events
                .iter()
                .map(|e| {
                    let ev = &e.event;
                    let kind = match ev.aggregate_version {
                        1 => ExceptionKind::Quarantine(error_of(&ev.aggregate_id).unwrap()),
                        _ => ExceptionKind::Held,
                    };
                    NewException {
                        seq: ev.token.seq,
                        slot: ev.shard_slot,
                        aggregate_id: ev.aggregate_id.clone(),
                        aggregate_version: ev.aggregate_version,
                        attempts: i32::from(ev.aggregate_version == 1),
                        kind,
                    }
                })
                .collect();
            let advance = advance_each(OWNER, &cursors, |slot| b.upto_of(slot), exceptions);
            let r = cs(db).advance(&advance).await.unwrap();
            assert_eq!(r, ferry_core::AdvanceResult::Applied);
        }
    }
    let q = db.store.list_quarantined(100).await.unwrap();
    assert_eq!(q.len(), aggs.len(), "v1 of each aggregate is quarantined");
}

/// Claims whatever is claimable now, acks it, and returns its ids, sorted: one delivery round
/// of a relay (row claims, or cursor dispatch's exception claims).
async fn deliver_round(db: &TestDb, mode: DispatchMode) -> Vec<String> {
    let mut req = crate::fixtures::claim_all(100, LONG);
    let claimed = match mode {
        DispatchMode::Row => db.store.claim(&req).await.unwrap(),
        DispatchMode::Cursor => {
            req.fence = Some(SlotFence {
                owner: OWNER.into(),
            });
            cs(db).claim_exceptions(&req).await.unwrap()
        }
    };
    let tokens: Vec<_> = claimed.iter().map(|c| c.token.clone()).collect();
    let applied = match mode {
        DispatchMode::Row => db.store.ack(&tokens).await.unwrap().applied(),
        DispatchMode::Cursor => {
            let out = ExceptionOutcomes {
                acked: tokens.clone(),
                ..Default::default()
            };
            cs(db).settle_exceptions(&out).await.unwrap().applied()
        }
    };
    assert_eq!(applied, tokens.len());
    let mut ids: Vec<_> = tokens.into_iter().map(|t| t.event_id).collect();
    ids.sort();
    ids
}

async fn state(db: &TestDb, id: &str) -> EventState {
    db.store.record(id).await.unwrap().expect(id).state
}

fn request<'a>(verb: BulkVerb, filter: &'a QuarantineFilter, dry_run: bool) -> BulkRequest<'a> {
    BulkRequest {
        verb,
        filter,
        operator: "alice",
        reason: "topic ACL granted",
        dry_run,
        sample: 10,
    }
}

async fn act(db: &TestDb, req: &BulkRequest<'_>) -> BulkOutcome {
    db.store.bulk_quarantine(req).await.unwrap()
}

/// A dry run counts N and changes nothing; the action then moves exactly those N (one
/// transaction with its record, whose count is N), leaves the other quarantined events alone
/// and keeps order; repeated, it moves none. Bad requests are refused and write nothing.
async fn requeue_by_filter(db: TestDb, mode: DispatchMode) {
    let denied = "TOPIC_AUTHORIZATION_FAILED: not authorized";
    quarantine_v1s(
        &db,
        mode,
        &[
            Agg("a1", "orders", 2, denied),
            Agg("a2", "orders", 2, denied),
            Agg("a3", "orders", 1, denied),
            Agg("b1", "orders", 1, "MSG_SIZE_TOO_LARGE"),
            Agg("c1", "payments", 1, denied),
        ],
    )
    .await;
    let filter = QuarantineFilter {
        topic: Some("orders".into()),
        error_contains: Some("AUTHORIZATION".into()),
        ..Default::default()
    };
    // the dry run: N and a sample, oldest first, nothing changed or recorded
    let dry = act(&db, &request(BulkVerb::Requeue, &filter, true)).await;
    assert_eq!(dry.count, 3);
    assert_eq!(dry.sample, vec!["e-a1-1", "e-a2-1", "e-a3-1"]);
    assert_eq!(state(&db, "e-a1-1").await, EventState::Quarantined);
    assert!(db.store.operator_actions(10).await.unwrap().is_empty());
    // other filters select by aggregate, error case and creation time
    let count = |f: QuarantineFilter| {
        let db = &db;
        async move { act(db, &request(BulkVerb::Requeue, &f, true)).await.count }
    };
    let now = ferry_core::now_micros();
    let by_agg = QuarantineFilter {
        aggregate_id: Some("b1".into()),
        created_since: Some(now - 3_600_000_000),
        ..Default::default()
    };
    assert_eq!(count(by_agg).await, 1);
    let a1 = QuarantineFilter {
        aggregate_id: Some("a1".into()),
        ..Default::default()
    };
    assert_eq!(
        count(a1).await,
        1,
        "only the quarantined version, not v2 behind it"
    );
    let wrong_case = QuarantineFilter {
        error_contains: Some("authorization".into()),
        ..Default::default()
    };
    assert_eq!(
        count(wrong_case).await,
        0,
        "the error match is case-sensitive"
    );
    let all_denied = QuarantineFilter {
        error_contains: Some("AUTHORIZATION".into()),
        created_until: Some(now + 3_600_000_000),
        ..Default::default()
    };
    assert_eq!(count(all_denied).await, 4);
    let before = QuarantineFilter {
        created_until: Some(now - 3_600_000_000),
        ..Default::default()
    };
    assert_eq!(count(before).await, 0);
    // bad requests are refused, change nothing and record nothing
    let empty = QuarantineFilter::default();
    let no_reason = BulkRequest {
        reason: " ",
        ..request(BulkVerb::Requeue, &filter, false)
    };
    let backwards = QuarantineFilter {
        created_since: Some(now),
        created_until: Some(now - 1),
        ..Default::default()
    };
    for (bad, why) in [
        (request(BulkVerb::Requeue, &empty, false), "give a filter"),
        (request(BulkVerb::Skip, &empty, true), "give a filter"),
        (no_reason, "--reason"),
        (request(BulkVerb::Skip, &backwards, false), "--since"),
    ] {
        let e = db.store.bulk_quarantine(&bad).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains(why), "{e}");
    }
    assert!(db.store.operator_actions(10).await.unwrap().is_empty());
    assert_eq!(db.store.list_quarantined(100).await.unwrap().len(), 5);
    // the action moves exactly the N the dry run counted, and records them
    let done = act(&db, &request(BulkVerb::Requeue, &filter, false)).await;
    assert_eq!(done.count, 3);
    for id in ["e-a1-1", "e-a2-1", "e-a3-1"] {
        let r = db.store.record(id).await.unwrap().unwrap();
        assert_eq!((r.state, r.attempts), (EventState::Pending, 0), "{id}");
        assert_eq!(r.resolved_by.as_deref(), Some("alice"));
    }
    for id in ["e-b1-1", "e-c1-1"] {
        assert_eq!(state(&db, id).await, EventState::Quarantined, "{id}");
    }
    let log = db.store.operator_actions(10).await.unwrap();
    assert_eq!(log.len(), 1);
    let r = &log[0];
    assert_eq!(
        (
            r.operator.as_str(),
            r.action.as_str(),
            r.reason.as_str(),
            r.count
        ),
        ("alice", "requeue", "topic ACL granted", 3)
    );
    assert_eq!(r.dispatch, mode.to_string());
    assert_eq!(r.filter, filter);
    assert!(
        (r.at_us - ferry_core::now_micros()).abs() < 600_000_000,
        "{}",
        r.at_us
    );
    // run again at once, nothing matches (the requeued events still carry their last error,
    // but are no longer quarantined): it moves none and records that
    assert_eq!(
        act(&db, &request(BulkVerb::Requeue, &filter, false))
            .await
            .count,
        0
    );
    let log = db.store.operator_actions(10).await.unwrap();
    assert_eq!(log.iter().map(|r| r.count).collect::<Vec<_>>(), vec![0, 3]);
    assert!(log[0].id > log[1].id, "newest first");
    // requeueing keeps order: the v1s go first, their v2s after them
    assert_eq!(
        deliver_round(&db, mode).await,
        vec!["e-a1-1", "e-a2-1", "e-a3-1"]
    );
    assert_eq!(deliver_round(&db, mode).await, vec!["e-a1-2", "e-a2-2"]);
    assert!(deliver_round(&db, mode).await.is_empty());
}

/// Skipping by filter releases each skipped event's successors, still one version at a time,
/// and leaves the quarantined events the filter does not select blocking theirs.
async fn skip_by_filter(db: TestDb, mode: DispatchMode) {
    quarantine_v1s(
        &db,
        mode,
        &[
            Agg("s1", "orders", 3, "schema: field missing"),
            Agg("s2", "orders", 3, "schema: field missing"),
            Agg("k1", "orders", 2, "broker down"),
        ],
    )
    .await;
    assert!(deliver_round(&db, mode).await.is_empty(), "all blocked");
    let filter = QuarantineFilter {
        error_contains: Some("schema".into()),
        ..Default::default()
    };
    let done = act(&db, &request(BulkVerb::Skip, &filter, false)).await;
    assert_eq!(done.count, 2);
    assert_eq!(state(&db, "e-s1-1").await, EventState::Skipped);
    assert_eq!(state(&db, "e-s2-1").await, EventState::Skipped);
    assert_eq!(state(&db, "e-k1-1").await, EventState::Quarantined);
    let again = act(&db, &request(BulkVerb::Skip, &filter, false)).await;
    assert_eq!(again.count, 0, "skipped events are no longer quarantined");
    // the successors go in version order; k1's stay behind its quarantined v1
    assert_eq!(deliver_round(&db, mode).await, vec!["e-s1-2", "e-s2-2"]);
    assert_eq!(deliver_round(&db, mode).await, vec!["e-s1-3", "e-s2-3"]);
    assert!(deliver_round(&db, mode).await.is_empty());
    assert_eq!(state(&db, "e-k1-2").await, EventState::Pending);
    let log = db.store.operator_actions(10).await.unwrap();
    assert_eq!(log.iter().map(|r| r.count).collect::<Vec<_>>(), vec![0, 2]);
    assert_eq!((log[1].action.as_str(), log[1].count), ("skip", 2));
    assert_eq!(log[1].filter, filter);
}

/// The cases in row dispatch (the store suite).
pub(super) mod row {
    use super::*;

    /// A dry run counts N; acting by filter moves exactly those N, records them, keeps order
    /// and leaves the other quarantined events alone; bad requests are refused (row dispatch).
    pub async fn bulk_requeue_moves_exactly_the_matching_events(db: TestDb) {
        requeue_by_filter(db, DispatchMode::Row).await
    }

    /// Skipping by filter releases the skipped events' successors in version order and
    /// records the action (row dispatch).
    pub async fn bulk_skip_releases_successors_in_order(db: TestDb) {
        skip_by_filter(db, DispatchMode::Row).await
    }
}

/// The cases in cursor dispatch (the cursor suite).
pub(super) mod cursor {
    use super::*;

    /// A dry run counts N; acting by filter moves exactly those N, records them, keeps order
    /// and leaves the other quarantined events alone; bad requests are refused (cursor dispatch).
    pub async fn bulk_requeue_moves_exactly_the_matching_events(db: TestDb) {
        requeue_by_filter(db, DispatchMode::Cursor).await
    }

    /// Skipping by filter releases the skipped events' successors in version order and
    /// records the action (cursor dispatch).
    pub async fn bulk_skip_releases_successors_in_order(db: TestDb) {
        skip_by_filter(db, DispatchMode::Cursor).await
    }
}
