use std::collections::{BTreeMap, VecDeque};

use super::check::{check_delivery, check_versions, payload, tag_of, Delivered, Intent};
use super::model::{arrange, explore, Locking, Model, Outcome};
use super::op::{Op, A, B, C};
use super::plan::*;
use super::server::innodb_lock_waits;

const PG: Locking = Locking::Postgres;
const MY: Locking = Locking::Mariadb;

fn fixed(plan: Plan) -> Vec<(usize, Op)> {
    match plan {
        Plan::Fixed(steps) => steps,
        Plan::Explore(_) => unreachable!(),
    }
}

/// Versions each session's inserts got, by replaying an order on the model.
fn inserted(locking: Locking, order: &[(usize, Op)]) -> Vec<(usize, i64)> {
    let mut m = Model::new(locking, 3);
    let mut out = Vec::new();
    let mut ops: Vec<VecDeque<Op>> = vec![VecDeque::new(); 3];
    for &(s, op) in order {
        ops[s].push_back(op);
        for (r, o) in m.issue(s, op).unwrap() {
            let op = ops[r].pop_front().unwrap();
            if matches!(op, Op::Insert(_) | Op::Optimistic(_)) {
                out.push((r, o.version.unwrap()));
            }
        }
    }
    out
}

#[test]
fn the_issue_schedule_makes_the_later_transaction_id_write_v1() {
    let order = arrange(PG, 2, &fixed(cross_xid())).unwrap();
    assert_eq!(order, fixed(cross_xid()), "nothing deferred on PostgreSQL");
    // B (the later transaction id) writes v1, A v2
    assert_eq!(inserted(PG, &order), vec![(B, 1), (A, 2)]);
    // SQLite: B waits for A's write lock; B's insert waits with it
    let lite = arrange(Locking::OneWriter, 2, &fixed(cross_xid())).unwrap();
    assert_eq!(inserted(Locking::OneWriter, &lite), vec![(A, 1), (B, 2)]);
}

#[test]
fn savepoints_release_row_locks_on_mariadb_only_before_a_write() {
    let steps = fixed(savepoint_lock());
    for locking in [PG, MY] {
        let order = arrange(locking, 2, &steps).unwrap();
        assert_eq!(inserted(locking, &order), vec![(B, 1), (A, 1), (B, 2)]);
    }
    let steps = fixed(savepoint_lock_after_write());
    let pg = arrange(PG, 2, &steps).unwrap();
    assert_eq!(inserted(PG, &pg), vec![(B, 1), (A, 1), (B, 2)]);
    let my = arrange(MY, 2, &steps).unwrap();
    assert_eq!(inserted(MY, &my), vec![(B, 1), (B, 1), (A, 2)]);
}

#[test]
fn optimistic_writers_retry_after_the_winner_commits() {
    let order = arrange(PG, 3, &fixed(optimistic())).unwrap();
    let mut m = Model::new(PG, 3);
    let mut outcomes = Vec::new();
    for &(s, op) in &order {
        outcomes.extend(m.issue(s, op).unwrap());
    }
    let versions: Vec<(usize, Outcome)> = outcomes
        .into_iter()
        .filter(|(_, o)| o.version.is_some())
        .collect();
    assert_eq!(
        versions,
        vec![
            (A, Outcome::version(1)),
            (B, Outcome::version(1)),
            (
                A,
                Outcome {
                    version: Some(2),
                    conflicts: 1
                }
            ),
            (
                C,
                Outcome {
                    version: Some(3),
                    conflicts: 1
                }
            ),
        ]
    );
}

#[test]
fn every_fixed_schedule_can_finish_everywhere() {
    for plan in [
        cross_xid,
        three_queued,
        two_versions,
        savepoint_rolled_back,
        savepoint_lock,
        savepoint_lock_after_write,
        lock_for_update,
        optimistic,
    ] {
        let steps = fixed(plan());
        for locking in [PG, MY, Locking::OneWriter] {
            let order = arrange(locking, 3, &steps).unwrap();
            assert_eq!(order.len(), steps.len());
        }
    }
}

#[test]
fn the_explorer_finds_every_interleaving_and_no_deadlock() {
    let Plan::Explore(two) = explore_two() else {
        unreachable!()
    };
    let orders = explore(PG, &two);
    assert_eq!(orders.len(), 12);
    // the issue's order is one of them
    assert!(orders.contains(&vec![A, B, B, A, B, A, A]));
    assert_eq!(explore(Locking::OneWriter, &two).len(), 7);
    let Plan::Explore(three) = explore_three() else {
        unreachable!()
    };
    assert_eq!(explore(PG, &three).len(), 222);
    // Y then X against X then Y deadlocks: only the orders that avoid it are kept
    let crossed = vec![
        vec![Op::Bump("Y"), Op::Bump("X"), Op::Commit],
        vec![Op::Bump("X"), Op::Bump("Y"), Op::Commit],
    ];
    for order in explore(PG, &crossed) {
        assert!(
            order.starts_with(&[A, A]) || order.starts_with(&[B, B]),
            "{order:?}"
        );
    }
}

fn d(tag: &str, agg: &str, version: i64) -> Delivered {
    Delivered {
        tag: tag.into(),
        agg: agg.into(),
        version,
        at: format!("@{tag}"),
    }
}

fn i(tag: &str, agg: &str, version: i64) -> Intent {
    Intent {
        tag: tag.into(),
        agg: agg.into(),
        version,
    }
}

#[test]
fn delivery_check_names_each_problem() {
    let committed = [i("t1", "x", 1), i("t2", "x", 2), i("t3", "y", 1)];
    let gone = [i("t9", "x", 2)];
    let good = [d("t1", "x", 1), d("t3", "y", 1), d("t2", "x", 2)];
    assert!(check_delivery(&good, &committed, &gone).is_empty());
    let swapped = [d("t2", "x", 2), d("t1", "x", 1), d("t3", "y", 1)];
    assert_eq!(
        check_delivery(&swapped, &committed, &gone),
        vec!["x: v2 (at @t2) was delivered before v1 (at @t1)"]
    );
    let p = check_delivery(
        &[d("t1", "x", 1), d("t9", "x", 2), d("t1", "x", 1)],
        &committed,
        &gone,
    );
    assert_eq!(p.len(), 4, "{p:?}");
    assert!(p[0].contains("rolled back"), "{p:?}");
    assert!(p[1].contains("twice"), "{p:?}");
    assert!(p[2].contains("never delivered") && p[3].contains("never delivered"));
    assert_eq!(
        check_versions(&[i("a", "x", 1), i("b", "x", 3)]),
        vec!["x: committed versions [1, 3], want [1, 2]"]
    );
}

#[test]
fn innodb_status_lists_lock_waits_by_connection() {
    let status = "TRANSACTIONS\n------------\nTrx id counter 43\n\
        LIST OF TRANSACTIONS FOR EACH SESSION:\n\
        ---TRANSACTION 42, ACTIVE 0 sec starting index read\n\
        mysql tables in use 1, locked 1\n\
        LOCK WAIT 2 lock struct(s), heap size 1128, 1 row lock(s)\n\
        MariaDB thread id 139, OS thread handle 1, query id 297 127.0.0.1 root Statistics\n\
        SELECT v FROM t WHERE id=1 FOR UPDATE\n\
        ------- TRX HAS BEEN WAITING 296479 us FOR THIS LOCK TO BE GRANTED:\n\
        ------------------\n\
        ---TRANSACTION 41, ACTIVE 1 sec\n\
        2 lock struct(s), heap size 1128, 1 row lock(s), undo log entries 1\n\
        MariaDB thread id 138, OS thread handle 2, query id 294 127.0.0.1 root User sleep\n\
        SELECT SLEEP(1.5)\n--------\nFILE I/O\nLOCK WAIT nothing of a transaction\n";
    let waits = innodb_lock_waits(status);
    assert_eq!(waits, BTreeMap::from([(139, true), (138, false)]));
}

#[test]
fn payload_tags_round_trip() {
    assert_eq!(tag_of(&payload("e3-B2")), "e3-B2");
}
