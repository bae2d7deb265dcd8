//! What a case runs: a fixed schedule or a set of transactions to explore, and the schedules
//! of the cases.
use super::model::{arrange, explore, Locking};
use super::op::{Op, A, B, C};

/// What a case runs.
pub(super) enum Plan {
    /// One schedule, in this order (steps of a waiting session are deferred until it runs).
    Fixed(Vec<(usize, Op)>),
    /// Every interleaving of these transactions the database can produce, one after the other
    /// on one database (each on rows of its own), a relay reading between the steps of every
    /// other one.
    Explore(Vec<Vec<Op>>),
}

impl Plan {
    pub(super) fn sessions(&self) -> usize {
        match self {
            Plan::Fixed(steps) => steps.iter().map(|(s, _)| s + 1).max().unwrap_or(0),
            Plan::Explore(scripts) => scripts.len(),
        }
    }

    /// The runs of this plan on `locking`: a fixed schedule once (refused if it cannot finish
    /// there), or every interleaving the explorer finds.
    pub(super) fn runs(&self, locking: Locking) -> Result<Vec<Run>, String> {
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
pub(super) struct Run {
    pub(super) prefix: String,
    pub(super) steps: Vec<(usize, Op)>,
    /// A relay reads after every step.
    pub(super) read_between: bool,
}

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
pub(super) fn cross_xid() -> Plan {
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
pub(super) fn three_queued() -> Plan {
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
pub(super) fn two_versions() -> Plan {
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
pub(super) fn savepoint_rolled_back() -> Plan {
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
pub(super) fn savepoint_lock() -> Plan {
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
pub(super) fn savepoint_lock_after_write() -> Plan {
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
pub(super) fn lock_for_update() -> Plan {
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
pub(super) fn optimistic() -> Plan {
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
pub(super) fn explore_two() -> Plan {
    Plan::Explore(vec![
        script![Bump Y, Bump X, Insert X, Commit],
        script![Bump X, Insert X, Commit],
    ])
}

/// Three transactions, every interleaving: as [`explore_two`], plus C, which writes X and rolls
/// back (its version is taken by the next writer).
pub(super) fn explore_three() -> Plan {
    Plan::Explore(vec![
        script![Bump Y, Bump X, Insert X, Commit],
        script![Bump X, Insert X, Commit],
        script![Bump X, Insert X, Rollback],
    ])
}
