//! Answers to requests that need no statement: a claim of no slot or no row, an advance of no
//! slot. Every backend gives them before it touches the database.
use std::future::Future;

use ferry_core::{StoreError, StoreErrorKind};

/// Runs `claim` (not yet polled) unless `req` asks for no slot or no row: such a claim (of
/// rows or of exception rows) takes nothing and touches no table.
pub(crate) async fn claiming(
    req: &ferry_core::ClaimRequest,
    claim: impl Future<Output = Result<Vec<ferry_core::ClaimedEvent>, StoreError>>,
) -> Result<Vec<ferry_core::ClaimedEvent>, StoreError> {
    if req.slots.is_empty() || req.limit == 0 {
        return Ok(Vec::new());
    }
    claim.await
}

/// The answer to an advance of no slot, which every backend gives before it touches the
/// database: nothing to do, unless it would write exceptions, which only a fenced slot advance
/// may. `None` when the advance names slots.
pub(crate) fn slotless_advance(
    req: &ferry_core::CursorAdvance,
) -> Option<Result<ferry_core::AdvanceResult, StoreError>> {
    if !req.slots.is_empty() {
        return None;
    }
    // exceptions are only written under a fenced slot advance
    Some(if req.exceptions.is_empty() {
        Ok(ferry_core::AdvanceResult::Applied)
    } else {
        Err(StoreError::new(
            StoreErrorKind::InvalidInput,
            "an advance that writes exceptions must advance (and so fence) at least one slot",
        ))
    })
}
