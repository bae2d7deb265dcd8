//! The Inbox conformance suite: every test runs against SQLite, PostgreSQL and MariaDB
//! (modules `sqlite`, `postgres`, `mysql`).
//!
//! Each test gets its own database from `ferry_testkit::TestDb` and connects its own
//! inbox pool to it. The effect under test writes two things in the consumer's transaction:
//! a row in `inbox_effects` (no keys at all, so a double application would show as two rows)
//! and an increment of a per-aggregate projection counter in `inbox_projection`.
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use ferry_core::BoxFuture;
use ferry_inbox::{
    Baseline, BoxError, Conn, Delivery, GapPolicy, Inbox, InboxConfig, InboxError, InboxPool,
    Verdict,
};
use ferry_store::Backend;
use ferry_testkit::TestDb;
use sqlx::{Connection, Executor};

const EFFECTS: &str = "CREATE TABLE inbox_effects (consumer VARCHAR(255) NOT NULL, \
    event_id VARCHAR(255) NOT NULL, aggregate_id VARCHAR(255) NOT NULL, version BIGINT NOT NULL)";
const PROJECTION: &str = "CREATE TABLE inbox_projection (consumer VARCHAR(255) NOT NULL, \
    aggregate_id VARCHAR(255) NOT NULL, applied BIGINT NOT NULL, last_version BIGINT NOT NULL, \
    PRIMARY KEY (consumer, aggregate_id))";

/// Creates the effect tables and connects an inbox (migrated) with `config`.
async fn setup(db: &TestDb, config: InboxConfig) -> Inbox {
    db.exec(EFFECTS).await.unwrap();
    db.exec(PROJECTION).await.unwrap();
    Inbox::connect(&db.url, config).await.unwrap()
}

/// The projection update: one effect row, and the aggregate's counter + 1.
fn effect<'c>(c: Conn<'c>, d: &'c Delivery) -> BoxFuture<'c, Result<(), BoxError>> {
    macro_rules! run {
        ($c:expr, $log:expr, $upd:expr, $ins:expr) => {{
            sqlx::query($log)
                .bind(&d.consumer)
                .bind(&d.event_id)
                .bind(&d.aggregate_id)
                .bind(d.aggregate_version)
                .execute(&mut *$c)
                .await?;
            let n = sqlx::query($upd)
                .bind(d.aggregate_version)
                .bind(&d.consumer)
                .bind(&d.aggregate_id)
                .execute(&mut *$c)
                .await?
                .rows_affected();
            if n == 0 {
                sqlx::query($ins)
                    .bind(&d.consumer)
                    .bind(&d.aggregate_id)
                    .bind(d.aggregate_version)
                    .execute(&mut *$c)
                    .await?;
            }
        }};
    }
    Box::pin(async move {
        match c {
            Conn::Postgres(c) => run!(
                c,
                "INSERT INTO inbox_effects VALUES ($1, $2, $3, $4)",
                "UPDATE inbox_projection SET applied = applied + 1, last_version = $1 \
                 WHERE consumer = $2 AND aggregate_id = $3",
                "INSERT INTO inbox_projection VALUES ($1, $2, 1, $3)"
            ),
            Conn::Mysql(c) => run!(
                c,
                "INSERT INTO inbox_effects VALUES (?, ?, ?, ?)",
                "UPDATE inbox_projection SET applied = applied + 1, last_version = ? \
                 WHERE consumer = ? AND aggregate_id = ?",
                "INSERT INTO inbox_projection VALUES (?, ?, 1, ?)"
            ),
            Conn::Sqlite(c) => run!(
                c,
                "INSERT INTO inbox_effects VALUES (?, ?, ?, ?)",
                "UPDATE inbox_projection SET applied = applied + 1, last_version = ? \
                 WHERE consumer = ? AND aggregate_id = ?",
                "INSERT INTO inbox_projection VALUES (?, ?, 1, ?)"
            ),
        }
        Ok(())
    })
}

/// An inbox with `policy` on `db`; the effect tables are created with the first policy of a
/// loop over policies ([`GapPolicy::Off`]).
async fn connect_once_per_policy(db: &TestDb, policy: GapPolicy) -> Inbox {
    if policy == GapPolicy::Off {
        db.exec(EFFECTS).await.unwrap();
        db.exec(PROJECTION).await.unwrap();
    }
    Inbox::connect(&db.url, InboxConfig::new(policy))
        .await
        .unwrap()
}

/// Applies `d` through `inbox` with the test effect; the verdict.
async fn apply(inbox: &Inbox, d: &Delivery) -> Verdict {
    inbox.apply_once(d, effect).await.unwrap()
}

/// [`apply`], retrying transient failures (deadlocks, lock waits) up to 50 times.
async fn apply_retrying(inbox: &Inbox, d: &Delivery) -> Verdict {
    let mut tries = 0;
    loop {
        match inbox.apply_once(d, effect).await {
            Ok(v) => return v,
            Err(e) if e.is_transient() && tries < 50 => tries += 1,
            Err(e) => panic!("{}: {e}", d.event_id),
        }
    }
}

/// The verdict for version `got` when `expected` is the next one: applied and reported.
fn gap(expected: i64, got: i64) -> Verdict {
    Verdict::Gap { expected, got }
}

/// The verdict for version `got` when `expected` is the next one: held back.
fn early(expected: i64, got: i64) -> Verdict {
    Verdict::Early { expected, got }
}

fn failing_effect<'c>(c: Conn<'c>, d: &'c Delivery) -> BoxFuture<'c, Result<(), BoxError>> {
    Box::pin(async move {
        effect(c, d).await?;
        Err("the projection rejected the event".into())
    })
}

/// Effect rows written for `event_id` (all consumers).
async fn effects(db: &TestDb, event_id: &str) -> i64 {
    assert!(event_id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-'));
    db.count(&format!("inbox_effects WHERE event_id = '{event_id}'"))
        .await
}

/// The projection counter of `(consumer, aggregate)`: `(applied, last_version)`.
async fn projection(inbox: &Inbox, consumer: &str, aggregate: &str) -> Option<(i64, i64)> {
    let sql = "SELECT applied, last_version FROM inbox_projection \
               WHERE consumer = ? AND aggregate_id = ?";
    let sql = ferry_testkit::placeholder(sql, inbox.pool().backend() == Backend::Postgres);
    ferry_testkit::on_inbox!(InboxPool, inbox.pool(), p => sqlx::query_as(&sql)
        .bind(consumer)
        .bind(aggregate)
        .fetch_optional(p)
        .await
        .unwrap())
}

/// The consumer's own transaction, by hand: begin, `record`, apply the effect when the verdict
/// says so, then commit or roll back as told.
async fn in_own_tx(inbox: &Inbox, d: &Delivery, commit: bool) -> Result<Verdict, InboxError> {
    let cfg = *inbox.config();
    macro_rules! run {
        ($tx:expr, $m:ident, $variant:ident) => {{
            let mut tx = $tx.unwrap();
            let v = ferry_inbox::$m::record(&mut tx, &cfg, d).await?;
            if v.should_apply() {
                effect(Conn::$variant(&mut tx), d).await.unwrap();
            }
            if commit {
                tx.commit().await.unwrap();
            } else {
                tx.rollback().await.unwrap();
            }
            Ok(v)
        }};
    }
    match inbox.pool() {
        InboxPool::Postgres(p) => run!(p.begin().await, postgres, Postgres),
        InboxPool::Mysql(p) => run!(p.begin().await, mysql, Mysql),
        InboxPool::Sqlite(p) => run!(p.begin_with("BEGIN IMMEDIATE").await, sqlite, Sqlite),
    }
}

fn ids(v: &[&str]) -> HashSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------- dedupe

async fn duplicate_applies_effect_once(db: TestDb) {
    let inbox = setup(&db, InboxConfig::default()).await;
    let d = Delivery::new("billing", "e-7-1", "order-7", 1);
    assert_eq!(apply(&inbox, &d).await, Verdict::New);
    assert_eq!(apply(&inbox, &d).await, Verdict::Duplicate);
    // and once more through the caller's own transaction
    assert_eq!(
        in_own_tx(&inbox, &d, true).await.unwrap(),
        Verdict::Duplicate
    );
    assert_eq!(effects(&db, "e-7-1").await, 1);
    assert_eq!(projection(&inbox, "billing", "order-7").await, Some((1, 1)));
    assert_eq!(
        inbox
            .consumed("billing", &["e-7-1", "e-7-2"])
            .await
            .unwrap(),
        ids(&["e-7-1"])
    );
    assert_eq!(db.count("ferry_inbox").await, 1);
    assert!(inbox.gaps("billing").await.unwrap().is_empty());
}

async fn rollback_leaves_no_record(db: TestDb) {
    let inbox = setup(&db, InboxConfig::default()).await;
    let d = Delivery::new("billing", "e-7-1", "order-7", 1);
    // the consumer's transaction records and applies, then rolls back
    assert_eq!(in_own_tx(&inbox, &d, false).await.unwrap(), Verdict::New);
    assert_eq!(db.count("ferry_inbox").await, 0);
    assert_eq!(effects(&db, "e-7-1").await, 0);
    assert!(inbox
        .consumed("billing", &["e-7-1"])
        .await
        .unwrap()
        .is_empty());
    // an effect that fails rolls the record back too
    let e = inbox.apply_once(&d, failing_effect).await.unwrap_err();
    assert!(matches!(e, InboxError::Effect(_)), "{e:?}");
    assert!(!e.is_transient());
    assert_eq!(db.count("ferry_inbox").await, 0);
    assert_eq!(effects(&db, "e-7-1").await, 0);
    // the redelivery is new and applies once
    assert_eq!(apply(&inbox, &d).await, Verdict::New);
    assert_eq!(effects(&db, "e-7-1").await, 1);
    assert_eq!(projection(&inbox, "billing", "order-7").await, Some((1, 1)));
    assert_eq!(
        inbox.consumed("billing", &["e-7-1"]).await.unwrap(),
        ids(&["e-7-1"])
    );
}

// ---------------------------------------------------------------- concurrency

/// How transaction B runs in [`concurrent_delivery_waits_for_the_first`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum Iso {
    /// The pool's level (PostgreSQL: READ COMMITTED; MariaDB pool: READ COMMITTED).
    Default,
    /// REPEATABLE READ (MariaDB's server default).
    RepeatableRead,
}

/// Two real transactions deliver the same event id: A records and applies but has not
/// committed; B's `record` must block (observed in the server's lock tables), then return
/// `Duplicate` if A commits, `New` if A rolls back, or a retryable error — never a second
/// `New` that applies the effect twice.
async fn concurrent_delivery_waits_for_the_first(db: TestDb) {
    for policy in [GapPolicy::Off, GapPolicy::Report, GapPolicy::HoldBack] {
        let inbox = connect_once_per_policy(&db, policy).await;
        let isos: &[Iso] = match db.backend {
            Backend::Sqlite => &[Iso::Default],
            _ => &[Iso::Default, Iso::RepeatableRead],
        };
        for &iso in isos {
            for a_commits in [true, false] {
                let tag = format!("{policy:?}-{iso:?}-{a_commits}").to_lowercase();
                let d = Delivery::new("billing", format!("e-{tag}"), format!("agg-{tag}"), 1);
                let vb = race_one(&inbox, &d, iso, a_commits).await;
                let expected: &[&str] = match (db.backend, iso, a_commits) {
                    (_, _, false) => &["new"],
                    // PostgreSQL at REPEATABLE READ: the conflicting row was committed after
                    // B's snapshot -> serialization failure, retryable
                    (Backend::Postgres, Iso::RepeatableRead, true) => &["transient"],
                    _ => &["duplicate"],
                };
                let got = match &vb {
                    Ok(v) => v.as_str(),
                    Err(e) if e.is_transient() => "transient",
                    Err(e) => panic!("{tag}: B failed with a non-retryable error: {e}"),
                };
                assert!(
                    expected.contains(&got),
                    "{tag}: B got {vb:?}, expected {expected:?}"
                );
                assert_eq!(
                    effects(&db, &d.event_id).await,
                    1,
                    "{tag}: the effect must be committed exactly once"
                );
                assert_eq!(
                    inbox
                        .consumed("billing", &[&d.event_id])
                        .await
                        .unwrap()
                        .len(),
                    1,
                    "{tag}"
                );
            }
        }
    }
}

/// Runs A (record + effect, held open) and B (same delivery) concurrently; returns B's result.
async fn race_one(
    inbox: &Inbox,
    d: &Delivery,
    iso: Iso,
    a_commits: bool,
) -> Result<Verdict, InboxError> {
    let cfg = *inbox.config();
    macro_rules! race {
        (
            $pool:expr, $m:ident, $variant:ident,
            |$pa:ident| $begin_a:expr,
            |$cb:ident| $begin_b:expr,
            $pid_sql:expr,
            $waiting:expr,
            $poll_every:expr
        ) => {{
            let pool = $pool.clone();
            let mut a = {
                let $pa = &pool;
                $begin_a
            };
            let va = ferry_inbox::$m::record(&mut a, &cfg, d).await.unwrap();
            assert_eq!(va, Verdict::New);
            effect(Conn::$variant(&mut a), d).await.unwrap();
            let (pid_tx, pid_rx) = tokio::sync::oneshot::channel::<i64>();
            let (pool_b, d_b) = (pool.clone(), d.clone());
            let b = tokio::spawn(async move {
                let mut conn = pool_b.acquire().await.unwrap();
                let pid_sql: Option<&str> = $pid_sql;
                let pid: i64 = match pid_sql {
                    Some(sql) => sqlx::query_scalar(sql).fetch_one(&mut *conn).await.unwrap(),
                    None => 0,
                };
                let _ = pid_tx.send(pid);
                let mut b = {
                    let $cb = &mut conn;
                    $begin_b
                };
                let v = ferry_inbox::$m::record(&mut b, &cfg, &d_b).await;
                match v {
                    Ok(v) => {
                        if v.should_apply() {
                            effect(Conn::$variant(&mut b), &d_b).await.unwrap();
                        }
                        b.commit().await.unwrap();
                        Ok(v)
                    }
                    Err(e) => {
                        let _ = b.rollback().await;
                        Err(e)
                    }
                }
            });
            let pid = pid_rx.await.unwrap();
            let waiting: Option<&str> = $waiting;
            if let Some(sql) = waiting {
                let b_ref = &b;
                ferry_testkit::wait_until_every(
                    "B waits on A's lock (or finished)",
                    Duration::from_secs(10),
                    $poll_every,
                    || {
                        let pool = pool.clone();
                        async move {
                            let n: i64 = sqlx::query_scalar(sql)
                                .bind(pid)
                                .fetch_one(&pool)
                                .await
                                .unwrap();
                            n > 0 || b_ref.is_finished()
                        }
                    },
                )
                .await;
                if b.is_finished() {
                    panic!(
                        "B must not finish while A is open; it returned {:?}",
                        b.await.unwrap()
                    );
                }
            }
            if a_commits {
                a.commit().await.unwrap();
            } else {
                a.rollback().await.unwrap();
            }
            b.await.unwrap()
        }};
    }
    match inbox.pool() {
        InboxPool::Postgres(p) => race!(
            p,
            postgres,
            Postgres,
            |p| p.begin().await.unwrap(),
            |c| {
                let stmt = if iso == Iso::RepeatableRead {
                    "BEGIN ISOLATION LEVEL REPEATABLE READ"
                } else {
                    "BEGIN"
                };
                c.begin_with(stmt).await.unwrap()
            },
            Some("SELECT pg_backend_pid()::int8"),
            Some(
                "SELECT COUNT(*) FROM pg_stat_activity \
                 WHERE pid = $1::int4 AND wait_event_type = 'Lock'"
            ),
            Duration::from_millis(10)
        ),
        InboxPool::Mysql(p) => race!(
            p,
            mysql,
            Mysql,
            |p| p.begin().await.unwrap(),
            |c| {
                if iso == Iso::RepeatableRead {
                    c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                        .await
                        .unwrap();
                }
                c.begin().await.unwrap()
            },
            Some("SELECT CAST(CONNECTION_ID() AS SIGNED)"),
            Some(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX \
                 WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'"
            ),
            // InnoDB refreshes its INNODB_TRX cache only after 100 ms without a reader:
            // polling faster would read the same stale snapshot forever.
            Duration::from_millis(150)
        ),
        // SQLite's lock is the whole database: B waits inside BEGIN IMMEDIATE, which has no
        // server view to observe; the verdict still must be right.
        InboxPool::Sqlite(p) => race!(
            p,
            sqlite,
            Sqlite,
            |p| p.begin_with("BEGIN IMMEDIATE").await.unwrap(),
            |c| c.begin_with("BEGIN IMMEDIATE").await.unwrap(),
            None,
            None,
            Duration::ZERO
        ),
    }
}

/// Many tasks deliver the same events at once through `apply_once`, retrying transient
/// errors: every event is applied exactly once and exactly one delivery saw `New`.
async fn racing_deliveries_apply_once(db: TestDb) {
    for policy in [GapPolicy::Off, GapPolicy::Report] {
        let inbox = connect_once_per_policy(&db, policy).await;
        let events: Vec<Delivery> = (0..12)
            .map(|i| {
                Delivery::new(
                    "racer",
                    format!("r-{policy:?}-{i}"),
                    format!("ra-{policy:?}-{i}"),
                    1,
                )
            })
            .collect();
        let mut tasks = Vec::new();
        for t in 0..6 {
            let inbox = inbox.clone();
            // each task walks the events in a different order
            let mut mine = events.clone();
            mine.rotate_left(t * 2);
            tasks.push(tokio::spawn(async move {
                let mut verdicts = BTreeMap::new();
                for d in mine {
                    let v = apply_retrying(&inbox, &d).await;
                    verdicts.insert(d.event_id.clone(), v);
                }
                verdicts
            }));
        }
        let mut news: BTreeMap<String, usize> = BTreeMap::new();
        for t in tasks {
            for (id, v) in t.await.unwrap() {
                assert!(
                    matches!(v, Verdict::New | Verdict::Duplicate),
                    "{id}: unexpected {v:?}"
                );
                *news.entry(id).or_default() += usize::from(v == Verdict::New);
            }
        }
        for d in &events {
            assert_eq!(news[&d.event_id], 1, "{}: exactly one New", d.event_id);
            assert_eq!(effects(&db, &d.event_id).await, 1, "{}", d.event_id);
            assert_eq!(
                projection(&inbox, "racer", &d.aggregate_id).await,
                Some((1, 1))
            );
        }
    }
}

/// Versions 1..=30 of one aggregate arrive concurrently, each twice, in scrambled order:
/// the aggregate's row lock must keep `applied_upto` exact (no lost update), so afterwards
/// no gap is open and v31 is plainly `New`.
async fn concurrent_versions_of_one_aggregate(db: TestDb) {
    let inbox = setup(&db, InboxConfig::new(GapPolicy::Report)).await;
    let all: Vec<Delivery> = (1..=30)
        .map(|v| Delivery::new("hot", format!("h-{v}"), "order-hot", v))
        .collect();
    let mut tasks = Vec::new();
    for t in 0..6usize {
        let inbox = inbox.clone();
        // task t takes versions v with v % 3 == t % 3 (so each version goes to two tasks),
        // half of them walking backwards
        let mut mine: Vec<Delivery> = all
            .iter()
            .filter(|d| d.aggregate_version as usize % 3 == t % 3)
            .cloned()
            .collect();
        if t >= 3 {
            mine.reverse();
        }
        tasks.push(tokio::spawn(async move {
            let mut applied = 0;
            for d in mine {
                let v = apply_retrying(&inbox, &d).await;
                assert!(
                    matches!(v, Verdict::New | Verdict::Gap { .. } | Verdict::Duplicate),
                    "{}: {v:?}",
                    d.event_id
                );
                applied += usize::from(v.should_apply());
            }
            applied
        }));
    }
    let mut applied = 0;
    for t in tasks {
        applied += t.await.unwrap();
    }
    assert_eq!(applied, 30, "each version applied exactly once");
    assert_eq!(db.count("inbox_effects").await, 30);
    assert_eq!(
        projection(&inbox, "hot", "order-hot").await.map(|p| p.0),
        Some(30)
    );
    assert_eq!(inbox.gaps("hot").await.unwrap(), vec![]);
    let next = Delivery::new("hot", "h-31", "order-hot", 31);
    assert_eq!(apply(&inbox, &next).await, Verdict::New);
}

// ---------------------------------------------------------------- version gaps

async fn gap_is_reported_and_closes(db: TestDb) {
    let inbox = setup(&db, InboxConfig::new(GapPolicy::Report)).await;
    let d = |v: i64| Delivery::new("proj", format!("e-a-{v}"), "order-a", v);
    assert_eq!(apply(&inbox, &d(1)).await, Verdict::New);
    assert_eq!(apply(&inbox, &d(3)).await, gap(2, 3));
    // Report records and applies it
    assert_eq!(effects(&db, "e-a-3").await, 1);
    assert_eq!(projection(&inbox, "proj", "order-a").await, Some((2, 3)));
    let gaps = inbox.gaps("proj").await.unwrap();
    assert_eq!(gaps.len(), 1);
    assert_eq!(
        (
            gaps[0].aggregate_id.as_str(),
            gaps[0].applied_upto,
            gaps[0].max_seen,
            gaps[0].missing()
        ),
        ("order-a", 1, 3, 2)
    );
    assert!(gaps[0].since_micros > 0);
    // v4 is still ahead of the gap
    assert_eq!(apply(&inbox, &d(4)).await, gap(2, 4));
    // a redelivered v3 is a duplicate, not a second gap
    assert_eq!(apply(&inbox, &d(3)).await, Verdict::Duplicate);
    // v2 closes the gap and the mark moves over the recorded v3 and v4
    assert_eq!(apply(&inbox, &d(2)).await, Verdict::New);
    assert!(inbox.gaps("proj").await.unwrap().is_empty());
    assert_eq!(apply(&inbox, &d(5)).await, Verdict::New);
    assert_eq!(projection(&inbox, "proj", "order-a").await, Some((5, 5)));
    assert_eq!(db.count("inbox_effects").await, 5);
    // a new event id reusing an applied version is not applied
    let reused = Delivery::new("proj", "e-a-3-again", "order-a", 3);
    assert_eq!(
        apply(&inbox, &reused).await,
        Verdict::Stale { applied_through: 5 }
    );
    assert_eq!(db.count("inbox_effects").await, 5);
    assert!(inbox
        .consumed("proj", &["e-a-3-again"])
        .await
        .unwrap()
        .is_empty());
}

async fn gap_is_held_back_until_the_predecessor(db: TestDb) {
    let inbox = setup(&db, InboxConfig::new(GapPolicy::HoldBack)).await;
    let d = |v: i64| Delivery::new("proj", format!("e-b-{v}"), "order-b", v);
    assert_eq!(apply(&inbox, &d(1)).await, Verdict::New);
    for _ in 0..2 {
        // held back each time it is delivered early, and nothing of it is recorded
        assert_eq!(apply(&inbox, &d(3)).await, early(2, 3));
        assert_eq!(effects(&db, "e-b-3").await, 0);
        assert!(inbox.consumed("proj", &["e-b-3"]).await.unwrap().is_empty());
    }
    // the hold-back is visible to operators
    let gaps = inbox.gaps("proj").await.unwrap();
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    assert_eq!((gaps[0].applied_upto, gaps[0].max_seen), (1, 3));
    assert_eq!(apply(&inbox, &d(2)).await, Verdict::New);
    // v3 was never applied, so the gap stays open until its redelivery
    assert_eq!(inbox.gaps("proj").await.unwrap().len(), 1);
    assert_eq!(apply(&inbox, &d(3)).await, Verdict::New);
    assert!(inbox.gaps("proj").await.unwrap().is_empty());
    assert_eq!(projection(&inbox, "proj", "order-b").await, Some((3, 3)));
    // the caller's own transaction sees the same verdict, and rolling it back keeps nothing
    assert_eq!(in_own_tx(&inbox, &d(5), false).await.unwrap(), early(4, 5));
    assert!(inbox.gaps("proj").await.unwrap().is_empty());
    assert_eq!(
        inbox
            .consumed("proj", &["e-b-1", "e-b-2", "e-b-3", "e-b-5"])
            .await
            .unwrap(),
        ids(&["e-b-1", "e-b-2", "e-b-3"])
    );
}

async fn accept_gap_repairs_a_lost_version(db: TestDb) {
    let inbox = setup(&db, InboxConfig::new(GapPolicy::HoldBack)).await;
    let d = |v: i64| Delivery::new("proj", format!("e-c-{v}"), "order-c", v);
    assert_eq!(apply(&inbox, &d(1)).await, Verdict::New);
    assert!(matches!(apply(&inbox, &d(3)).await, Verdict::Early { .. }));
    // v2 will never come: the operator accepts the gap through 2
    assert_eq!(inbox.accept_gap("proj", "order-c", 2).await.unwrap(), 2);
    // accepting an older mark changes nothing
    assert_eq!(inbox.accept_gap("proj", "order-c", 1).await.unwrap(), 2);
    // the gap stays listed until the held-back v3 is redelivered and applied
    assert_eq!(inbox.gaps("proj").await.unwrap().len(), 1);
    assert_eq!(apply(&inbox, &d(3)).await, Verdict::New);
    assert!(inbox.gaps("proj").await.unwrap().is_empty());
    // the lost v2 turning up late is stale: not applied, not recorded
    assert_eq!(
        apply(&inbox, &d(2)).await,
        Verdict::Stale { applied_through: 3 }
    );
    assert_eq!(effects(&db, "e-c-2").await, 0);
    assert_eq!(projection(&inbox, "proj", "order-c").await, Some((2, 3)));

    // under Report, accepting a gap moves the mark over the versions recorded ahead of it
    let report = Inbox::new(inbox.pool().clone(), InboxConfig::new(GapPolicy::Report));
    let r = |v: i64| Delivery::new("proj", format!("e-d-{v}"), "order-d", v);
    assert_eq!(apply(&report, &r(1)).await, Verdict::New);
    assert!(matches!(apply(&report, &r(3)).await, Verdict::Gap { .. }));
    assert!(matches!(apply(&report, &r(4)).await, Verdict::Gap { .. }));
    assert_eq!(report.accept_gap("proj", "order-d", 2).await.unwrap(), 4);
    assert!(report.gaps("proj").await.unwrap().is_empty());
    assert_eq!(apply(&report, &r(5)).await, Verdict::New);
}

async fn first_seen_baseline_starts_mid_stream(db: TestDb) {
    let from_one = setup(&db, InboxConfig::new(GapPolicy::Report)).await;
    let mid = Inbox::new(
        from_one.pool().clone(),
        InboxConfig::new(GapPolicy::HoldBack).with_baseline(Baseline::FirstSeen),
    );
    let d = |c: &str, v: i64| Delivery::new(c, format!("e-m-{v}"), "order-m", v);
    // attaching at v41: no gap for the mid-stream consumer, a gap from 1 for the other
    assert_eq!(
        mid.apply_once(&d("late", 41), effect).await.unwrap(),
        Verdict::New
    );
    assert_eq!(
        from_one.apply_once(&d("early", 41), effect).await.unwrap(),
        gap(1, 41)
    );
    // after the baseline, gaps count as usual
    assert_eq!(
        mid.apply_once(&d("late", 43), effect).await.unwrap(),
        early(42, 43)
    );
    assert_eq!(
        mid.apply_once(&d("late", 42), effect).await.unwrap(),
        Verdict::New
    );
    assert_eq!(
        mid.apply_once(&d("late", 43), effect).await.unwrap(),
        Verdict::New
    );
    assert_eq!(projection(&mid, "late", "order-m").await, Some((3, 43)));
}

// ---------------------------------------------------------------- consumers, input

async fn consumers_are_independent(db: TestDb) {
    let inbox = setup(&db, InboxConfig::default()).await;
    let e1 = |c: &str| Delivery::new(c, "e-7-1", "order-7", 1);
    let e2 = |c: &str| Delivery::new(c, "e-7-2", "order-7", 2);
    assert_eq!(apply(&inbox, &e1("billing")).await, Verdict::New);
    assert_eq!(apply(&inbox, &e1("shipping")).await, Verdict::New);
    assert_eq!(apply(&inbox, &e1("billing")).await, Verdict::Duplicate);
    assert_eq!(apply(&inbox, &e2("billing")).await, Verdict::New);
    // shipping's gap tracking is its own: it has not seen v2
    assert_eq!(apply(&inbox, &e1("shipping")).await, Verdict::Duplicate);
    assert_eq!(effects(&db, "e-7-1").await, 2);
    assert_eq!(effects(&db, "e-7-2").await, 1);
    assert_eq!(projection(&inbox, "billing", "order-7").await, Some((2, 2)));
    assert_eq!(
        projection(&inbox, "shipping", "order-7").await,
        Some((1, 1))
    );
    let all = ["e-7-1", "e-7-2", "e-7-3"];
    assert_eq!(
        inbox.consumed("billing", &all).await.unwrap(),
        ids(&["e-7-1", "e-7-2"])
    );
    assert_eq!(
        inbox.consumed("shipping", &all).await.unwrap(),
        ids(&["e-7-1"])
    );
    assert!(inbox.consumed("nobody", &all).await.unwrap().is_empty());
    let counts = inbox.consumed_counts().await.unwrap();
    assert_eq!(
        counts,
        BTreeMap::from([("billing".to_string(), 2), ("shipping".to_string(), 1)])
    );
    // ids are compared exactly (binary collation on MariaDB too)
    assert_eq!(
        apply(&inbox, &Delivery::new("billing", "E-7-1", "order-x", 1)).await,
        Verdict::New
    );
    // consumed() over more ids than one statement binds
    let many: Vec<String> = (0..2_500).map(|i| format!("bulk-{i}")).collect();
    for id in many.iter().step_by(500) {
        let d = Delivery::new("bulk", id.clone(), id.clone(), 1);
        assert_eq!(apply(&inbox, &d).await, Verdict::New);
    }
    assert_eq!(inbox.consumed("bulk", &many).await.unwrap().len(), 5);
}

async fn bad_input_writes_nothing(db: TestDb) {
    let inbox = setup(&db, InboxConfig::default()).await;
    let long = "x".repeat(256);
    for d in [
        Delivery::new("", "e", "a", 1),
        Delivery::new("c", " ", "a", 1),
        Delivery::new("c", "e", "", 1),
        Delivery::new("c", "e", "a", 0),
        Delivery::new(long.clone(), "e", "a", 1),
        Delivery::new("c", long.clone(), "a", 1),
    ] {
        let e = inbox.apply_once(&d, effect).await.unwrap_err();
        assert!(
            matches!(
                e,
                InboxError::Empty { .. }
                    | InboxError::TooLong { .. }
                    | InboxError::BadVersion { .. }
            ),
            "{d:?}: {e:?}"
        );
    }
    assert_eq!(db.count("ferry_inbox").await, 0);
    assert_eq!(db.count("ferry_inbox_aggregate").await, 0);
    assert_eq!(db.count("inbox_effects").await, 0);
    // with gap tracking off, unversioned messages are fine
    let off = Inbox::new(inbox.pool().clone(), InboxConfig::new(GapPolicy::Off));
    let d = Delivery::new("c", "plain", "", 0);
    assert_eq!(apply(&off, &d).await, Verdict::New);
    assert_eq!(apply(&off, &d).await, Verdict::Duplicate);
    assert_eq!(db.count("ferry_inbox_aggregate").await, 0);
}

// ---------------------------------------------------------------- migrations

async fn concurrent_migrations_apply_once(db: TestDb) {
    let inbox = setup(&db, InboxConfig::default()).await;
    let other = Inbox::new(
        InboxPool::connect(&db.url, 2).await.unwrap(),
        InboxConfig::default(),
    );
    let (a, b) = tokio::join!(inbox.migrate(), other.migrate());
    assert_eq!(a.unwrap(), Vec::<i64>::new());
    assert_eq!(b.unwrap(), Vec::<i64>::new());
    assert_eq!(db.count("ferry_inbox_migrations").await, 1);
    // the outbox's own migration table is untouched: exactly its embedded versions
    let outbox_versions = match db.backend {
        ferry_store::Backend::Postgres => ferry_store::MIGRATIONS_POSTGRES.len(),
        ferry_store::Backend::Mysql => ferry_store::MIGRATIONS_MYSQL.len(),
        _ => ferry_store::MIGRATIONS_SQLITE.len(),
    };
    assert_eq!(
        db.count("ferry_schema_migrations").await,
        outbox_versions as i64
    );
}

async fn fresh_concurrent_migrations(db: TestDb) {
    let pools = [
        InboxPool::connect(&db.url, 2).await.unwrap(),
        InboxPool::connect(&db.url, 2).await.unwrap(),
        InboxPool::connect(&db.url, 2).await.unwrap(),
    ];
    let [a, b, c] = pools.map(|p| Inbox::new(p, InboxConfig::default()));
    let (ra, rb, rc) = tokio::join!(a.migrate(), b.migrate(), c.migrate());
    let mut all = ra.unwrap();
    all.extend(rb.unwrap());
    all.extend(rc.unwrap());
    assert_eq!(all, vec![1], "exactly one migrate applied version 1");
    db.exec(EFFECTS).await.unwrap();
    db.exec(PROJECTION).await.unwrap();
    let d = Delivery::new("c", "e-1", "a", 1);
    assert_eq!(apply(&b, &d).await, Verdict::New);
    assert_eq!(apply(&c, &d).await, Verdict::Duplicate);
    // before migrating, a clear schema error
    for t in [
        "ferry_inbox",
        "ferry_inbox_aggregate",
        "ferry_inbox_migrations",
    ] {
        db.exec(&format!("DROP TABLE {t}")).await.unwrap();
    }
    let e = a.apply_once(&d, effect).await.unwrap_err();
    assert_eq!(
        e.store_kind(),
        Some(ferry_core::StoreErrorKind::Schema),
        "{e}"
    );
    assert!(e.to_string().contains("migrate"), "{e}");
}

/// Inbox retention: `prune` deletes only old rows covered by their aggregate's contiguous
/// mark; a pruned event delivered again applies nothing (`Stale`); rows above the mark and the
/// rows of a consumer without gap tracking are kept; many rows go in several batches.
async fn prune_deletes_only_what_the_mark_covers(db: TestDb) {
    let off = connect_once_per_policy(&db, GapPolicy::Off).await;
    let inbox = Inbox::connect(&db.url, InboxConfig::default())
        .await
        .unwrap();
    for v in 1..=3 {
        let d = Delivery::new("c", format!("a-{v}"), "A", v);
        assert_eq!(apply(&inbox, &d).await, Verdict::New);
    }
    assert_eq!(
        apply(&inbox, &Delivery::new("c", "b-1", "B", 1)).await,
        Verdict::New
    );
    // b-3 before b-2: recorded above B's mark (1)
    let b3 = Delivery::new("c", "b-3", "B", 3);
    assert_eq!(apply(&inbox, &b3).await, gap(2, 3));
    assert_eq!(
        apply(&off, &Delivery::new("o", "e-1", "", 0)).await,
        Verdict::New
    );

    // nothing is older than an hour
    assert_eq!(
        inbox.prune("c", Duration::from_secs(3600)).await.unwrap(),
        0
    );
    // a-1..a-3 and b-1 are covered; b-3 is above the mark
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(inbox.prune("c", Duration::ZERO).await.unwrap(), 4);
    let counts = inbox.consumed_counts().await.unwrap();
    assert_eq!(counts.get("c"), Some(&1), "{counts:?}");
    // the pruned a-2 delivered again: covered, not applied a second time
    let a2 = Delivery::new("c", "a-2", "A", 2);
    assert_eq!(
        apply(&inbox, &a2).await,
        Verdict::Stale { applied_through: 3 }
    );
    assert_eq!(effects(&db, "a-2").await, 1);
    // the kept b-3 is still a duplicate, and b-2 closes B's gap over it
    assert_eq!(apply(&inbox, &b3).await, Verdict::Duplicate);
    assert_eq!(
        apply(&inbox, &Delivery::new("c", "b-2", "B", 2)).await,
        Verdict::New
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(inbox.prune("c", Duration::ZERO).await.unwrap(), 2);
    // without gap tracking the row is the only dedupe record: kept
    assert_eq!(off.prune("o", Duration::ZERO).await.unwrap(), 0);
    assert_eq!(
        apply(&off, &Delivery::new("o", "e-1", "", 0)).await,
        Verdict::Duplicate
    );
    assert!(matches!(
        inbox.prune("", Duration::ZERO).await,
        Err(InboxError::Empty { field: "consumer" })
    ));

    // 2,500 old rows of one aggregate, covered by its mark: three batches
    let many = match db.backend {
        Backend::Postgres => {
            "INSERT INTO ferry_inbox (consumer, event_id, aggregate_id, aggregate_version, recorded_at) \
             SELECT 'm', 'm-' || g, 'M', g, TIMESTAMPTZ '2000-01-01 00:00:00+00' \
             FROM generate_series(1, 2500) AS g"
        }
        Backend::Mysql => {
            "INSERT INTO ferry_inbox (consumer, event_id, aggregate_id, aggregate_version, recorded_at) \
             SELECT 'm', CONCAT('m-', seq), 'M', seq, '2000-01-01 00:00:00' FROM seq_1_to_2500"
        }
        Backend::Sqlite => {
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 2500) \
             INSERT INTO ferry_inbox (consumer, event_id, aggregate_id, aggregate_version, recorded_at) \
             SELECT 'm', 'm-' || n, 'M', n, 0 FROM g"
        }
    };
    db.exec(many).await.unwrap();
    inbox.accept_gap("m", "M", 2500).await.unwrap();
    assert_eq!(
        inbox.prune("m", Duration::from_secs(60)).await.unwrap(),
        2500
    );
    assert_eq!(inbox.consumed_counts().await.unwrap().get("m"), None);
}

// ---------------------------------------------------------------- replays

/// A replayed message (`ferry replay`: header `ferry-replay`) is a duplicate of its event id by
/// default; a consumer that accepts replays applies it once per replay id, leaves the version
/// mark alone, and applies another replay of the same event once more.
async fn replays_are_duplicates_unless_accepted(db: TestDb) {
    let plain = setup(&db, InboxConfig::default()).await;
    let d = Delivery::new("billing", "e-7-1", "order-7", 1);
    let d2 = Delivery::new("billing", "e-7-2", "order-7", 2);
    assert_eq!(apply(&plain, &d).await, Verdict::New);
    assert_eq!(apply(&plain, &d2).await, Verdict::New);
    let r1 = d.clone().replayed("r-1");
    assert_eq!(
        apply(&plain, &r1).await,
        Verdict::Duplicate,
        "dedupes by event id"
    );
    assert_eq!(effects(&db, "e-7-1").await, 1);

    let accepting = Inbox::connect(&db.url, InboxConfig::default().with_accept_replays(true))
        .await
        .unwrap();
    // a message without the header is still deduped by its event id
    assert_eq!(apply(&accepting, &d).await, Verdict::Duplicate);
    assert_eq!(
        apply(&accepting, &r1).await,
        Verdict::New,
        "the replay is applied"
    );
    assert_eq!(
        apply(&accepting, &r1).await,
        Verdict::Duplicate,
        "once per replay"
    );
    assert_eq!(
        apply(&accepting, &d2.clone().replayed("r-1")).await,
        Verdict::New,
        "v2 of the replay: no version check against the mark"
    );
    assert_eq!(effects(&db, "e-7-1").await, 2);
    assert_eq!(
        apply(&accepting, &d.clone().replayed("r-2")).await,
        Verdict::New,
        "another replay applies again"
    );
    assert_eq!(effects(&db, "e-7-1").await, 3);
    // the contiguous mark is untouched, no gap opened
    assert!(accepting.gaps("billing").await.unwrap().is_empty());
    // headers: the replay id is read from ferry-replay
    let h = Delivery::from_headers(
        "billing",
        [
            ("ferry-event-id", Some(&b"e-7-1"[..])),
            ("ferry-aggregate-id", Some(&b"order-7"[..])),
            ("ferry-aggregate-version", Some(&b"1"[..])),
            (ferry_inbox::HEADER_REPLAY, Some(&b"r-9"[..])),
        ],
    )
    .unwrap();
    assert_eq!(h, d.clone().replayed("r-9"));
}

ferry_testkit::backend_tests!(
    prune_deletes_only_what_the_mark_covers,
    duplicate_applies_effect_once,
    rollback_leaves_no_record,
    concurrent_delivery_waits_for_the_first,
    racing_deliveries_apply_once,
    concurrent_versions_of_one_aggregate,
    gap_is_reported_and_closes,
    gap_is_held_back_until_the_predecessor,
    accept_gap_repairs_a_lost_version,
    first_seen_baseline_starts_mid_stream,
    consumers_are_independent,
    bad_input_writes_nothing,
    concurrent_migrations_apply_once,
    fresh_concurrent_migrations,
    replays_are_duplicates_unless_accepted,
);
