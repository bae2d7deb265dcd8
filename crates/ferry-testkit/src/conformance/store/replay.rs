//! Replay's reads (row dispatch): what a range matches, pages in per-aggregate version order,
//! and the retention watermark purge raises. The cursor-dispatch side, and the replay through
//! Kafka, are run per backend and mode by `crates/ferry-relay/tests/replay.rs`.
use ferry_core::replay::{check_replay, ReplayFilter, ReplayPageRequest, ReplayRefusal};
use ferry_core::{ClaimedEvent, OutboxStore};

use super::relay::{ev, req, tokens, LONG};
use crate::db::TestDb;

/// Claims and acks everything due (row dispatch), until nothing is left.
async fn ack_all(store: &dyn OutboxStore) {
    loop {
        let c = store.claim(&req(1000, LONG)).await.unwrap();
        if c.is_empty() {
            return;
        }
        store.ack(&tokens(&c)).await.unwrap();
    }
}

/// Every page of `filter`, `limit` at a time.
pub(crate) async fn all_pages(
    store: &dyn OutboxStore,
    filter: &ReplayFilter,
    limit: usize,
) -> Vec<ClaimedEvent> {
    let mut out: Vec<ClaimedEvent> = Vec::new();
    loop {
        let after = out
            .last()
            .map(|e| (e.aggregate_id.clone(), e.aggregate_version));
        let page = store
            .replay_page(&ReplayPageRequest {
                filter,
                after,
                limit,
            })
            .await
            .unwrap();
        if page.is_empty() {
            return out;
        }
        assert!(page.len() <= limit);
        out.extend(page);
    }
}

fn ids(events: &[ClaimedEvent]) -> Vec<String> {
    events.iter().map(|e| e.token.event_id.clone()).collect()
}

fn orders(from: Option<i64>, to: Option<i64>) -> ReplayFilter {
    ReplayFilter {
        topics: vec!["orders".into()],
        aggregates: vec![],
        from,
        to,
    }
}

/// A time range matches exactly the SENT events created in it (three enqueue transactions:
/// the middle one's bounds select it and nothing else), pages come in per-aggregate version
/// order whatever the page size, an aggregate filter narrows them, an event that is not SENT
/// is counted apart and not returned, and a topic with no row is unknown.
pub async fn replay_reads_exactly_the_sent_events_of_a_range(db: TestDb) {
    let s = &*db.store;
    s.enqueue(&[ev("a", 1), ev("b", 1)]).await.unwrap();
    s.enqueue(&[ev("a", 2), ev("b", 2), ev("c", 1), ev("a", 3)])
        .await
        .unwrap();
    ack_all(s).await;
    s.enqueue(&[ev("a", 4), ev("c", 2)]).await.unwrap();
    ack_all(s).await;
    // in the middle transaction's range, but never claimed: not replayed
    let everything = all_pages(s, &orders(None, None), 1000).await;
    assert_eq!(everything.len(), 8);
    let middle: Vec<&ClaimedEvent> = everything
        .iter()
        .filter(|e| ["e-a-2", "e-b-2", "e-c-1", "e-a-3"].contains(&e.token.event_id.as_str()))
        .collect();
    let from = middle.iter().map(|e| e.created_at).min().unwrap();
    let to = middle.iter().map(|e| e.created_at).max().unwrap();
    let f = orders(Some(from), Some(to));
    for limit in [1, 2, 1000] {
        let got = all_pages(s, &f, limit).await;
        assert_eq!(
            ids(&got),
            ["e-a-2", "e-a-3", "e-b-2", "e-c-1"],
            "page size {limit}: exactly the middle transaction, each aggregate in version order"
        );
        assert!(got
            .iter()
            .all(|e| e.topic == "orders" && e.key == e.aggregate_id));
    }
    let scan = s.replay_scan(&f).await.unwrap();
    assert_eq!(scan.len(), 1);
    assert!(scan[0].known);
    assert_eq!((scan[0].matched, scan[0].not_sent), (4, 0));
    assert_eq!(check_replay(&f, &scan), Ok(4));

    // an aggregate filter, and an event of the range that is not SENT
    s.enqueue(&[ev("d", 1)]).await.unwrap();
    let open = orders(Some(from), None);
    let scan = s.replay_scan(&open).await.unwrap();
    assert_eq!((scan[0].matched, scan[0].not_sent), (6, 1));
    let only_a = ReplayFilter {
        aggregates: vec!["a".into(), "c".into()],
        ..open.clone()
    };
    assert_eq!(
        ids(&all_pages(s, &only_a, 2).await),
        ["e-a-2", "e-a-3", "e-a-4", "e-c-1", "e-c-2"]
    );

    // no row ever: unknown; a range after everything: 0 matched
    let nope = ReplayFilter {
        topics: vec!["nope".into()],
        ..orders(None, None)
    };
    let scan = s.replay_scan(&nope).await.unwrap();
    assert!(!scan[0].known);
    assert_eq!(
        check_replay(&nope, &scan),
        Err(ReplayRefusal::UnknownTopic("nope".into()))
    );
    let later = orders(Some(to + 3_600_000_000), None);
    let scan = s.replay_scan(&later).await.unwrap();
    assert!(matches!(
        check_replay(&later, &scan),
        Err(ReplayRefusal::NothingMatched { .. })
    ));
    // reads write nothing
    assert_eq!(db.count("ferry_outbox").await, 9);
}

/// Purge raises the topic's retention watermark to the newest `created_at` it deleted, in the
/// delete's own transaction; a range starting at or before it is refused, naming the gap, and
/// one starting after it is not. A dry run raises nothing; the topic stays known with no row.
pub async fn purge_raises_the_retention_watermark(db: TestDb) {
    let s = &*db.store;
    s.enqueue(&[ev("a", 1), ev("b", 1)]).await.unwrap();
    s.enqueue(&[ev("a", 2)]).await.unwrap();
    ack_all(s).await;
    let before = all_pages(s, &orders(None, None), 100).await;
    let newest = before.iter().map(|e| e.created_at).max().unwrap();
    let dry = ferry_core::PurgeRequest {
        dry_run: true,
        ..crate::fixtures::purge_all(1)
    };
    assert_eq!(s.purge_sent(&dry).await.unwrap(), 3);
    assert_eq!(
        s.replay_scan(&orders(None, None)).await.unwrap()[0].retention,
        None
    );
    // batches of one: three statements, the mark the newest of all
    assert_eq!(
        s.purge_sent(&crate::fixtures::purge_all(1)).await.unwrap(),
        3
    );
    let scan = s.replay_scan(&orders(None, None)).await.unwrap();
    let mark = scan[0].retention.expect("a watermark after a purge");
    assert_eq!(mark.purged_created_at, newest);
    assert!(scan[0].known, "a purged topic stays known");
    for from in [None, Some(newest), Some(newest - 1)] {
        let f = orders(from, None);
        let refused = check_replay(&f, &s.replay_scan(&f).await.unwrap());
        let Err(e @ ReplayRefusal::RetentionCut { .. }) = refused else {
            panic!("from {from:?}: {refused:?}")
        };
        assert!(e
            .to_string()
            .starts_with("retention removed events of topic orders created before "));
    }
    // a later event, after the watermark: replayable
    s.enqueue(&[ev("a", 3)]).await.unwrap();
    ack_all(s).await;
    let f = orders(Some(newest + 1), None);
    assert_eq!(check_replay(&f, &s.replay_scan(&f).await.unwrap()), Ok(1));
    assert_eq!(
        db.count("ferry_retention_mark").await,
        1,
        "one mark per topic"
    );
}
