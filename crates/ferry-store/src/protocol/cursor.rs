//! Cursor dispatch's steps ([`ferry_core::CursorStore`]) over the backend's statements
//! ([`Cursor`]).
use std::collections::HashSet;
use std::future::Future;

use ferry_core::{
    AdvanceResult, CasReport, ClaimRequest, ClaimedEvent, CursorAdvance, ExceptionOutcomes, SlotId,
    StoreError,
};

use crate::error::Ctx;
use crate::protocol::Ops;
use crate::request::{claiming, slotless_advance};

/// Cursor dispatch's statements ([`ferry_core::CursorStore`]).
pub(crate) trait Cursor: Ops {
    /// The cursors of `slots` whose live lease `owner` holds.
    fn load_cursors(
        &self,
        owner: &str,
        slots: &[SlotId],
    ) -> impl Future<Output = Result<Vec<ferry_core::SlotCursor>, StoreError>> + Send;
    /// [`ferry_core::CursorStore::read_batch`].
    fn read_batch(
        &self,
        req: &ferry_core::CursorRead,
    ) -> impl Future<Output = Result<ferry_core::CursorBatch, StoreError>> + Send;
    /// Moves the cursors of `req`'s slots, fenced; returns how many distinct slots moved.
    fn advance_cursors(
        c: &mut Self::Conn,
        req: &CursorAdvance,
    ) -> impl Future<Output = Result<usize, sqlx::Error>> + Send;
    /// Inserts an advance's exception rows (not empty); a row already there stays.
    fn insert_exceptions(
        c: &mut Self::Conn,
        req: &CursorAdvance,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Whether an advance with `claim_id` was applied.
    fn lookup_advance(
        &self,
        claim_id: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// A claim of exception rows that names slots and rows.
    fn claim_exceptions(
        &self,
        req: &ClaimRequest,
    ) -> impl Future<Output = Result<Vec<ClaimedEvent>, StoreError>> + Send;
    /// Applies the four outcome categories of a settle (in [`Outcome::settling`]'s order).
    fn settle_exceptions(
        &self,
        out: &ExceptionOutcomes,
    ) -> impl Future<Output = Result<CasReport, StoreError>> + Send;
    /// [`ferry_core::CursorStore::horizon`]; nothing to report by default.
    fn horizon(&self) -> impl Future<Output = Result<ferry_core::HorizonInfo, StoreError>> + Send {
        async { Ok(ferry_core::HorizonInfo::default()) }
    }
}

/// [`ferry_core::CursorStore::advance`]: the fenced cursor moves and the exception rows in one
/// transaction; a fenced slot rolls it all back.
pub(crate) async fn advance<S: Cursor>(
    s: &S,
    req: &CursorAdvance,
) -> Result<AdvanceResult, StoreError> {
    if let Some(done) = slotless_advance(req) {
        return done;
    }
    let distinct: HashSet<SlotId> = req.slots.iter().map(|sl| sl.slot).collect();
    let mut tx = s.begin().await.ctx("advance: begin")?;
    let moved = S::advance_cursors(&mut tx, req).await.ctx("advance")?;
    if moved != distinct.len() {
        // dropping the transaction rolls it back: nothing of this advance is written
        return Ok(AdvanceResult::Fenced);
    }
    if !req.exceptions.is_empty() {
        S::insert_exceptions(&mut tx, req)
            .await
            .ctx("advance: exceptions")?;
    }
    S::commit(tx).await.ctx("advance: commit")?;
    Ok(AdvanceResult::Applied)
}

/// [`ferry_core::CursorStore::claim_exceptions`].
pub(crate) async fn claim_exceptions<S: Cursor>(
    s: &S,
    req: &ClaimRequest,
) -> Result<Vec<ClaimedEvent>, StoreError> {
    claiming(req, s.claim_exceptions(req)).await
}
