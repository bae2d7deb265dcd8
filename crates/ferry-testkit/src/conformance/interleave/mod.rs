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
//!
//! *The files.* `op` the steps a session can take; `model` the lock model, the
//! explorer and the order a fixed schedule is issued in; `plan` the schedules of the cases;
//! `session` a producer's connection on its own task; `server` the harness's own connection
//! and the wait monitor; `harness` runs one schedule step by step against the model; `reader`
//! the relay that reads or claims; `check` the delivery checks; `case` one case, end to end.
use ferry_core::DispatchMode;

use super::case::suite;
use crate::db::TestDb;
use case::run_case;
use plan::{
    cross_xid, explore_three, explore_two, lock_for_update, optimistic, savepoint_lock,
    savepoint_lock_after_write, savepoint_rolled_back, three_queued, two_versions,
};

mod case;
mod check;
mod harness;
mod model;
mod op;
mod plan;
mod reader;
mod server;
mod session;
#[cfg(test)]
mod tests;

pub use reader::READ_LIMIT;

/// Declares the case functions (one per plan and dispatch mode) and the suite (see
/// `case::suite!`).
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

        suite! {
            /// Every case, in the order
            /// [`interleave_conformance!`](crate::interleave_conformance) instantiates them.
            cases: TestDb;
            /// Instantiates every interleaving case as a test per SQL backend (modules
            /// `sqlite`, `postgres`, `mysql`; names `interleave_<schedule>_<cursor|row>`). Needs
            /// `tokio` (with `macros`) as a dev-dependency.
            macro: interleave_conformance, module: interleave,
                check: every_interleave_case_is_instantiated;
            everywhere: [],
            sql_only: [$($cursor, $row),*],
        }
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
