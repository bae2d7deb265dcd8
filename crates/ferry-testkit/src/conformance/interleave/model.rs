//! The lock model (see the module doc of `interleave`): which step waits, which waiter runs
//! at a release and each version a step reads or writes; the explorer that enumerates every
//! interleaving the database can produce; the order a fixed schedule is issued in.
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ferry_store::Backend;

use super::op::{letter, Agg, Op};

/// How a backend makes producers wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Locking {
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
    pub(super) fn of(backend: Backend) -> Self {
        match backend {
            Backend::Postgres => Locking::Postgres,
            Backend::Mysql => Locking::Mariadb,
            Backend::Sqlite => Locking::OneWriter,
        }
    }
}

/// What a waiting step waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    /// A business row's lock.
    Row(Agg),
    /// The one writer (SQLite).
    Writer,
    /// An uncommitted intent of another transaction with this key (the unique index).
    Key(Agg, i64),
}

/// What a finished step returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Outcome {
    /// The version read or written (bump, lock, write, insert).
    pub(super) version: Option<i64>,
    /// Unique violations an optimistic insert lost before it succeeded.
    pub(super) conflicts: u32,
}

impl Outcome {
    pub(super) fn version(v: i64) -> Self {
        Self {
            version: Some(v),
            conflicts: 0,
        }
    }
}

/// A transaction's state at a savepoint.
#[derive(Debug, Clone, Default)]
pub(super) struct Mark {
    /// The transaction had written before the savepoint.
    wrote: bool,
    biz: BTreeMap<Agg, i64>,
    seen: BTreeMap<Agg, i64>,
    last: BTreeMap<Agg, i64>,
    intents: usize,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Tx {
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
pub(super) struct Model {
    locking: Locking,
    tx: Vec<Tx>,
    /// Waiting sessions, in request order.
    pub(super) queue: Vec<usize>,
    /// Committed business versions (a missing row is at 0).
    biz: BTreeMap<Agg, i64>,
    /// Committed intents.
    intents: BTreeMap<Agg, BTreeSet<i64>>,
}

impl Model {
    pub(super) fn new(locking: Locking, sessions: usize) -> Self {
        Self {
            locking,
            tx: vec![Tx::default(); sessions],
            queue: Vec::new(),
            biz: BTreeMap::new(),
            intents: BTreeMap::new(),
        }
    }

    pub(super) fn waiting(&self, s: usize) -> bool {
        self.tx[s].waits.is_some()
    }

    pub(super) fn holds_writer(&self) -> bool {
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
    pub(super) fn issue(&mut self, s: usize, op: Op) -> Result<Vec<(usize, Outcome)>, String> {
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

    pub(super) fn run(
        &mut self,
        s: usize,
        op: Op,
        done: &mut Vec<(usize, Outcome)>,
    ) -> Result<(), String> {
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
    pub(super) fn prefer(
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
pub(super) fn explore(locking: Locking, scripts: &[Vec<Op>]) -> Vec<Vec<usize>> {
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
pub(super) struct Issuer<'a> {
    planned: std::iter::Enumerate<std::slice::Iter<'a, (usize, Op)>>,
    deferred: Vec<VecDeque<(usize, Op)>>,
}

impl<'a> Issuer<'a> {
    pub(super) fn new(steps: &'a [(usize, Op)], sessions: usize) -> Self {
        Self {
            planned: steps.iter().enumerate(),
            deferred: vec![VecDeque::new(); sessions],
        }
    }

    /// The next step to issue on `model` (which must have seen every step handed out so far):
    /// `(index, session, op)`, or `None` when nothing is left to hand out.
    pub(super) fn next(&mut self, model: &Model) -> Option<(usize, usize, Op)> {
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
    pub(super) fn deferred(&self, s: usize) -> usize {
        self.deferred[s].len()
    }
}

/// The steps of a fixed schedule in the order they can be issued on `locking` (see [`Issuer`]).
pub(super) fn arrange(
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
