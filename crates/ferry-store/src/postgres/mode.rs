//! PostgreSQL's dispatch-mode switch: converting the outbox between row and cursor dispatch (and
//! re-basing the cursors of a restored database), in one transaction under a 10 s lock timeout.
use ferry_core::{DispatchMode, StoreError, StoreErrorKind};

use super::sql::{self, MATERIALIZE_STATES};
use super::windows::xid_regression;
use super::PgStore;
use crate::error::{db_err, mode_in_use, Ctx};

impl PgStore {
    /// [`CursorStore::set_dispatch_mode`]: converts the outbox to `mode` in one transaction,
    /// or re-bases the cursors of a restored database; refused while other relays are live.
    pub(super) async fn switch_mode(
        &self,
        mode: DispatchMode,
        owner: &str,
    ) -> Result<bool, StoreError> {
        if mode == DispatchMode::Cursor {
            self.check_seq_cache().await?;
        }
        let mut tx = self.pool().begin().await.ctx("dispatch mode: begin")?;
        // A conversion takes ferry_outbox's table lock, which waits for every open
        // transaction that wrote to it: give up with a clear error rather than stall
        // producers behind it.
        exec_lock_timeout(&mut tx).await?;
        // Serialises conversions: a second one waits here, then finds the mode set.
        let current: String = sqlx::query_scalar(sql::DISPATCH_MODE_FOR_UPDATE)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| db_err("dispatch mode", e))?;
        // Already in cursor mode, but on a server whose transaction ids are behind the
        // stored ticks (see `span`): re-base the cursors (docs/architecture.md, "After a
        // restore").
        let rebase = current == mode.as_str()
            && mode == DispatchMode::Cursor
            && xid_regression(&mut tx).await?.is_some();
        if current == mode.as_str() && !rebase {
            return Ok(false);
        }
        let others: i64 = sqlx::query_scalar(sql::DISPATCH_MODE_MEMBERS)
            .bind(owner)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| db_err("dispatch mode: members", e))?;
        if others > 0 && rebase {
            return Err(StoreError::new(
                StoreErrorKind::InvalidInput,
                format!(
                    "this server's transaction ids are behind the outbox's snapshot ticks (restored \
                     from a logical dump, or moved to another server?) and the cursors must be \
                     re-based, but {others} other relay(s) of this database are live: stop them first"
                ),
            ));
        }
        if others > 0 {
            return Err(mode_in_use(&current, others, mode));
        }
        let exec = |sql: &'static str| sqlx::query(sql);
        match mode {
            DispatchMode::Cursor if rebase => {
                exec(sql::LOCK_OUTBOX)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("re-base cursors: lock the outbox (waits at most 10 s for transactions that wrote to it)", e))?;
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
                exec(sql::RE_BASE_CURSORS_EXCEPTIONS)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("re-base cursors: exceptions", e))?;
                // every unfinished row goes to the first window, in seq order
                exec(sql::RE_BASE_CURSORS_XIDS)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("re-base cursors: xids", e))?;
                tracing::warn!(
                    restored_up_to_seq = old,
                    states_written = n,
                    "this server's transaction ids are behind the outbox's snapshot ticks: re-based the cursors; \
                     intents above the restored seq are sent again if they had been sent"
                );
                start_cursors(&mut tx).await?;
            }
            DispatchMode::Cursor => {
                // First, so that the ACCESS EXCLUSIVE lock on ferry_outbox is the first lock
                // this transaction takes on it (no lock upgrade): in-flight inserts finish,
                // new ones wait for the commit.
                // Cursor dispatch never updates an outbox row: no room is kept on new heap
                // pages for HOT updates (migration 0009).
                for s in sql::TO_CURSOR_DDL {
                    exec(s)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_err("dispatch mode: drop row-mode indexes (waits at most 10 s for transactions that wrote to ferry_outbox)", e))?;
                }
                // Rows written before migration 0003 have no xid: give unfinished ones a
                // low one (3, the first normal xid), so the first window reads them.
                exec(sql::DISPATCH_MODE_XIDS_OF_OLD_ROWS)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("dispatch mode: xids of old rows", e))?;
                start_cursors(&mut tx).await?;
            }
            DispatchMode::Row => {
                // Rows behind their slot's cursor take the state the cursor gave them.
                sqlx::query(MATERIALIZE_STATES)
                    .bind(i64::MAX)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("dispatch mode: row states", e))?;
                for (s, what) in sql::TO_ROW {
                    exec(s)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_err(what, e))?;
                }
            }
        }
        sqlx::query(sql::DISPATCH_MODE_SET)
            .bind(mode.as_str())
            .execute(&mut *tx)
            .await
            .map_err(|e| db_err("dispatch mode: set", e))?;
        tx.commit().await.ctx("dispatch mode: commit")?;
        Ok(true)
    }
}

/// The cursor side of a switch to cursor dispatch (and of a re-base), inside the switch's
/// transaction once every unfinished row has an xid: tick 0, quarantined rows as exception
/// rows, every slot at the start of window 1.
async fn start_cursors(tx: &mut sqlx::PgConnection) -> Result<(), StoreError> {
    let exec = |sql: &'static str| sqlx::query(sql);
    // Tick 0 sees exactly the transactions below the first unfinished row's xid (and below
    // every open transaction): everything it sees is finished.
    let x: i64 = sqlx::query_scalar(sql::DISPATCH_MODE_FIRST_WINDOW)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| db_err("dispatch mode: first window", e))?;
    exec(sql::DISPATCH_MODE_TICKS)
        .execute(&mut *tx)
        .await
        .map_err(|e| db_err("dispatch mode: ticks", e))?;
    sqlx::query(sql::DISPATCH_MODE_TICK_0)
        .bind(format!("{x}:{x}:"))
        .execute(&mut *tx)
        .await
        .map_err(|e| db_err("dispatch mode: tick 0", e))?;
    // Quarantined rows stay parked as exception rows (they hold their successors).
    exec(sql::DISPATCH_MODE_EXCEPTIONS)
        .execute(&mut *tx)
        .await
        .map_err(|e| db_err("dispatch mode: exceptions", e))?;
    // Every slot starts at window 1; its read passes over rows already finished (their state
    // is not PENDING or CLAIMED).
    exec(sql::DISPATCH_MODE_CURSORS)
        .execute(&mut *tx)
        .await
        .map_err(|e| db_err("dispatch mode: cursors", e))?;
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

async fn exec_lock_timeout(tx: &mut sqlx::PgConnection) -> Result<(), StoreError> {
    sqlx::query(sql::DISPATCH_MODE_LOCK_TIMEOUT)
        .execute(tx)
        .await
        .map_err(|e| db_err("dispatch mode: lock timeout", e))?;
    Ok(())
}
