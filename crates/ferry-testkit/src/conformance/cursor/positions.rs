//! Per-slot read positions: readers of slot subsets, a lagging slot, a reader behind many
//! ticks.
use std::time::Duration;

use ferry_core::{CursorPos, CursorRead, NewEvent, SlotCursor, SlotId};

use super::relay::{cs, ev, ids, owned, read_on, read_req, read_until};
use crate::db::TestDb;

/// Readers of slot subsets, as relays own them (contiguous ranges, `desired_slots`; a single
/// slot; a set with gaps, as workers of one relay split it): each gets exactly the intents of
/// its own slots, every one of them once, in per-aggregate order.
pub async fn slot_subset_readers_get_exactly_their_slots(db: TestDb) {
    let cursors = owned(&db, "a").await;
    let evs: Vec<NewEvent> = (0..300)
        .map(|n| ev(&format!("s{}", n % 97), n / 97 + 1))
        .collect();
    db.store.enqueue(&evs).await.unwrap();
    let slot = |e: &NewEvent| ferry_core::slot_for(&e.aggregate_id);
    let one = slot(&evs[0]);
    let readers: Vec<Vec<SlotId>> = vec![
        (0..128).collect(),
        (128..256).collect(),
        vec![one],
        (0..256).filter(|s| s % 3 == 1).collect(),
    ];
    for slots in readers {
        let mine: Vec<&NewEvent> = evs.iter().filter(|e| slots.contains(&slot(e))).collect();
        let from: Vec<(SlotId, CursorPos)> = cursors
            .iter()
            .filter(|c| slots.contains(&c.slot))
            .map(|c| (c.slot, c.pos))
            .collect();
        let b = read_until(&db, &CursorRead { from, limit: 1000 }, mine.len()).await;
        assert!(
            b.events.iter().all(|e| slots.contains(&e.event.shard_slot)),
            "a read returned another reader's slot"
        );
        let mut got: Vec<(String, i64)> = b
            .events
            .iter()
            .map(|e| (e.event.aggregate_id.clone(), e.event.aggregate_version))
            .collect();
        let mut sorted = got.clone();
        sorted.sort();
        // per aggregate in version order: a stable sort by aggregate leaves versions ascending
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got, sorted, "versions of an aggregate out of order");
        let mut want: Vec<(String, i64)> = mine
            .iter()
            .map(|e| (e.aggregate_id.clone(), e.aggregate_version))
            .collect();
        want.sort();
        assert_eq!(
            sorted,
            want,
            "{} slots: every intent of the reader's slots once",
            slots.len()
        );
    }
    db.cleanup().await;
}

/// A slot far behind the others (its read was cut before an aggregate still in flight while
/// the others went on) holds nobody back: the next read returns the others' new intents too,
/// not only rows of the lagging slot's range, and reading on delivers every intent of every
/// slot once, in per-aggregate order.
pub async fn a_lagging_slot_holds_the_others_back_no_longer(db: TestDb) {
    let cursors = owned(&db, "a").await;
    let lag_slot = ferry_core::slot_for("lag");
    // other aggregates, none on the lagging slot
    let others: Vec<String> = (0..400)
        .map(|n| format!("o{n}"))
        .filter(|a| ferry_core::slot_for(a) != lag_slot)
        .take(50)
        .collect();
    let mut first: Vec<NewEvent> = (1..=5).map(|v| ev("lag", v)).collect();
    first.extend((0..195).map(|n| ev(&others[n % 50], (n / 50) as i64 + 1)));
    db.store.enqueue(&first).await.unwrap();
    let all = read_req(&cursors, 1000);
    let b = read_until(&db, &all, first.len()).await;
    assert_eq!(b.events.len(), first.len());
    // every slot read through the first enqueue except the lagging one, which stays put
    let mut from: Vec<(SlotId, CursorPos)> = cursors
        .iter()
        .map(|c| {
            let to = if c.slot == lag_slot {
                c.pos
            } else {
                b.upto_of(c.slot)
            };
            (c.slot, to)
        })
        .collect();
    let second: Vec<NewEvent> = (0..20).map(|n| ev(&others[n], 5)).collect();
    db.store.enqueue(&second).await.unwrap();
    // wait until the second enqueue is readable at all (behind the horizon or tick)
    let leaders: Vec<(SlotId, CursorPos)> = from
        .iter()
        .copied()
        .filter(|(s, _)| *s != lag_slot)
        .collect();
    let seen = read_until(
        &db,
        &CursorRead {
            from: leaders,
            limit: 1000,
        },
        second.len(),
    )
    .await;
    assert_eq!(seen.events.len(), second.len());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut got: Vec<(String, i64)> = Vec::new();
    let mut first_read = true;
    while got.len() < 5 + second.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "read {} of {} intents",
            got.len(),
            5 + second.len()
        );
        let b = read_on(&db, &mut from, 10).await;
        if first_read && !b.events.is_empty() {
            first_read = false;
            assert!(
                b.events.iter().any(|e| e.event.aggregate_id != "lag"),
                "the first read behind a lagging slot returned only that slot's rows: {:?}",
                b.events
                    .iter()
                    .map(|e| (&e.event.aggregate_id, e.event.aggregate_version))
                    .collect::<Vec<_>>()
            );
        }
        if b.events.is_empty() && !b.more {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        got.extend(
            b.events
                .iter()
                .map(|e| (e.event.aggregate_id.clone(), e.event.aggregate_version)),
        );
    }
    let mut by_agg = got.clone();
    by_agg.sort_by(|a, b| a.0.cmp(&b.0));
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(by_agg, sorted, "versions of an aggregate out of order");
    let mut want: Vec<(String, i64)> = (1..=5).map(|v| ("lag".to_string(), v)).collect();
    want.extend(
        second
            .iter()
            .map(|e| (e.aggregate_id.clone(), e.aggregate_version)),
    );
    want.sort();
    assert_eq!(
        sorted, want,
        "every intent behind the positions once, nothing else"
    );
    db.cleanup().await;
}

/// Reads by several readers take many ticks (PostgreSQL: one per caught-up read); a reader
/// behind them reads all of them, in pieces cut at a small limit or in one call, and gets every
/// intent of its slots exactly once, in position and per-aggregate order, including one whose
/// transaction stayed open across many ticks and committed late (and never a rolled-back one).
pub async fn a_reader_behind_many_ticks_misses_nothing(db: TestDb) {
    let cursors = owned(&db, "a").await;
    let even = |slot: SlotId| slot.is_multiple_of(2);
    let (evens, odds): (Vec<SlotCursor>, Vec<SlotCursor>) =
        cursors.iter().partition(|c| even(c.slot));
    let late = db
        .open_producer_tx(&[ev("late-even", 1), ev("late-odd", 1)])
        .await;
    let rolled = db
        .open_producer_tx(&[ev("gone-even", 1), ev("gone-odd", 1)])
        .await;
    let mut odd_from: Vec<(SlotId, CursorPos)> = odds.iter().map(|c| (c.slot, c.pos)).collect();
    let mut odd_seen = Vec::new();
    let mut expected = 0;
    let mut late = late;
    let mut rolled = rolled;
    for i in 0..40 {
        let evs: Vec<NewEvent> = (0..3)
            .map(|k| {
                let n = i * 3 + k;
                ev(&format!("a{}", n % 11), n + 1)
            })
            .collect();
        db.store.enqueue(&evs).await.unwrap();
        expected += evs.len();
        // the odd reader, caught up, takes a tick on every read
        let b = read_on(&db, &mut odd_from, 1000).await;
        odd_seen.extend(b.events.iter().map(|e| e.event.token.event_id.clone()));
        if i == 20 {
            if let Some(tx) = late.take() {
                tx.commit().await;
                expected += 2;
            }
            if let Some(tx) = rolled.take() {
                tx.rollback().await;
            }
        }
    }
    let slot_of = |e: &ferry_core::CursorEvent| e.event.shard_slot;
    // the even reader, behind every tick, in pieces of 4
    let mut from: Vec<(SlotId, CursorPos)> = evens.iter().map(|c| (c.slot, c.pos)).collect();
    let mut pieces = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let b = read_on(&db, &mut from, 4).await;
        assert!(b.events.len() <= 4);
        assert!(b.events.iter().all(|e| even(slot_of(e))));
        pieces.extend(b.events.iter().cloned());
        let odd_total = odd_seen.len();
        let have = pieces.len() + odd_total;
        if (have >= expected && !b.more) || tokio::time::Instant::now() > deadline {
            break;
        }
        if !b.more {
            // the odd reader keeps reading too (another test's open transaction may hold rows
            // in a later window for a while)
            let b = read_on(&db, &mut odd_from, 1000).await;
            odd_seen.extend(b.events.iter().map(|e| e.event.token.event_id.clone()));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(
        pieces.windows(2).all(|w| w[0].pos < w[1].pos),
        "positions ascend"
    );
    let ids: Vec<String> = pieces
        .iter()
        .map(|e| e.event.token.event_id.clone())
        .collect();
    let mut all: Vec<String> = ids.iter().chain(&odd_seen).cloned().collect();
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "no intent read twice");
    assert_eq!(n, expected, "every committed intent read once");
    assert!(
        !all.iter().any(|id| id.starts_with("e-gone")),
        "a rolled-back intent"
    );
    for agg in (0..11).map(|a| format!("a{a}")) {
        let vs: Vec<i64> = pieces
            .iter()
            .filter(|e| e.event.aggregate_id == agg)
            .map(|e| e.event.aggregate_version)
            .collect();
        assert!(vs.windows(2).all(|w| w[0] < w[1]), "{agg}: {vs:?}");
    }
    // one call from the start reads every span there is
    let all_even = evens.iter().map(|c| (c.slot, c.pos)).collect();
    let one_ids = read_everything(&db, all_even).await;
    assert_eq!(
        one_ids, ids,
        "one call reads what the pieces read, in the same order"
    );
    // slots at different positions: half of them from the start, half from the middle
    let mid = pieces[pieces.len() / 2].pos;
    let staggered: Vec<(SlotId, CursorPos)> = evens
        .iter()
        .map(|c| (c.slot, if c.slot.is_multiple_of(4) { c.pos } else { mid }))
        .collect();
    let want: Vec<String> = pieces
        .iter()
        .filter(|e| slot_of(e).is_multiple_of(4) || e.pos > mid)
        .map(|e| e.event.token.event_id.clone())
        .collect();
    let got = read_everything(&db, staggered.clone()).await;
    assert_eq!(got, want, "per-slot positions");
    // and cut at a small limit: each slot's intents once, in order (slots far behind the
    // others may be read beside them, so the order across slots can differ)
    let per_slot = |v: Vec<(SlotId, String)>| {
        let mut m: std::collections::BTreeMap<SlotId, Vec<String>> = Default::default();
        for (s, id) in v {
            m.entry(s).or_default().push(id);
        }
        m
    };
    let want = per_slot(
        pieces
            .iter()
            .filter(|e| slot_of(e).is_multiple_of(4) || e.pos > mid)
            .map(|e| (slot_of(e), e.event.token.event_id.clone()))
            .collect(),
    );
    let mut from = staggered;
    let mut got = Vec::new();
    for _ in 0..1000 {
        let b = read_on(&db, &mut from, 3).await;
        got.extend(
            b.events
                .iter()
                .map(|e| (slot_of(e), e.event.token.event_id.clone())),
        );
        if !b.more && b.events.is_empty() {
            break;
        }
    }
    assert_eq!(per_slot(got), want, "per-slot positions, in pieces");
    if db.backend == ferry_store::Backend::Postgres {
        assert!(
            pieces.last().unwrap().pos.tick > 20,
            "the odd reader took many ticks: {:?}",
            pieces.last().unwrap().pos
        );
    }
    db.cleanup().await;
}

/// The event ids of one read past `from` with a limit no read here reaches, in read order.
async fn read_everything(db: &TestDb, from: Vec<(SlotId, CursorPos)>) -> Vec<String> {
    let b = cs(db)
        .read_batch(&CursorRead {
            from,
            limit: 100_000,
        })
        .await
        .unwrap();
    ids(&b).into_iter().map(String::from).collect()
}
