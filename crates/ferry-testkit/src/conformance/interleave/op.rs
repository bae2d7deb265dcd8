//! The steps a producer session takes, and the sessions' names (`A`, `B`, `C`).

/// A logical business row / aggregate (`X`, `Y`, `Z`), prefixed per run.
pub(super) type Agg = &'static str;

/// One step of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
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
    pub(super) fn agg(self) -> Option<Agg> {
        match self {
            Op::Bump(a)
            | Op::LockRead(a)
            | Op::WriteNext(a)
            | Op::Insert(a)
            | Op::Optimistic(a) => Some(a),
            _ => None,
        }
    }

    pub(super) fn describe(self) -> String {
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

pub(super) fn letter(s: usize) -> char {
    (b'A' + s as u8) as char
}

pub(super) const A: usize = 0;
pub(super) const B: usize = 1;
pub(super) const C: usize = 2;
