//! PostgreSQL's dispatch-mode switch: converting the outbox between row and cursor dispatch (and
//! re-basing the cursors of a restored database), in one transaction under a 10 s lock timeout.
use ferry_core::{DispatchMode, StoreError, StoreErrorKind};
use sqlx::PgConnection;

use super::sql::{self, DISPATCH_MODE_EXCEPTIONS, MATERIALIZE_STATES, RE_BASE_CURSORS_EXCEPTIONS};
use super::windows::xid_regression;
use super::PgStore;
use crate::error::{db_err, mode_in_use};
use crate::protocol::switch::Switch;

impl Switch for PgStore {
    async fn before_switch(&self, mode: DispatchMode) -> Result<(), StoreError> {
        if mode == DispatchMode::Cursor {
            self.check_seq_cache().await?;
        }
        Ok(())
    }

    async fn begin_switch(tx: &mut PgConnection) -> Result<(), StoreError> {
        // A conversion takes ferry_outbox's table lock, which waits for every open
        // transaction that wrote to it: give up with a clear error rather than stall
        // producers behind it.
        run(
            tx,
            sql::DISPATCH_MODE_LOCK_TIMEOUT,
            "dispatch mode: lock timeout",
        )
        .await
    }

    async fn must_rebase(tx: &mut PgConnection, mode: DispatchMode) -> Result<bool, StoreError> {
        // Already in cursor mode, but on a server whose transaction ids are behind the
        // stored ticks (see `span`): re-base the cursors (docs/architecture.md, "After a
        // restore").
        Ok(mode == DispatchMode::Cursor && xid_regression(tx).await?.is_some())
    }

    fn switch_refused(current: &str, others: i64, mode: DispatchMode, rebase: bool) -> StoreError {
        if !rebase {
            return mode_in_use(current, others, mode);
        }
        StoreError::new(
            StoreErrorKind::InvalidInput,
            format!(
                "this server's transaction ids are behind the outbox's snapshot ticks (restored \
                 from a logical dump, or moved to another server?) and the cursors must be \
                 re-based, but {others} other relay(s) of this database are live: stop them first"
            ),
        )
    }

    async fn convert(
        tx: &mut PgConnection,
        mode: DispatchMode,
        rebase: bool,
    ) -> Result<(), StoreError> {
        match mode {
            DispatchMode::Cursor if rebase => {
                run(tx, sql::LOCK_OUTBOX, "re-base cursors: lock the outbox (waits at most 10 s for transactions that wrote to it)").await?;
                // Rows at or below `old` were written on the server the ticks come from
                // (a row whose xid this server has not reached yet is one of them, and every
                // row written here has a higher seq than every restored row): their states
                // follow from the old ticks and cursors. Rows above it may have been
                // written here, so they count as not yet dispatched (sent again if they
                // were: duplicates, never a loss). Exception rows keep their states.
                let old: i64 = sqlx::query_scalar(sql::RE_BASE_CURSORS_RESTORED_ROWS)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| db_err("re-base cursors: restored rows", e))?;
                let n = sqlx::query(MATERIALIZE_STATES)
                    .bind(old)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("re-base cursors: states", e))?
                    .rows_affected();
                run(
                    tx,
                    RE_BASE_CURSORS_EXCEPTIONS,
                    "re-base cursors: exceptions",
                )
                .await?;
                // every unfinished row goes to the first window, in seq order
                run(tx, sql::RE_BASE_CURSORS_XIDS, "re-base cursors: xids").await?;
                tracing::warn!(
                    restored_up_to_seq = old,
                    states_written = n,
                    "this server's transaction ids are behind the outbox's snapshot ticks: re-based the cursors; \
                     intents above the restored seq are sent again if they had been sent"
                );
                start_cursors(tx).await?;
            }
            DispatchMode::Cursor => {
                // First, so that the ACCESS EXCLUSIVE lock on ferry_outbox is the first lock
                // this transaction takes on it (no lock upgrade): in-flight inserts finish,
                // new ones wait for the commit.
                // Cursor dispatch never updates an outbox row: no room is kept on new heap
                // pages for HOT updates (migration 0009).
                for s in sql::TO_CURSOR_DDL {
                    run(tx, s, "dispatch mode: drop row-mode indexes (waits at most 10 s for transactions that wrote to ferry_outbox)").await?;
                }
                // Rows written before migration 0003 have no xid: give unfinished ones a
                // low one (3, the first normal xid), so the first window reads them.
                run(
                    tx,
                    sql::DISPATCH_MODE_XIDS_OF_OLD_ROWS,
                    "dispatch mode: xids of old rows",
                )
                .await?;
                start_cursors(tx).await?;
            }
            DispatchMode::Row => {
                // Rows behind their slot's cursor take the state the cursor gave them.
                sqlx::query(MATERIALIZE_STATES)
                    .bind(i64::MAX)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("dispatch mode: row states", e))?;
                for (s, what) in sql::TO_ROW {
                    run(tx, s, what).await?;
                }
            }
        }
        Ok(())
    }
}

/// The cursor side of a switch to cursor dispatch (and of a re-base), inside the switch's
/// transaction once every unfinished row has an xid: tick 0, quarantined rows as exception
/// rows, every slot at the start of window 1.
async fn start_cursors(tx: &mut PgConnection) -> Result<(), StoreError> {
    // Tick 0 sees exactly the transactions below the first unfinished row's xid (and below
    // every open transaction): everything it sees is finished.
    let x: i64 = sqlx::query_scalar(sql::DISPATCH_MODE_FIRST_WINDOW)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| db_err("dispatch mode: first window", e))?;
    run(tx, sql::DISPATCH_MODE_TICKS, "dispatch mode: ticks").await?;
    sqlx::query(sql::DISPATCH_MODE_TICK_0)
        .bind(format!("{x}:{x}:"))
        .execute(&mut *tx)
        .await
        .map_err(|e| db_err("dispatch mode: tick 0", e))?;
    // Quarantined rows stay parked as exception rows (they hold their successors).
    run(tx, DISPATCH_MODE_EXCEPTIONS, "dispatch mode: exceptions").await?;
    // Every slot starts at window 1; its read passes over rows already finished (their state
    // is not PENDING or CLAIMED).
    run(tx, sql::DISPATCH_MODE_CURSORS, "dispatch mode: cursors").await?;
    Ok(())
}

impl PgStore {
    /// Refuses cursor dispatch when the outbox's identity sequence hands out cached values.
    /// Windows are read in seq order, which is an aggregate's version order only if a seq drawn
    /// later is higher: with `CACHE n > 1` each session draws from its own block of `n`, so a
    /// producer could insert `v(n+1)` with a lower seq than `v(n)`'s.
    async fn check_seq_cache(&self) -> Result<(), StoreError> {
        let (name, cache): (String, i64) = sqlx::query_as(sql::CURSOR_DISPATCH_OUTBOX_SEQUENCE)
            .fetch_one(self.pool())
            .await
            .map_err(|e| db_err("cursor dispatch: outbox sequence", e))?;
        if cache > 1 {
            return Err(StoreError::new(
                StoreErrorKind::InvalidInput,
                format!(
                    "the outbox's sequence {name} caches {cache} values per session, so a later \
                     insert can draw a lower seq and cursor dispatch would send an aggregate's \
                     versions out of order: run ALTER SEQUENCE {name} CACHE 1 (or use --dispatch row)"
                ),
            ));
        }
        Ok(())
    }
}

/// Runs `sql` (no parameters) in the switch's transaction; its errors in the context `what`.
async fn run(tx: &mut PgConnection, sql: &str, what: &str) -> Result<(), StoreError> {
    sqlx::query(sql)
        .execute(tx)
        .await
        .map_err(|e| db_err(what, e))?;
    Ok(())
}
