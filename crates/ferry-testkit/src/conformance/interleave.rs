//! The interleaving suite: producer transactions that contend for business rows, run step by
//! step in a scripted order on the real database, then drained as a relay would, in both
//! dispatch modes. Every aggregate's versions must come out in order (first occurrences,
//! versions strictly increasing), every committed intent once, no rolled-back one.
//!
//! *Sessions.* Each producer is a session: its own connection on a task of its own, running one
//! step at a time (implicit `BEGIN` at its first step; then `UPDATE ferry_it_biz SET ver = ver +
//! 1` and read the new version, `SELECT … FOR UPDATE`, the intent as one plain `INSERT` of
//! docs/schema.md §2.1 (the database fills slot, key and event id), savepoints, commit,
//! rollback). PostgreSQL and MariaDB sessions run READ COMMITTED; SQLite sessions take the write
//! gate and `BEGIN IMMEDIATE`, as the store's own producers do
//! ([`begin_write`](ferry_store::sqlite::begin_write)).
//!
//! *Blocking.* A step that waits for a lock must not stall the harness, so the harness sends a
//! step and then waits until every session is either done with its step or seen waiting:
//! * PostgreSQL: `pg_stat_activity.wait_event_type = 'Lock'` and a non-empty
//!   `pg_blocking_pids()` for the session's backend pid (the lock manager grants a waiter inside
//!   the holder's commit, so neither shows a waiter that was already granted).
//! * MariaDB: the session's connection id under a `LOCK WAIT` transaction in `SHOW ENGINE
//!   INNODB STATUS`. Not `information_schema.INNODB_TRX`: that view is a cache refreshed only
//!   after 100 ms without a read, so frequent polls kept it frozen (measured on 10.11: a waiter
//!   still showed `LOCK WAIT` a second after both transactions had ended).
//! * SQLite (one writer): a session waits for the process's write gate of the database file; it
//!   is blocked when it is queued for the gate while another session holds it (both flags are
//!   set by the sessions themselves, around the gate's `lock` and before its release). SQLite's
//!   own lock is never contended (the gate comes first; a 10 s busy timeout is the backstop).
//!
//! *The model.* A small lock model predicts which step waits, which waiter runs at a release,
//! and each version a step reads or writes: row locks queued in request order on PostgreSQL and
//! MariaDB, one writer on SQLite. PostgreSQL may hand a released row to a later waiter (a waiter
//! that finds the row updated by the committed holder follows the update chain and races the
//! others for it): the harness then takes the server's choice and re-plans. `ROLLBACK TO
//! SAVEPOINT` releases the row locks taken after the savepoint on PostgreSQL, and on MariaDB
//! only when the transaction had written nothing before the savepoint (measured on 10.11). The
//! harness checks the server against the model after every step (a step that runs although the
//! model says it waits, or the reverse, or a version other than predicted fails the case), and
//! the explorer uses it to enumerate every interleaving of a few short transactions that the
//! database can produce (a waiting session issues nothing until it runs; interleavings that
//! deadlock are left out). A fixed schedule is written once for every backend: a step of a
//! session that waits is deferred until the session runs.
//!
//! *The check.* After every session ended, the outbox is drained as a relay would: cursor
//! dispatch reads every slot in pieces of [`READ_LIMIT`] (so windows are cut) and advances after
//! each read; row dispatch claims [`READ_LIMIT`] events at a time and acks them. The explorer
//! also reads between every two steps in every other interleaving (cursor dispatch always; row
//! dispatch on SQLite only while no producer holds the write lock, since a claim writes). Per
//! aggregate, the first occurrences must have strictly increasing versions; every committed
//! intent must come once, no rolled-back one; the outbox table must hold exactly the committed
//! intents; the store must report nothing pending.
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{
    AdvanceResult, CasResult, CursorAdvance, CursorPos, CursorRead, CursorStore, DispatchMode,
    SlotAdvance, SlotId,
};
use ferry_store::Backend;
use sqlx::{Connection, Executor, MySqlConnection, PgConnection, Row, SqliteConnection};
use tokio::sync::{mpsc, OwnedMutexGuard};

use super::{all_slots, Case};
use crate::TestDb;

/// Rows per cursor read or row claim: small, so that reads cut windows and claims take a few
/// aggregates at a time.
pub const READ_LIMIT: usize = 3;

/// How long a session's step may take to finish or to be seen waiting (a lock wait is seen in
/// milliseconds; this only bounds a hung server).
const STEP_DEADLINE: Duration = Duration::from_secs(15);

/// How long a drain waits for committed intents to become readable (on PostgreSQL other tests'
/// open transactions can delay a tick for a while).
const DRAIN_DEADLINE: Duration = Duration::from_secs(60);

const LONG: Duration = Duration::from_secs(300);
const OWNER: &str = "interleave";
const TOPIC: &str = "interleave";

// ------------------------------------------------------------------------------ schedules

/// A logical business row / aggregate (`X`, `Y`, `Z`), prefixed per run.
type Agg = &'static str;

/// One step of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `UPDATE ferry_it_biz SET ver = ver + 1` and read the new version (takes the row lock).
    Bump(Agg),
    /// `SELECT ver … FOR UPDATE`: the row lock and the version seen.
    LockRead(Agg),
    /// `UPDATE ferry_it_biz SET ver = seen + 1` after a [`Op::LockRead`].
    WriteNext(Agg),
    /// The intent at the version this transaction last wrote for the aggregate (plain INSERT).
    Insert(Agg),
    /// A blind writer: `max(aggregate_version)` without a lock, the intent at max + 1; a unique
    /// violation rolls back to the attempt's savepoint and tries again.
    Optimistic(Agg),
    /// `SAVEPOINT`.
    Savepoint,
    /// `ROLLBACK TO SAVEPOINT`: the intents written after it never appear.
    RollbackToSavepoint,
    /// `COMMIT`.
    Commit,
    /// `ROLLBACK`.
    Rollback,
}

impl Op {
    fn agg(self) -> Option<Agg> {
        match self {
            Op::Bump(a)
            | Op::LockRead(a)
            | Op::WriteNext(a)
            | Op::Insert(a)
            | Op::Optimistic(a) => Some(a),
            _ => None,
        }
    }

    fn describe(self) -> String {
        match self {
            Op::Bump(a) => format!("bump {a}"),
            Op::LockRead(a) => format!("lock {a} for update"),
            Op::WriteNext(a) => format!("write {a} = seen + 1"),
            Op::Insert(a) => format!("insert {a}"),
            Op::Optimistic(a) => format!("insert {a} at max + 1"),
            Op::Savepoint => "savepoint".into(),
            Op::RollbackToSavepoint => "rollback to savepoint".into(),
            Op::Commit => "commit".into(),
            Op::Rollback => "rollback".into(),
        }
    }
}

fn letter(s: usize) -> char {
    (b'A' + s as u8) as char
}

/// What a case runs.
enum Plan {
    /// One schedule, in this order (steps of a waiting session are deferred until it runs).
    Fixed(Vec<(usize, Op)>),
    /// Every interleaving of these transactions the database can produce, one after the other
    /// on one database (each on rows of its own), a relay reading between the steps of every
    /// other one.
    Explore(Vec<Vec<Op>>),
}

impl Plan {
    fn sessions(&self) -> usize {
        match self {
            Plan::Fixed(steps) => steps.iter().map(|(s, _)| s + 1).max().unwrap_or(0),
            Plan::Explore(scripts) => scripts.len(),
        }
    }

    /// The runs of this plan on `locking`: a fixed schedule once (refused if it cannot finish
    /// there), or every interleaving the explorer finds.
    fn runs(&self, locking: Locking) -> Result<Vec<Run>, String> {
        match self {
            Plan::Fixed(steps) => {
                arrange(locking, self.sessions(), steps)?;
                Ok(vec![Run {
                    prefix: "f-".into(),
                    steps: steps.clone(),
                    read_between: false,
                }])
            }
            Plan::Explore(scripts) => Ok(explore(locking, scripts)
                .into_iter()
                .enumerate()
                .map(|(i, order)| {
                    let mut pcs = vec![0; scripts.len()];
                    let steps = order
                        .into_iter()
                        .map(|s| {
                            pcs[s] += 1;
                            (s, scripts[s][pcs[s] - 1])
                        })
                        .collect();
                    Run {
                        prefix: format!("e{i}-"),
                        steps,
                        read_between: i % 2 == 1,
                    }
                })
                .collect()),
        }
    }
}

/// One schedule to run, on business rows and aggregates of its own (`{prefix}X`, …).
struct Run {
    prefix: String,
    steps: Vec<(usize, Op)>,
    /// A relay reads after every step.
    read_between: bool,
}

const A: usize = 0;
const B: usize = 1;
const C: usize = 2;

/// A fixed schedule written as it interleaves: `A Bump Y, B Insert X, B Commit, …` is
/// `(A, Op::Bump("Y")), (B, Op::Insert("X")), (B, Op::Commit), …` (session, step, aggregate).
macro_rules! fixed {
    ($($s:ident $op:ident $($a:ident)?),* $(,)?) => {
        Plan::Fixed(vec![$(($s, Op::$op $((stringify!($a)))?)),*])
    };
}

/// One session's steps for the explorer: `Bump Y, Insert X, Commit` (step, aggregate).
macro_rules! script {
    ($($op:ident $($a:ident)?),* $(,)?) => {
        vec![$(Op::$op $((stringify!($a)))?),*]
    };
}

/// Issue #33: A takes its transaction id first (a write to Y), B writes X v1, A waits for X,
/// B commits, A writes X v2 — v2 has the lower transaction id and the higher `seq`.
fn cross_xid() -> Plan {
    fixed![
        A Bump Y,
        B Bump X, B Insert X,
        A Bump X,
        B Commit,
        A Insert X, A Commit,
    ]
}

/// Three transactions queued on one row: C holds X, then A and B (both with earlier
/// transaction ids) wait for it in that order.
fn three_queued() -> Plan {
    fixed![
        A Bump Y,
        B Bump Z,
        C Bump X, C Insert X,
        A Bump X,
        B Bump X,
        C Commit,
        A Insert X, A Commit,
        B Insert X, B Commit,
    ]
}

/// Each transaction writes two versions of X: B v1, v2; A (waiting for B) v3, v4.
fn two_versions() -> Plan {
    fixed![
        A Bump Y,
        B Bump X, B Insert X, B Bump X, B Insert X,
        A Bump X,
        B Commit,
        A Insert X, A Bump X, A Insert X, A Commit,
    ]
}

/// B writes v1, then v2 inside a savepoint and rolls back to it while A waits for X; B writes
/// v2 again and commits; A writes v3. The rolled-back v2 never appears.
fn savepoint_rolled_back() -> Plan {
    fixed![
        A Bump Y,
        B Bump X, B Insert X, B Savepoint, B Bump X, B Insert X,
        A Bump X,
        B RollbackToSavepoint, B Bump X, B Insert X, B Commit,
        A Insert X, A Commit,
    ]
}

/// B takes X's lock inside a savepoint, its first write, and rolls back to it while A waits
/// for X: the lock is released (A writes v1; B then waits for A and writes v2).
fn savepoint_lock() -> Plan {
    fixed![
        A Bump Y,
        B Savepoint, B Bump X, B Insert X,
        A Bump X,
        B RollbackToSavepoint, B Bump X,
        A Insert X, A Commit,
        B Insert X, B Commit,
    ]
}

/// As [`savepoint_lock`], but B wrote Z before the savepoint. PostgreSQL releases X's lock at
/// the rollback (A writes v1, B v2); MariaDB keeps it until B ends (B writes v1, A v2).
fn savepoint_lock_after_write() -> Plan {
    fixed![
        A Bump Y,
        B Bump Z, B Savepoint, B Bump X, B Insert X,
        A Bump X,
        B RollbackToSavepoint, B Bump X,
        A Insert X, A Commit,
        B Insert X, B Commit,
    ]
}

/// The lock is taken by `SELECT … FOR UPDATE`, the version read, then written.
fn lock_for_update() -> Plan {
    fixed![
        A Bump Y,
        B LockRead X, B WriteNext X, B Insert X,
        A LockRead X,
        B Commit,
        A WriteNext X, A Insert X, A Commit,
    ]
}

/// Versions by the unique `(aggregate_id, aggregate_version)` key: blind writers read
/// `max(version)` without a lock and insert max + 1. A (with an earlier transaction id) waits
/// for B's uncommitted v1 on the unique key, loses when B commits and retries with v2; C then
/// loses v2 to A and retries with v3.
fn optimistic() -> Plan {
    fixed![
        A Bump Y,
        B Optimistic X,
        A Optimistic X,
        B Commit,
        C Optimistic X,
        A Commit,
        C Commit,
    ]
}

/// Two transactions, every interleaving: A takes its transaction id on Y, then writes X; B
/// writes X.
fn explore_two() -> Plan {
    Plan::Explore(vec![
        script![Bump Y, Bump X, Insert X, Commit],
        script![Bump X, Insert X, Commit],
    ])
}

/// Three transactions, every interleaving: as [`explore_two`], plus C, which writes X and rolls
/// back (its version is taken by the next writer).
fn explore_three() -> Plan {
    Plan::Explore(vec![
        script![Bump Y, Bump X, Insert X, Commit],
        script![Bump X, Insert X, Commit],
        script![Bump X, Insert X, Rollback],
    ])
}

// ------------------------------------------------------------------------------ the model

/// How a backend makes producers wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Locking {
    /// Row locks, predicted in request order (the server may pick another waiter:
    /// [`Model::prefer`]); `ROLLBACK TO SAVEPOINT` releases the row locks taken after the
    /// savepoint (a subtransaction's).
    Postgres,
    /// Row locks in request order; `ROLLBACK TO SAVEPOINT` releases the row locks taken after
    /// the savepoint only when the transaction had written nothing before it; after a write
    /// they stay until the transaction ends (measured on MariaDB 10.11 with two `mysql`
    /// sessions: the waiter ran at the rollback to the savepoint in the first case, at the
    /// commit in the second).
    Mariadb,
    /// SQLite: one writer, from `BEGIN IMMEDIATE` (the write gate) to the end.
    OneWriter,
}

impl Locking {
    fn of(backend: Backend) -> Self {
        match backend {
            Backend::Postgres => Locking::Postgres,
            Backend::Mysql => Locking::Mariadb,
            Backend::Sqlite => Locking::OneWriter,
        }
    }
}

/// What a waiting step waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// A business row's lock.
    Row(Agg),
    /// The one writer (SQLite).
    Writer,
    /// An uncommitted intent of another transaction with this key (the unique index).
    Key(Agg, i64),
}

/// What a finished step returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Outcome {
    /// The version read or written (bump, lock, write, insert).
    version: Option<i64>,
    /// Unique violations an optimistic insert lost before it succeeded.
    conflicts: u32,
}

impl Outcome {
    fn version(v: i64) -> Self {
        Self {
            version: Some(v),
            conflicts: 0,
        }
    }
}

/// A transaction's state at a savepoint.
#[derive(Debug, Clone, Default)]
struct Mark {
    /// The transaction had written before the savepoint.
    wrote: bool,
    biz: BTreeMap<Agg, i64>,
    seen: BTreeMap<Agg, i64>,
    last: BTreeMap<Agg, i64>,
    intents: usize,
}

#[derive(Debug, Clone, Default)]
struct Tx {
    open: bool,
    /// It has written a row (business or intent).
    wrote: bool,
    waits: Option<(Want, Op)>,
    writer: bool,
    /// Row locks held, and whether each was taken after the savepoint.
    rows: Vec<(Agg, bool)>,
    biz: BTreeMap<Agg, i64>,
    seen: BTreeMap<Agg, i64>,
    last: BTreeMap<Agg, i64>,
    intents: Vec<(Agg, i64)>,
    sp: Option<Mark>,
    conflicts: u32,
}

/// The lock model (see the module doc).
#[derive(Debug, Clone)]
struct Model {
    locking: Locking,
    tx: Vec<Tx>,
    /// Waiting sessions, in request order.
    queue: Vec<usize>,
    /// Committed business versions (a missing row is at 0).
    biz: BTreeMap<Agg, i64>,
    /// Committed intents.
    intents: BTreeMap<Agg, BTreeSet<i64>>,
}

impl Model {
    fn new(locking: Locking, sessions: usize) -> Self {
        Self {
            locking,
            tx: vec![Tx::default(); sessions],
            queue: Vec::new(),
            biz: BTreeMap::new(),
            intents: BTreeMap::new(),
        }
    }

    fn waiting(&self, s: usize) -> bool {
        self.tx[s].waits.is_some()
    }

    fn holds_writer(&self) -> bool {
        self.tx.iter().any(|t| t.writer)
    }

    /// The session other than `me` that holds what `want` names.
    fn holder(&self, want: Want, me: usize) -> Option<usize> {
        let others = self.tx.iter().enumerate().filter(|(i, _)| *i != me);
        match want {
            Want::Writer => others.filter(|(_, t)| t.writer).map(|(i, _)| i).next(),
            Want::Row(a) => others
                .filter(|(_, t)| t.rows.iter().any(|(r, _)| *r == a))
                .map(|(i, _)| i)
                .next(),
            Want::Key(a, v) => others
                .filter(|(_, t)| t.intents.contains(&(a, v)))
                .map(|(i, _)| i)
                .next(),
        }
    }

    /// Issues `op` on session `s` (which must not be waiting). Returns the steps that finished
    /// (this one unless it waits, and waiters it released, in the order they run), or why the
    /// step cannot be issued (a deadlock, a schedule that makes no sense).
    fn issue(&mut self, s: usize, op: Op) -> Result<Vec<(usize, Outcome)>, String> {
        assert!(!self.waiting(s), "a step for waiting session {}", letter(s));
        let mut done = Vec::new();
        if !self.tx[s].open {
            self.tx[s].open = true;
            if self.locking == Locking::OneWriter {
                if self.holder(Want::Writer, s).is_some() {
                    self.wait(s, Want::Writer, op)?;
                    return Ok(done);
                }
                self.tx[s].writer = true;
            }
        }
        self.run(s, op, &mut done)?;
        self.wake(&mut done)?;
        Ok(done)
    }

    fn wait(&mut self, s: usize, want: Want, op: Op) -> Result<(), String> {
        self.tx[s].waits = Some((want, op));
        self.queue.push(s);
        match self.cycle(s) {
            Some(path) => Err(format!("deadlock: {path}")),
            None => Ok(()),
        }
    }

    /// Who `s` waits for: the holder, and (PostgreSQL's tuple lock, InnoDB's queue) every
    /// earlier waiter for the same thing.
    fn waits_for(&self, s: usize) -> Vec<usize> {
        let Some((want, _)) = self.tx[s].waits else {
            return Vec::new();
        };
        let mut out: Vec<usize> = self.holder(want, s).into_iter().collect();
        for &q in &self.queue {
            if q == s {
                break;
            }
            if self.tx[q].waits.map(|(w, _)| w) == Some(want) {
                out.push(q);
            }
        }
        out
    }

    fn cycle(&self, start: usize) -> Option<String> {
        let mut stack = vec![(start, vec![start])];
        let mut seen = BTreeSet::new();
        while let Some((s, path)) = stack.pop() {
            for n in self.waits_for(s) {
                if n == start {
                    let names: Vec<String> = path.iter().map(|&p| letter(p).to_string()).collect();
                    return Some(format!("{} waits for {}", names.join(" → "), letter(n)));
                }
                if seen.insert(n) {
                    let mut p = path.clone();
                    p.push(n);
                    stack.push((n, p));
                }
            }
        }
        None
    }

    fn current(&self, s: usize, a: Agg) -> i64 {
        self.tx[s]
            .biz
            .get(a)
            .or_else(|| self.biz.get(a))
            .copied()
            .unwrap_or(0)
    }

    fn visible_max(&self, s: usize, a: Agg) -> i64 {
        let committed = self.intents.get(a).and_then(|v| v.last()).copied();
        let own = self.tx[s]
            .intents
            .iter()
            .filter(|(x, _)| *x == a)
            .map(|(_, v)| *v);
        committed.into_iter().chain(own).max().unwrap_or(0)
    }

    fn run(&mut self, s: usize, op: Op, done: &mut Vec<(usize, Outcome)>) -> Result<(), String> {
        let rows = self.locking != Locking::OneWriter;
        let name = letter(s);
        match op {
            Op::Bump(a) | Op::LockRead(a) => {
                if rows {
                    if self.holder(Want::Row(a), s).is_some() {
                        return self.wait(s, Want::Row(a), op);
                    }
                    let after = self.tx[s].sp.is_some();
                    if !self.tx[s].rows.iter().any(|(r, _)| *r == a) {
                        self.tx[s].rows.push((a, after));
                    }
                }
                let cur = self.current(s, a);
                let t = &mut self.tx[s];
                let v = if matches!(op, Op::Bump(_)) {
                    t.wrote = true;
                    t.biz.insert(a, cur + 1);
                    t.last.insert(a, cur + 1);
                    cur + 1
                } else {
                    t.seen.insert(a, cur);
                    cur
                };
                done.push((s, Outcome::version(v)));
            }
            Op::WriteNext(a) => {
                let t = &mut self.tx[s];
                let seen = *t
                    .seen
                    .get(a)
                    .ok_or_else(|| format!("schedule: {name} writes {a} without reading it"))?;
                if rows && !t.rows.iter().any(|(r, _)| *r == a) {
                    return Err(format!("schedule: {name} writes {a} without its lock"));
                }
                t.wrote = true;
                t.biz.insert(a, seen + 1);
                t.last.insert(a, seen + 1);
                done.push((s, Outcome::version(seen + 1)));
            }
            Op::Insert(a) => {
                let v = *self.tx[s]
                    .last
                    .get(a)
                    .ok_or_else(|| format!("schedule: {name} inserts {a} before writing it"))?;
                let taken = self.intents.get(a).is_some_and(|vs| vs.contains(&v))
                    || self.tx.iter().any(|t| t.intents.contains(&(a, v)));
                if taken {
                    return Err(format!("schedule: two intents of {a} v{v}"));
                }
                self.tx[s].wrote = true;
                self.tx[s].intents.push((a, v));
                done.push((s, Outcome::version(v)));
            }
            Op::Optimistic(a) => {
                let v = self.visible_max(s, a) + 1;
                if self.holder(Want::Key(a, v), s).is_some() {
                    return self.wait(s, Want::Key(a, v), op);
                }
                let t = &mut self.tx[s];
                t.wrote = true;
                t.intents.push((a, v));
                let conflicts = std::mem::take(&mut t.conflicts);
                done.push((
                    s,
                    Outcome {
                        version: Some(v),
                        conflicts,
                    },
                ));
            }
            Op::Savepoint => {
                let t = &mut self.tx[s];
                t.sp = Some(Mark {
                    wrote: t.wrote,
                    biz: t.biz.clone(),
                    seen: t.seen.clone(),
                    last: t.last.clone(),
                    intents: t.intents.len(),
                });
                done.push((s, Outcome::default()));
            }
            Op::RollbackToSavepoint => {
                let t = &mut self.tx[s];
                let m =
                    t.sp.clone()
                        .ok_or_else(|| format!("schedule: {name} has no savepoint"))?;
                t.biz = m.biz;
                t.seen = m.seen;
                t.last = m.last;
                t.intents.truncate(m.intents);
                let release = match self.locking {
                    Locking::Postgres => true,
                    Locking::Mariadb => !m.wrote,
                    Locking::OneWriter => false,
                };
                if release {
                    t.rows.retain(|(_, after)| !after);
                }
                done.push((s, Outcome::default()));
            }
            Op::Commit => {
                let t = std::mem::take(&mut self.tx[s]);
                self.biz.extend(t.biz);
                for (a, v) in t.intents {
                    self.intents.entry(a).or_default().insert(v);
                }
                done.push((s, Outcome::default()));
            }
            Op::Rollback => {
                self.tx[s] = Tx::default();
                done.push((s, Outcome::default()));
            }
        }
        Ok(())
    }

    /// The same step issued with `r` ahead of the other waiters for the row it waits for, if
    /// that step releases the row to one of them and the outcomes `got` so far still hold: the
    /// new model and the outcomes it expects that have not come yet. PostgreSQL does not queue
    /// row waiters strictly: a waiter that finds the row updated by the committed holder
    /// follows the update chain and takes the new row version's lock, racing the others.
    fn prefer(
        &self,
        r: usize,
        (s, op): (usize, Op),
        got: &[(usize, Outcome)],
    ) -> Option<(Model, Vec<(usize, Outcome)>)> {
        let (want @ Want::Row(_), _) = self.tx[r].waits? else {
            return None;
        };
        let first = self
            .queue
            .iter()
            .position(|&q| q != r && self.tx[q].waits.map(|(w, _)| w) == Some(want))?;
        let mut alt = self.clone();
        alt.queue.retain(|&q| q != r);
        alt.queue.insert(first, r);
        let done = alt.issue(s, op).ok()?;
        let still = |g: &(usize, Outcome)| done.contains(g);
        let r_runs = done.iter().any(|(d, _)| *d == r);
        (got.iter().all(still) && r_runs).then_some((alt, done))
    }

    /// Grants waiters whose lock is free, in request order, until nothing changes.
    fn wake(&mut self, done: &mut Vec<(usize, Outcome)>) -> Result<(), String> {
        'again: loop {
            for i in 0..self.queue.len() {
                let s = self.queue[i];
                let (want, op) = self.tx[s].waits.expect("a queued session waits");
                if self.holder(want, s).is_some() {
                    continue;
                }
                self.queue.remove(i);
                self.tx[s].waits = None;
                match want {
                    Want::Writer => self.tx[s].writer = true,
                    // the key's owner committed: this insert fails and tries again
                    Want::Key(a, v) if self.intents.get(a).is_some_and(|vs| vs.contains(&v)) => {
                        self.tx[s].conflicts += 1
                    }
                    _ => {}
                }
                self.run(s, op, done)?;
                continue 'again;
            }
            return Ok(());
        }
    }
}

/// Every order in which sessions can issue the steps of `scripts` (a waiting session issues
/// nothing until it runs; orders that deadlock are left out), as session indices.
fn explore(locking: Locking, scripts: &[Vec<Op>]) -> Vec<Vec<usize>> {
    fn rec(
        m: &Model,
        scripts: &[Vec<Op>],
        pcs: &mut [usize],
        order: &mut Vec<usize>,
        out: &mut Vec<Vec<usize>>,
    ) {
        if pcs.iter().zip(scripts).all(|(p, s)| *p == s.len()) {
            out.push(order.clone());
            return;
        }
        for s in 0..scripts.len() {
            if pcs[s] == scripts[s].len() || m.waiting(s) {
                continue;
            }
            let mut next = m.clone();
            if next.issue(s, scripts[s][pcs[s]]).is_err() {
                continue;
            }
            pcs[s] += 1;
            order.push(s);
            rec(&next, scripts, pcs, order, out);
            pcs[s] -= 1;
            order.pop();
        }
    }
    let mut out = Vec::new();
    let m = Model::new(locking, scripts.len());
    rec(
        &m,
        scripts,
        &mut vec![0; scripts.len()],
        &mut Vec::new(),
        &mut out,
    );
    out
}

/// Hands out a schedule's steps in the order the sessions can issue them: a step of a session
/// that waits (or that has a step deferred already) is deferred until the session runs, then
/// handed out before the schedule goes on. Each step comes with its index in the schedule.
struct Issuer<'a> {
    planned: std::iter::Enumerate<std::slice::Iter<'a, (usize, Op)>>,
    deferred: Vec<VecDeque<(usize, Op)>>,
}

impl<'a> Issuer<'a> {
    fn new(steps: &'a [(usize, Op)], sessions: usize) -> Self {
        Self {
            planned: steps.iter().enumerate(),
            deferred: vec![VecDeque::new(); sessions],
        }
    }

    /// The next step to issue on `model` (which must have seen every step handed out so far):
    /// `(index, session, op)`, or `None` when nothing is left to hand out.
    fn next(&mut self, model: &Model) -> Option<(usize, usize, Op)> {
        loop {
            let ready = (0..self.deferred.len())
                .find(|&s| !model.waiting(s) && !self.deferred[s].is_empty());
            if let Some(s) = ready {
                let (k, op) = self.deferred[s].pop_front().expect("a deferred step");
                return Some((k, s, op));
            }
            let (k, &(s, op)) = self.planned.next()?;
            if model.waiting(s) || !self.deferred[s].is_empty() {
                self.deferred[s].push_back((k, op));
                continue;
            }
            return Some((k, s, op));
        }
    }

    /// Steps of session `s` still deferred (it never ran again).
    fn deferred(&self, s: usize) -> usize {
        self.deferred[s].len()
    }
}

/// The steps of a fixed schedule in the order they can be issued on `locking` (see [`Issuer`]).
fn arrange(
    locking: Locking,
    sessions: usize,
    steps: &[(usize, Op)],
) -> Result<Vec<(usize, Op)>, String> {
    let mut m = Model::new(locking, sessions);
    let mut issuer = Issuer::new(steps, sessions);
    let mut out = Vec::new();
    while let Some((_, s, op)) = issuer.next(&m) {
        m.issue(s, op)
            .map_err(|e| format!("{} {}: {e}", letter(s), op.describe()))?;
        out.push((s, op));
    }
    if let Some(s) = (0..sessions).find(|&s| issuer.deferred(s) > 0) {
        return Err(format!(
            "the schedule cannot finish: {} still waits with {} steps left",
            letter(s),
            issuer.deferred(s)
        ));
    }
    Ok(out)
}

// ------------------------------------------------------------------------------ delivery check

/// One intent a producer wrote, named by the step that wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Intent {
    tag: String,
    agg: String,
    version: i64,
}

/// One event the relay got, in delivery order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Delivered {
    tag: String,
    agg: String,
    version: i64,
    /// Where the read found it (cursor position or `seq`), for messages.
    at: String,
}

fn payload(tag: &str) -> String {
    format!(r#"{{"tag":"{tag}"}}"#)
}

fn tag_of(payload: &str) -> String {
    payload
        .strip_prefix(r#"{"tag":""#)
        .and_then(|r| r.strip_suffix(r#""}"#))
        .unwrap_or(payload)
        .to_string()
}

/// The problems with a delivery: per aggregate, first occurrences must have strictly increasing
/// versions; every committed intent must be delivered, exactly once; no rolled-back intent and
/// nothing no session wrote. Empty when the delivery is right.
fn check_delivery(
    delivered: &[Delivered],
    committed: &[Intent],
    discarded: &[Intent],
) -> Vec<String> {
    let mut problems = Vec::new();
    let committed_tags: BTreeSet<&str> = committed.iter().map(|i| i.tag.as_str()).collect();
    let discarded_tags: BTreeSet<&str> = discarded.iter().map(|i| i.tag.as_str()).collect();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut last: BTreeMap<&str, &Delivered> = BTreeMap::new();
    for d in delivered {
        if !seen.insert(d.tag.as_str()) {
            problems.push(format!(
                "{} v{} delivered twice (again at {})",
                d.agg, d.version, d.at
            ));
            continue;
        }
        if discarded_tags.contains(d.tag.as_str()) {
            problems.push(format!(
                "{} v{} ({}) was rolled back but delivered at {}",
                d.agg, d.version, d.tag, d.at
            ));
        } else if !committed_tags.contains(d.tag.as_str()) {
            problems.push(format!(
                "{} v{} ({}) at {} was written by no session",
                d.agg, d.version, d.tag, d.at
            ));
        }
        if let Some(prev) = last.get(d.agg.as_str()) {
            if d.version <= prev.version {
                problems.push(format!(
                    "{}: v{} (at {}) was delivered before v{} (at {})",
                    d.agg, prev.version, prev.at, d.version, d.at
                ));
            }
        }
        last.insert(d.agg.as_str(), d);
    }
    for i in committed {
        if !seen.contains(i.tag.as_str()) {
            problems.push(format!(
                "{} v{} ({}) committed but never delivered",
                i.agg, i.version, i.tag
            ));
        }
    }
    problems
}

/// Committed versions of each aggregate must be 1, 2, …, n (the business row's versions).
fn check_versions(committed: &[Intent]) -> Vec<String> {
    let mut by_agg: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for i in committed {
        by_agg.entry(i.agg.as_str()).or_default().push(i.version);
    }
    by_agg
        .into_iter()
        .filter_map(|(agg, mut vs)| {
            vs.sort_unstable();
            let want: Vec<i64> = (1..=vs.len() as i64).collect();
            (vs != want).then(|| format!("{agg}: committed versions {vs:?}, want {want:?}"))
        })
        .collect()
}

// ------------------------------------------------------------------------------ sessions

/// SQLite: who holds the write gate and who is queued for it (set by the sessions).
struct GateFlags {
    holder: AtomicUsize,
    queued: Vec<AtomicBool>,
}

const NOBODY: usize = usize::MAX;

enum Conn {
    Pg(PgConnection),
    My(MySqlConnection),
    Lite {
        conn: SqliteConnection,
        gate: Arc<tokio::sync::Mutex<()>>,
        guard: Option<OwnedMutexGuard<()>>,
        flags: Arc<GateFlags>,
    },
}

/// Runs `$body` with `$c` bound to the connection and `$pg` telling whether it is PostgreSQL
/// (for [`placeholder`](crate::placeholder)).
macro_rules! on {
    ($conn:expr, $c:ident, $pg:ident => $body:expr) => {
        match $conn {
            Conn::Pg($c) => {
                let $pg = true;
                $body
            }
            Conn::My($c) => {
                let $pg = false;
                $body
            }
            Conn::Lite { conn: $c, .. } => {
                let $pg = false;
                $body
            }
        }
    };
}

/// One producer session: a connection and what the application remembers in its transaction.
struct Session {
    s: usize,
    conn: Conn,
    open: bool,
    seen: BTreeMap<String, i64>,
    last: BTreeMap<String, i64>,
    mark: Option<(BTreeMap<String, i64>, BTreeMap<String, i64>)>,
}

/// A step sent to a session.
struct Cmd {
    op: Op,
    /// The business row / aggregate id, prefixed for this run.
    agg: String,
    /// The intent's tag (its payload), when the step writes one.
    tag: String,
}

/// A session's answer: the step's outcome or the database's error.
struct Reply {
    s: usize,
    result: Result<Outcome, String>,
}

fn db_msg(what: &str, e: sqlx::Error) -> String {
    format!("{what}: {e}")
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.is_unique_violation())
}

impl Session {
    async fn exec(&mut self, sql: &str) -> Result<(), sqlx::Error> {
        on!(&mut self.conn, c, _pg => c.execute(sql).await.map(drop))
    }

    async fn begin(&mut self) -> Result<(), sqlx::Error> {
        match &mut self.conn {
            Conn::Pg(c) => c
                .execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                .await
                .map(drop),
            Conn::My(c) => c.execute("START TRANSACTION").await.map(drop),
            Conn::Lite {
                conn,
                gate,
                guard,
                flags,
            } => {
                // as ferry_store::sqlite::begin_write: the gate first, then the write lock
                flags.queued[self.s].store(true, Ordering::SeqCst);
                let g = gate.clone().lock_owned().await;
                flags.holder.store(self.s, Ordering::SeqCst);
                flags.queued[self.s].store(false, Ordering::SeqCst);
                *guard = Some(g);
                conn.execute("BEGIN IMMEDIATE").await.map(drop)
            }
        }
    }

    /// `COMMIT` or `ROLLBACK`; on SQLite the gate is released after it (the holder flag first).
    async fn end(&mut self, sql: &str) -> Result<(), sqlx::Error> {
        let r = self.exec(sql).await;
        if let Conn::Lite { guard, flags, .. } = &mut self.conn {
            flags.holder.store(NOBODY, Ordering::SeqCst);
            *guard = None;
        }
        self.open = false;
        self.seen.clear();
        self.last.clear();
        self.mark = None;
        r
    }

    async fn bump(&mut self, agg: &str) -> Result<i64, sqlx::Error> {
        match &mut self.conn {
            Conn::My(c) => {
                sqlx::query("UPDATE ferry_it_biz SET ver = ver + 1 WHERE id = ?")
                    .bind(agg)
                    .execute(&mut *c)
                    .await?;
                sqlx::query_scalar("SELECT ver FROM ferry_it_biz WHERE id = ?")
                    .bind(agg)
                    .fetch_one(&mut *c)
                    .await
            }
            conn => on!(conn, c, pg => sqlx::query_scalar(&crate::placeholder(
                "UPDATE ferry_it_biz SET ver = ver + 1 WHERE id = ? RETURNING ver",
                pg,
            ))
            .bind(agg)
            .fetch_one(&mut *c)
            .await),
        }
    }

    async fn lock_read(&mut self, agg: &str) -> Result<i64, sqlx::Error> {
        // SQLite has no FOR UPDATE: the transaction holds the one write lock already
        let sql = match self.conn {
            Conn::Lite { .. } => "SELECT ver FROM ferry_it_biz WHERE id = ?",
            _ => "SELECT ver FROM ferry_it_biz WHERE id = ? FOR UPDATE",
        };
        on!(&mut self.conn, c, pg => sqlx::query_scalar(&crate::placeholder(sql, pg))
            .bind(agg)
            .fetch_one(&mut *c)
            .await)
    }

    async fn write(&mut self, agg: &str, v: i64) -> Result<(), sqlx::Error> {
        let sql = "UPDATE ferry_it_biz SET ver = ? WHERE id = ?";
        on!(&mut self.conn, c, pg => sqlx::query(&crate::placeholder(sql, pg))
            .bind(v)
            .bind(agg)
            .execute(&mut *c)
            .await
            .map(drop))
    }

    /// The producer's one plain INSERT (docs/schema.md §2.1); SQLite's goes through the view
    /// `ferry_outbox_insert`.
    async fn insert(&mut self, agg: &str, v: i64, tag: &str) -> Result<(), sqlx::Error> {
        let table = match self.conn {
            Conn::Lite { .. } => "ferry_outbox_insert",
            _ => "ferry_outbox",
        };
        let sql = format!(
            "INSERT INTO {table} (aggregate_id, aggregate_version, topic, event_type, payload) \
             VALUES (?, ?, ?, 'Changed', ?)"
        );
        let body = payload(tag);
        on!(&mut self.conn, c, pg => sqlx::query(&crate::placeholder(&sql, pg))
            .bind(agg)
            .bind(v)
            .bind(TOPIC)
            .bind(&body)
            .execute(&mut *c)
            .await
            .map(drop))
    }

    async fn max_version(&mut self, agg: &str) -> Result<i64, sqlx::Error> {
        let sql =
            "SELECT COALESCE(MAX(aggregate_version), 0) FROM ferry_outbox WHERE aggregate_id = ?";
        on!(&mut self.conn, c, pg => sqlx::query_scalar(&crate::placeholder(sql, pg))
            .bind(agg)
            .fetch_one(&mut *c)
            .await)
    }

    /// A blind writer: max + 1 in a savepoint of its own, again after each unique violation.
    async fn optimistic(&mut self, agg: &str, tag: &str) -> Result<Outcome, sqlx::Error> {
        let mut conflicts = 0;
        loop {
            self.exec("SAVEPOINT ferry_it_opt").await?;
            let v = self.max_version(agg).await? + 1;
            match self.insert(agg, v, tag).await {
                Ok(()) => {
                    self.exec("RELEASE SAVEPOINT ferry_it_opt").await?;
                    return Ok(Outcome {
                        version: Some(v),
                        conflicts,
                    });
                }
                Err(e) if is_unique_violation(&e) && conflicts < 10 => {
                    self.exec("ROLLBACK TO SAVEPOINT ferry_it_opt").await?;
                    conflicts += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn step(&mut self, cmd: &Cmd) -> Result<Outcome, String> {
        let what = format!("{} {} ({})", letter(self.s), cmd.op.describe(), cmd.agg);
        let err = |e: sqlx::Error| db_msg(&what, e);
        if !self.open {
            self.begin().await.map_err(err)?;
            self.open = true;
        }
        let agg = cmd.agg.as_str();
        Ok(match cmd.op {
            Op::Bump(_) => {
                let v = self.bump(agg).await.map_err(err)?;
                self.last.insert(agg.into(), v);
                Outcome::version(v)
            }
            Op::LockRead(_) => {
                let v = self.lock_read(agg).await.map_err(err)?;
                self.seen.insert(agg.into(), v);
                Outcome::version(v)
            }
            Op::WriteNext(_) => {
                let v = self.seen.get(agg).copied().ok_or("write before read")? + 1;
                self.write(agg, v).await.map_err(err)?;
                self.last.insert(agg.into(), v);
                Outcome::version(v)
            }
            Op::Insert(_) => {
                let v = self.last.get(agg).copied().ok_or("insert before write")?;
                self.insert(agg, v, &cmd.tag).await.map_err(err)?;
                Outcome::version(v)
            }
            Op::Optimistic(_) => self.optimistic(agg, &cmd.tag).await.map_err(err)?,
            Op::Savepoint => {
                self.exec("SAVEPOINT ferry_it_sp").await.map_err(err)?;
                self.mark = Some((self.seen.clone(), self.last.clone()));
                Outcome::default()
            }
            Op::RollbackToSavepoint => {
                self.exec("ROLLBACK TO SAVEPOINT ferry_it_sp")
                    .await
                    .map_err(err)?;
                if let Some((seen, last)) = self.mark.clone() {
                    self.seen = seen;
                    self.last = last;
                }
                Outcome::default()
            }
            Op::Commit => {
                self.end("COMMIT").await.map_err(err)?;
                Outcome::default()
            }
            Op::Rollback => {
                self.end("ROLLBACK").await.map_err(err)?;
                Outcome::default()
            }
        })
    }
}

async fn session_task(
    mut session: Session,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    tx: mpsc::UnboundedSender<Reply>,
) {
    while let Some(cmd) = rx.recv().await {
        let result = session.step(&cmd).await;
        if tx
            .send(Reply {
                s: session.s,
                result,
            })
            .is_err()
        {
            break;
        }
    }
    if session.open {
        let _ = session.end("ROLLBACK").await;
    }
    on!(session.conn, c, _pg => { let _ = c.close().await; });
}

// ------------------------------------------------------------------------------ the server

/// A connection of the harness itself: setup, the final table check, and the wait monitor.
enum Server {
    Pg(PgConnection),
    My(MySqlConnection),
    Lite(sqlx::SqlitePool),
}

/// A session as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Running,
    Waiting(String),
}

impl Server {
    async fn exec(&mut self, sql: &str) -> Result<(), String> {
        match self {
            Server::Pg(c) => c.execute(sql).await.map(drop),
            Server::My(c) => c.execute(sql).await.map(drop),
            Server::Lite(p) => p.execute(sql).await.map(drop),
        }
        .map_err(|e| db_msg(sql, e))
    }

    /// The tags of every intent in the outbox table.
    async fn outbox_tags(&mut self) -> Result<BTreeSet<String>, String> {
        let sql = "SELECT payload FROM ferry_outbox";
        let payloads: Vec<String> = match self {
            Server::Pg(c) => sqlx::query_scalar(sql).fetch_all(c).await,
            // a BLOB on MariaDB
            Server::My(c) => sqlx::query_scalar::<_, Vec<u8>>(sql)
                .fetch_all(c)
                .await
                .map(|v| {
                    v.into_iter()
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                        .collect()
                }),
            Server::Lite(p) => sqlx::query_scalar(sql).fetch_all(&*p).await,
        }
        .map_err(|e| db_msg(sql, e))?;
        Ok(payloads.iter().map(|p| tag_of(p)).collect())
    }
}

/// How the harness learns whether a session waits (see the module doc).
enum Monitor {
    /// Backend pids of the sessions.
    Pg(Vec<i32>),
    /// Connection ids of the sessions.
    My(Vec<u64>),
    Lite(Arc<GateFlags>),
}

/// `SHOW ENGINE INNODB STATUS`'s transaction list: connection id → waiting for a lock.
fn innodb_lock_waits(status: &str) -> BTreeMap<u64, bool> {
    let mut out = BTreeMap::new();
    for block in status.split("---TRANSACTION ").skip(1) {
        // the last transaction's block runs into the next section
        let block = block.split("\n--------\n").next().unwrap_or(block);
        let Some(i) = block.find("thread id ") else {
            continue;
        };
        let digits: String = block[i + "thread id ".len()..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        if let Ok(id) = digits.parse() {
            let waiting = block.lines().any(|l| l.starts_with("LOCK WAIT"));
            out.insert(id, waiting);
        }
    }
    out
}

impl Monitor {
    async fn poll(&self, server: &mut Server) -> Result<Vec<Seen>, String> {
        match (self, server) {
            (Monitor::Pg(pids), Server::Pg(c)) => {
                let rows = sqlx::query(
                    "SELECT pid, coalesce(wait_event_type, ''), coalesce(wait_event, ''), \
                     pg_blocking_pids(pid) FROM pg_stat_activity WHERE pid = ANY($1)",
                )
                .bind(&pids[..])
                .fetch_all(&mut *c)
                .await
                .map_err(|e| db_msg("pg_stat_activity", e))?;
                let mut seen = vec![Seen::Running; pids.len()];
                for r in rows {
                    let pid: i32 = r.get(0);
                    let (kind, event): (String, String) = (r.get(1), r.get(2));
                    let blockers: Vec<i32> = r.get(3);
                    let Some(s) = pids.iter().position(|p| *p == pid) else {
                        continue;
                    };
                    if kind == "Lock" && !blockers.is_empty() {
                        let names: Vec<String> = blockers
                            .iter()
                            .map(|b| match pids.iter().position(|p| p == b) {
                                Some(i) => letter(i).to_string(),
                                None => format!("pid {b}, not a session of this case"),
                            })
                            .collect();
                        seen[s] = Seen::Waiting(format!(
                            "pg_stat_activity: Lock/{event}, blocked by {}",
                            names.join(", ")
                        ));
                    }
                }
                Ok(seen)
            }
            (Monitor::My(ids), Server::My(c)) => {
                // a text-protocol query: SHOW ENGINE is not a statement to prepare
                let row = c
                    .fetch_one("SHOW ENGINE INNODB STATUS")
                    .await
                    .map_err(|e| db_msg("SHOW ENGINE INNODB STATUS", e))?;
                let status: String = row
                    .try_get::<String, _>(2)
                    .or_else(|_| {
                        row.try_get::<Vec<u8>, _>(2)
                            .map(|b| String::from_utf8_lossy(&b).into_owned())
                    })
                    .map_err(|e| db_msg("InnoDB status text", e))?;
                let waits = innodb_lock_waits(&status);
                Ok(ids
                    .iter()
                    .map(|id| match waits.get(id) {
                        Some(true) => Seen::Waiting("InnoDB: LOCK WAIT".into()),
                        _ => Seen::Running,
                    })
                    .collect())
            }
            (Monitor::Lite(flags), _) => {
                let holder = flags.holder.load(Ordering::SeqCst);
                Ok(flags
                    .queued
                    .iter()
                    .enumerate()
                    .map(|(s, q)| {
                        if q.load(Ordering::SeqCst) && holder != NOBODY && holder != s {
                            Seen::Waiting(format!(
                                "queued for the write gate {} holds",
                                letter(holder)
                            ))
                        } else {
                            Seen::Running
                        }
                    })
                    .collect())
            }
            _ => Err("monitor and server of different backends".into()),
        }
    }
}

// ------------------------------------------------------------------------------ the harness

/// What a run of one schedule left behind.
#[derive(Debug, Default)]
struct Book {
    committed: Vec<Intent>,
    discarded: Vec<Intent>,
    /// Per session: intents of the open transaction, and how many there were at the savepoint.
    open: Vec<(Vec<Intent>, Option<usize>)>,
    /// Waits the server showed, as the model predicted.
    waits: usize,
    steps: usize,
}

struct Harness {
    locking: Locking,
    sessions: Vec<mpsc::UnboundedSender<Cmd>>,
    replies: mpsc::UnboundedReceiver<Reply>,
    server: Server,
    monitor: Monitor,
    book: Book,
}

impl Harness {
    async fn open(db: &TestDb, n: usize) -> Harness {
        let (reply_tx, replies) = mpsc::unbounded_channel();
        let mut sessions = Vec::new();
        let flags = Arc::new(GateFlags {
            holder: AtomicUsize::new(NOBODY),
            queued: (0..n).map(|_| AtomicBool::new(false)).collect(),
        });
        let (server, monitor) = match db.backend {
            Backend::Postgres => {
                let mut pids = Vec::new();
                for s in 0..n {
                    let mut c = PgConnection::connect(&db.url).await.expect("session");
                    c.execute("SET lock_timeout = '30s'").await.expect("set");
                    pids.push(
                        sqlx::query_scalar("SELECT pg_backend_pid()")
                            .fetch_one(&mut c)
                            .await
                            .expect("pid"),
                    );
                    sessions.push(spawn(s, Conn::Pg(c), &reply_tx));
                }
                let server = PgConnection::connect(&db.url).await.expect("server");
                (Server::Pg(server), Monitor::Pg(pids))
            }
            Backend::Mysql => {
                let mut ids = Vec::new();
                for s in 0..n {
                    let mut c = MySqlConnection::connect(&db.url).await.expect("session");
                    c.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await
                        .expect("set");
                    c.execute("SET SESSION innodb_lock_wait_timeout = 30")
                        .await
                        .expect("set");
                    ids.push(
                        sqlx::query_scalar("SELECT CONNECTION_ID()")
                            .fetch_one(&mut c)
                            .await
                            .expect("connection id"),
                    );
                    sessions.push(spawn(s, Conn::My(c), &reply_tx));
                }
                let server = MySqlConnection::connect(&db.url).await.expect("server");
                (Server::My(server), Monitor::My(ids))
            }
            Backend::Sqlite => {
                let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&db.url)
                    .expect("SQLite URL")
                    .busy_timeout(Duration::from_secs(10));
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(n as u32 + 1)
                    .connect_with(opts)
                    .await
                    .expect("SQLite pool");
                let gate = ferry_store::sqlite::write_gate(&pool);
                for s in 0..n {
                    let conn = pool.acquire().await.expect("session").detach();
                    let conn = Conn::Lite {
                        conn,
                        gate: gate.clone(),
                        guard: None,
                        flags: flags.clone(),
                    };
                    sessions.push(spawn(s, conn, &reply_tx));
                }
                (Server::Lite(pool), Monitor::Lite(flags))
            }
        };
        Harness {
            locking: Locking::of(db.backend),
            sessions,
            replies,
            server,
            monitor,
            book: Book {
                open: vec![(Vec::new(), None); n],
                ..Book::default()
            },
        }
    }

    /// Runs one schedule on the rows of `prefix`: the steps in `order`, except that a step of
    /// a session that waits is deferred until the session runs (the server may grant a row to
    /// another waiter than the model's first one, see [`Model::prefer`]). `reader`, when given,
    /// reads after every step. The returned log lists the steps as they ran (with the versions
    /// they got and the waits the server showed).
    async fn run(
        &mut self,
        prefix: &str,
        order: &[(usize, Op)],
        mut reader: Option<&mut Reader>,
        db: &TestDb,
    ) -> Result<Vec<String>, String> {
        let n = self.sessions.len();
        let mut model = Model::new(self.locking, n);
        let mut log = Vec::new();
        let mut flight: Vec<Option<InFlight>> = (0..n).map(|_| None).collect();
        let mut issuer = Issuer::new(order, n);
        while let Some((k, s, op)) = issuer.next(&model) {
            let step = InFlight {
                what: format!("{} {}", letter(s), op.describe()),
                op,
                agg: op.agg().map(|a| format!("{prefix}{a}")).unwrap_or_default(),
                tag: format!("{prefix}{}{k}", letter(s)),
                waited: false,
            };
            self.step(&mut model, s, step, &mut flight, &mut log)
                .await
                .map_err(|e| format!("{e}\nsteps so far:\n  {}", log.join("\n  ")))?;
            if let Some(r) = reader.as_deref_mut() {
                // a row claim writes: on SQLite it would wait for an open producer
                if r.mode == DispatchMode::Cursor || !model.holds_writer() {
                    r.read(db).await?;
                }
            }
        }
        if let Some(s) = (0..n).find(|&s| flight[s].is_some() || issuer.deferred(s) > 0) {
            return Err(format!("{} did not finish its steps", letter(s)));
        }
        Ok(log)
    }

    /// Sends one step and waits until the steps the model says finished have finished (with
    /// the model's outcomes) and the sessions it says wait are seen waiting by the server.
    async fn step(
        &mut self,
        model: &mut Model,
        s: usize,
        step: InFlight,
        flight: &mut [Option<InFlight>],
        log: &mut Vec<String>,
    ) -> Result<(), String> {
        let op = step.op;
        self.sessions[s]
            .send(Cmd {
                op,
                agg: step.agg.clone(),
                tag: step.tag.clone(),
            })
            .map_err(|_| "a session ended".to_string())?;
        self.book.steps += 1;
        let before = model.clone();
        let done = model
            .issue(s, op)
            .map_err(|e| format!("{}: {e}", step.what))?;
        let waits = model.waiting(s);
        if waits {
            log.push(format!("{} … waits", step.what));
        }
        flight[s] = Some(InFlight {
            waited: waits,
            ..step
        });
        let deadline = Instant::now() + STEP_DEADLINE;
        let what = |flight: &[Option<InFlight>], s: usize| {
            flight[s]
                .as_ref()
                .map_or_else(|| letter(s).to_string(), |f| f.what.clone())
        };
        let mut expect: BTreeMap<usize, Outcome> = done.iter().copied().collect();
        let mut done_order: Vec<usize> = done.iter().map(|(d, _)| *d).collect();
        let mut got: Vec<(usize, Outcome)> = Vec::new();
        // log lines of the steps that finished, in the order the replies came
        let mut lines: Vec<(usize, String)> = Vec::new();
        let mut diagnose_at = Instant::now() + Duration::from_secs(2);
        while !expect.is_empty() {
            match tokio::time::timeout(Duration::from_millis(100), self.replies.recv()).await {
                Ok(Some(reply)) => {
                    let r = reply.s;
                    if !expect.contains_key(&r) {
                        // the server granted a released row to another of its waiters
                        if let Some((alt, alt_done)) = before.prefer(r, (s, op), &got) {
                            *model = alt;
                            done_order = alt_done.iter().map(|(d, _)| *d).collect();
                            expect = alt_done.into_iter().filter(|g| !got.contains(g)).collect();
                        }
                    }
                    let want = expect.remove(&r);
                    if let (Some(w), Ok(o)) = (want, &reply.result) {
                        if *o == w {
                            got.push((r, w));
                        }
                    }
                    lines.push((r, self.accept(reply, want, flight)?));
                }
                Ok(None) => return Err("every session ended".into()),
                Err(_) => {
                    let now = Instant::now();
                    if now > diagnose_at {
                        diagnose_at = now + Duration::from_secs(1);
                        let seen = self.monitor.poll(&mut self.server).await?;
                        for &e in expect.keys() {
                            if let Seen::Waiting(how) = &seen[e] {
                                return Err(format!(
                                    "{} waits ({how}), the model expected it to run",
                                    what(flight, e)
                                ));
                            }
                        }
                    }
                    if now > deadline {
                        let late: Vec<String> = expect.keys().map(|&e| what(flight, e)).collect();
                        return Err(format!("{late:?} did not finish within {STEP_DEADLINE:?}"));
                    }
                }
            }
        }
        // the log in the model's order: the step sent first, then the waiters it released
        lines.sort_by_key(|(r, _)| (*r != s, done_order.iter().position(|o| o == r)));
        log.extend(lines.into_iter().map(|(_, l)| l));
        let waiting = model.queue.clone();
        if waiting.is_empty() {
            return Ok(());
        }
        loop {
            if let Ok(reply) = self.replies.try_recv() {
                self.accept(reply, None, flight)?;
            }
            let seen = self.monitor.poll(&mut self.server).await?;
            if waiting.iter().all(|&w| matches!(seen[w], Seen::Waiting(_))) {
                for &w in &waiting {
                    let (Seen::Waiting(how), Some(f)) = (&seen[w], flight[w].as_ref()) else {
                        continue;
                    };
                    let line = format!("{} … waits", f.what);
                    if let Some(l) = log.iter_mut().rev().find(|l| **l == line) {
                        *l = format!("{line} ({how})");
                        self.book.waits += 1;
                    }
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let running: Vec<String> = waiting
                    .iter()
                    .filter(|&&w| seen[w] == Seen::Running)
                    .map(|&w| what(flight, w))
                    .collect();
                return Err(format!(
                    "the model expects {running:?} to wait, but the server shows no wait \
                     after {STEP_DEADLINE:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Books a finished step: compares it with the model's outcome (`None`: the model expected
    /// the session to wait) and records the intents it wrote or dropped. Returns its log line.
    fn accept(
        &mut self,
        reply: Reply,
        want: Option<Outcome>,
        flight: &mut [Option<InFlight>],
    ) -> Result<String, String> {
        let s = reply.s;
        let f = flight[s]
            .take()
            .ok_or_else(|| format!("{} answered with no step in flight", letter(s)))?;
        let got = reply.result?;
        let Some(want) = want else {
            return Err(format!(
                "{} finished ({got:?}) while the model expected it to wait",
                f.what
            ));
        };
        if got != want {
            return Err(format!(
                "{}: the database returned {got:?}, the model {want:?}",
                f.what
            ));
        }
        let mut line = match (got.version, f.op) {
            (Some(v), Op::LockRead(_)) => format!("{} → sees v{v}", f.what),
            (Some(v), _) => format!("{} → v{v}", f.what),
            (None, _) => f.what.clone(),
        };
        if got.conflicts > 0 {
            line.push_str(&format!(" (after {} unique violations)", got.conflicts));
        }
        let line = if f.waited {
            format!("  ↳ {line}")
        } else {
            line
        };
        let (open, mark) = &mut self.book.open[s];
        match f.op {
            Op::Insert(_) | Op::Optimistic(_) => open.push(Intent {
                tag: f.tag,
                agg: f.agg,
                version: got.version.unwrap_or_default(),
            }),
            Op::Savepoint => *mark = Some(open.len()),
            Op::RollbackToSavepoint => {
                let keep = mark.unwrap_or(0);
                self.book.discarded.extend(open.drain(keep..));
            }
            Op::Commit => {
                self.book.committed.append(open);
                *mark = None;
            }
            Op::Rollback => {
                self.book.discarded.append(open);
                *mark = None;
            }
            _ => {}
        }
        Ok(line)
    }
}

/// A step sent to a session and not answered yet.
struct InFlight {
    /// `B bump X`, for the log.
    what: String,
    op: Op,
    agg: String,
    tag: String,
    /// The model said it waits.
    waited: bool,
}

fn spawn(
    s: usize,
    conn: Conn,
    replies: &mpsc::UnboundedSender<Reply>,
) -> mpsc::UnboundedSender<Cmd> {
    let (tx, rx) = mpsc::unbounded_channel();
    let session = Session {
        s,
        conn,
        open: false,
        seen: BTreeMap::new(),
        last: BTreeMap::new(),
        mark: None,
    };
    tokio::spawn(session_task(session, rx, replies.clone()));
    tx
}

// ------------------------------------------------------------------------------ the relay

/// Reads the outbox as a relay would, in one dispatch mode, and keeps what it got in order.
struct Reader {
    mode: DispatchMode,
    /// Cursor dispatch: every slot's in-memory read position.
    pos: BTreeMap<SlotId, CursorPos>,
    delivered: Vec<Delivered>,
    reads: usize,
}

fn cursor_store(db: &TestDb) -> &dyn CursorStore {
    db.store.cursor().expect("cursor dispatch on this store")
}

impl Reader {
    /// Puts the outbox in `mode` (before any intent is written) and, for cursor dispatch,
    /// takes every slot.
    async fn start(db: &TestDb, mode: DispatchMode) -> Reader {
        let cs = cursor_store(db);
        let mut pos = BTreeMap::new();
        if mode == DispatchMode::Cursor {
            cs.set_dispatch_mode(DispatchMode::Cursor, OWNER)
                .await
                .expect("cursor dispatch");
            db.store
                .acquire_slots(&ferry_core::SlotRequest::new(OWNER, &all_slots(), LONG))
                .await
                .expect("slots");
            for c in cs.load_cursors(OWNER, &all_slots()).await.expect("cursors") {
                pos.insert(c.slot, c.pos);
            }
            assert_eq!(pos.len(), all_slots().len(), "every slot is ours");
        } else {
            assert_eq!(
                cs.dispatch_mode().await.expect("mode"),
                DispatchMode::Row,
                "a fresh outbox is in row dispatch"
            );
        }
        Reader {
            mode,
            pos,
            delivered: Vec::new(),
            reads: 0,
        }
    }

    /// One read (cursor: from the in-memory positions, no advance) or one claim and its ack
    /// (row). Returns the events read and whether more may follow right now.
    async fn read(&mut self, db: &TestDb) -> Result<(usize, bool), String> {
        self.reads += 1;
        match self.mode {
            DispatchMode::Cursor => {
                let req = CursorRead {
                    from: self.pos.iter().map(|(s, p)| (*s, *p)).collect(),
                    limit: READ_LIMIT,
                };
                let b = tokio::time::timeout(STEP_DEADLINE, cursor_store(db).read_batch(&req))
                    .await
                    .map_err(|_| "a cursor read waited for a producer".to_string())?
                    .map_err(|e| format!("cursor read: {e}"))?;
                for e in &b.events {
                    if e.held {
                        return Err(format!("{} came back held", e.event.aggregate_id));
                    }
                    self.delivered.push(Delivered {
                        tag: tag_of(&e.event.payload),
                        agg: e.event.aggregate_id.clone(),
                        version: e.event.aggregate_version,
                        at: format!(
                            "read {}, window {} xid {} seq {}",
                            self.reads, e.pos.tick, e.pos.xid, e.pos.seq
                        ),
                    });
                }
                for (slot, p) in self.pos.iter_mut() {
                    let upto = b.upto_of(*slot);
                    if upto > *p {
                        *p = upto;
                    }
                }
                Ok((b.events.len(), b.more))
            }
            DispatchMode::Row => {
                let claim = crate::claim_all(READ_LIMIT, LONG);
                let got = tokio::time::timeout(STEP_DEADLINE, db.store.claim(&claim))
                    .await
                    .map_err(|_| "a claim waited for a producer".to_string())?
                    .map_err(|e| format!("claim: {e}"))?;
                for e in &got {
                    self.delivered.push(Delivered {
                        tag: tag_of(&e.payload),
                        agg: e.aggregate_id.clone(),
                        version: e.aggregate_version,
                        at: format!("claim {}, seq {}", self.reads, e.token.seq),
                    });
                }
                if !got.is_empty() {
                    let tokens: Vec<_> = got.iter().map(|e| e.token.clone()).collect();
                    let r = db
                        .store
                        .ack(&tokens)
                        .await
                        .map_err(|e| format!("ack: {e}"))?;
                    if r.items.iter().any(|(_, c)| *c != CasResult::Applied) {
                        return Err(format!("acks fenced: {r:?}"));
                    }
                }
                Ok((got.len(), got.len() == READ_LIMIT))
            }
        }
    }

    /// Cursor dispatch: moves every slot's durable cursor to its read position.
    async fn advance(&mut self, db: &TestDb) -> Result<(), String> {
        let cs = cursor_store(db);
        let cursors = cs
            .load_cursors(OWNER, &all_slots())
            .await
            .map_err(|e| format!("load cursors: {e}"))?;
        let slots: Vec<SlotAdvance> = cursors
            .iter()
            .filter(|c| self.pos[&c.slot] > c.pos)
            .map(|c| SlotAdvance {
                slot: c.slot,
                epoch: c.epoch,
                version: c.version,
                to: self.pos[&c.slot],
            })
            .collect();
        if slots.is_empty() {
            return Ok(());
        }
        let adv = CursorAdvance {
            owner: OWNER.into(),
            claim_id: ferry_core::new_event_id(),
            slots,
            exceptions: Vec::new(),
        };
        match cs.advance(&adv).await {
            Ok(AdvanceResult::Applied) => Ok(()),
            Ok(AdvanceResult::Fenced) => Err("the advance was fenced".into()),
            Err(e) => Err(format!("advance: {e}")),
        }
    }

    /// Reads (advancing after each cursor read) until every intent of `want` came back and a
    /// read finds nothing more.
    async fn drain(&mut self, db: &TestDb, want: &BTreeSet<String>) -> Result<(), String> {
        let deadline = Instant::now() + DRAIN_DEADLINE;
        loop {
            let (n, more) = self.read(db).await?;
            if self.mode == DispatchMode::Cursor {
                self.advance(db).await?;
            }
            if n == 0 && !more {
                let got: BTreeSet<&str> = self.delivered.iter().map(|d| d.tag.as_str()).collect();
                let missing = want.iter().filter(|t| !got.contains(t.as_str())).count();
                if missing == 0 {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "{missing} committed intents still unread after {DRAIN_DEADLINE:?}"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

// ------------------------------------------------------------------------------ cases

/// Runs `plan` on `db` and drains it in `mode`; panics with every problem found.
async fn run_case(db: TestDb, case: &str, plan: Plan, mode: DispatchMode) {
    let t0 = Instant::now();
    let backend = db.backend;
    let label = format!("{} {case} ({} dispatch)", backend.as_str(), mode.as_str());
    let mut reader = Reader::start(&db, mode).await;
    let mut h = Harness::open(&db, plan.sessions()).await;
    h.server
        .exec("CREATE TABLE ferry_it_biz (id VARCHAR(64) PRIMARY KEY, ver BIGINT NOT NULL)")
        .await
        .expect("business table");
    let runs = plan
        .runs(h.locking)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    // each run's prefix and log, in run order
    let mut logs: Vec<(String, Vec<String>)> = Vec::new();
    for run in &runs {
        let p = &run.prefix;
        h.server
            .exec(&format!(
                "INSERT INTO ferry_it_biz (id, ver) VALUES ('{p}X', 0), ('{p}Y', 0), ('{p}Z', 0)"
            ))
            .await
            .expect("business rows");
        let reads = run.read_between.then_some(&mut reader);
        match h.run(p, &run.steps, reads, &db).await {
            Ok(log) => logs.push((p.clone(), log)),
            Err(e) => panic!("{label}, run {p}: {e}"),
        }
    }
    let produced = t0.elapsed();
    let committed = std::mem::take(&mut h.book.committed);
    let discarded = std::mem::take(&mut h.book.discarded);
    let want: BTreeSet<String> = committed.iter().map(|i| i.tag.clone()).collect();
    if let Err(e) = reader.drain(&db, &want).await {
        panic!("{label}: drain: {e}");
    }
    let mut problems = check_versions(&committed);
    let table = h.server.outbox_tags().await.expect("outbox rows");
    if table != want {
        let extra: Vec<&String> = table.difference(&want).collect();
        let missing: Vec<&String> = want.difference(&table).collect();
        problems.push(format!(
            "the outbox holds {extra:?} that no committed step wrote and lacks {missing:?}"
        ));
    }
    let status = db.store.status().await.expect("status");
    if status.pending != 0 || status.claimed != 0 {
        problems.push(format!(
            "after the drain: {} pending, {} claimed",
            status.pending, status.claimed
        ));
    }
    // the delivery problems, by run (an aggregate's id starts with its run's prefix)
    let mut bad_runs = 0;
    let mut shown = Vec::new();
    for (prefix, log) in &logs {
        let of = |agg: &str| agg.starts_with(prefix.as_str());
        let d: Vec<Delivered> = reader
            .delivered
            .iter()
            .filter(|d| of(&d.agg))
            .cloned()
            .collect();
        let c: Vec<Intent> = committed.iter().filter(|i| of(&i.agg)).cloned().collect();
        let x: Vec<Intent> = discarded.iter().filter(|i| of(&i.agg)).cloned().collect();
        let p = check_delivery(&d, &c, &x);
        if p.is_empty() {
            continue;
        }
        bad_runs += 1;
        if shown.len() < 3 {
            let order: Vec<String> = d
                .iter()
                .map(|d| format!("{} v{} [{}]", d.agg, d.version, d.at))
                .collect();
            shown.push(format!(
                "run {prefix}:\n  steps:\n    {}\n  delivered:\n    {}\n  problems:\n    {}",
                log.join("\n    "),
                order.join("\n    "),
                p.join("\n    ")
            ));
        }
    }
    // problems of events outside every run (there should be none)
    let stray: Vec<&Delivered> = reader
        .delivered
        .iter()
        .filter(|d| !logs.iter().any(|(p, _)| d.agg.starts_with(p.as_str())))
        .collect();
    if !stray.is_empty() {
        problems.push(format!("delivered events of no run: {stray:?}"));
    }
    eprintln!(
        "interleave: {label}: {} runs, {} steps, {} waits seen on the server, {} committed and \
         {} rolled-back intents, {} reads; produced in {produced:?}, total {:?}",
        runs.len(),
        h.book.steps,
        h.book.waits,
        committed.len(),
        discarded.len(),
        reader.reads,
        t0.elapsed()
    );
    if let (Plan::Fixed(_), Some((_, log))) = (&plan, logs.first()) {
        let order: Vec<String> = reader
            .delivered
            .iter()
            .map(|d| format!("{} v{} [{}]", d.agg, d.version, d.at))
            .collect();
        eprintln!(
            "  steps:\n    {}\n  delivered:\n    {}",
            log.join("\n    "),
            order.join("\n    ")
        );
    }
    if bad_runs > 0 {
        problems.push(format!(
            "{bad_runs} of {} runs delivered wrongly; the first {}:\n{}",
            runs.len(),
            shown.len(),
            shown.join("\n")
        ));
    }
    assert!(problems.is_empty(), "{label}:\n{}", problems.join("\n"));
}

/// Declares the case functions (one per plan and dispatch mode) and [`CASES`].
macro_rules! cases {
    ($($(#[doc = $doc:expr])* $plan:ident: $cursor:ident, $row:ident;)*) => {
        $(
            $(#[doc = $doc])*
            ///
            /// Cursor dispatch.
            pub async fn $cursor(db: TestDb) {
                run_case(db, stringify!($plan), $plan(), DispatchMode::Cursor).await
            }
            $(#[doc = $doc])*
            ///
            /// Row dispatch.
            pub async fn $row(db: TestDb) {
                run_case(db, stringify!($plan), $plan(), DispatchMode::Row).await
            }
        )*

        /// Every case, in the order
        /// [`interleave_conformance!`](crate::interleave_conformance) instantiates them.
        pub const CASES: &[Case<TestDb>] = &[
            $(
                Case { name: stringify!($cursor), sql_only: true, run: |db| Box::pin($cursor(db)) },
                Case { name: stringify!($row), sql_only: true, run: |db| Box::pin($row(db)) },
            )*
        ];
    };
}

cases! {
    /// Issue #33: v2 written by the transaction with the lower transaction id, after waiting
    /// for v1's row lock.
    cross_xid: interleave_cross_xid_cursor, interleave_cross_xid_row;
    /// Three transactions queued on one row lock.
    three_queued: interleave_three_queued_cursor, interleave_three_queued_row;
    /// Two versions of one aggregate in each of two transactions.
    two_versions: interleave_two_versions_cursor, interleave_two_versions_row;
    /// A version rolled back to a savepoint never appears; the one written again does.
    savepoint_rolled_back: interleave_savepoint_rolled_back_cursor, interleave_savepoint_rolled_back_row;
    /// A row lock taken inside a savepoint, before the first write, that is rolled back while
    /// another transaction waits.
    savepoint_lock: interleave_savepoint_lock_cursor, interleave_savepoint_lock_row;
    /// The same after an earlier write (PostgreSQL releases the lock, MariaDB keeps it).
    savepoint_lock_after_write: interleave_savepoint_lock_after_write_cursor,
        interleave_savepoint_lock_after_write_row;
    /// The lock by `SELECT … FOR UPDATE`, the version read, then written.
    lock_for_update: interleave_lock_for_update_cursor, interleave_lock_for_update_row;
    /// Versions from the unique key: blind writers lose on a unique violation and retry.
    optimistic: interleave_optimistic_cursor, interleave_optimistic_row;
    /// Every interleaving of two transactions that write one aggregate.
    explore_two: interleave_explore_two_cursor, interleave_explore_two_row;
    /// Every interleaving of three transactions that write one aggregate, one rolling back.
    explore_three: interleave_explore_three_cursor, interleave_explore_three_row;
}

/// Runs every case, in order, each on a fresh database from `factory`. Panics at the first
/// failing case.
pub async fn exercise<F, Fut>(mut factory: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = TestDb>,
{
    for case in CASES {
        let db = factory().await;
        let cleanup = db.cleanup_handle();
        (case.run)(db).await;
        cleanup.run().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
