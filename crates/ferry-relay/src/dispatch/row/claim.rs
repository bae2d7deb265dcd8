//! The claim step: a fenced claim of due rows, and its recovery when the commit's answer was
//! lost.
use ferry_core::{ClaimRequest, ClaimedEvent, OutboxStore, StoreError};

/// Claims; if the claim's commit outcome is unknown (connection lost around COMMIT), looks the
/// claim up by its pre-generated id and keeps only what is still ours.
pub(super) async fn claim_or_recover(
    store: &dyn OutboxStore,
    req: &ClaimRequest,
) -> Result<Vec<ClaimedEvent>, StoreError> {
    match store.claim(req).await {
        Ok(c) => Ok(c),
        Err(e) if e.kind() == ferry_core::StoreErrorKind::Unavailable => {
            // The commit may have happened. Our claim id is unique: whatever is CLAIMED under
            // it is ours to send; if the lookup fails too, the lease expires and others resend.
            match store.lookup_claim(&req.claim_id).await {
                Ok(items) if !items.is_empty() => {
                    tracing::info!(claim_id = %req.claim_id, items = items.len(), "recovered a claim whose commit response was lost");
                    Ok(items)
                }
                _ => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}
