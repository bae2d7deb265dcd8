//! Claims, fencing tokens and compare-and-set results.
use std::time::Duration;

use crate::shard::SlotId;
use crate::time::Micros;

/// The fencing token of one claimed item: `claim_id` is unique per claim (generated before the
/// claim transaction), `claim_version` numbers the claim terms of the row. Every transition after
/// the claim must match both, plus `state = 'CLAIMED'`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimToken {
    /// Insertion sequence of the row (primary key; used to address it cheaply).
    pub seq: i64,
    /// The event id: the same on every claim and resend of this intent.
    pub event_id: String,
    /// The claim this item was taken by.
    pub claim_id: String,
    /// The row's `claim_version` as set by that claim.
    pub claim_version: i64,
}

/// Ownership of a slot set by a relay process: claims only take rows whose slot is currently
/// leased to `owner`, so a process that lost its slots (partition, GC pause) claims nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotFence {
    /// Owner id of the relay process (unique per process start).
    pub owner: String,
}

/// What to claim.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// Pre-generated unique claim id (see [`crate::new_event_id`] for a generator).
    pub claim_id: String,
    /// Slots to claim from. Empty means nothing.
    pub slots: Vec<SlotId>,
    /// Maximum items; a claim returns fewer when fewer are due and predecessor-free.
    pub limit: usize,
    /// Lease length: after it, another relay may take the items over.
    pub lease: Duration,
    /// When set, only slots leased to this owner are claimed.
    pub fence: Option<SlotFence>,
}

impl ClaimRequest {
    /// A request with a fresh claim id, no slot fence.
    pub fn new(slots: Vec<SlotId>, limit: usize, lease: Duration) -> Self {
        Self {
            claim_id: crate::event::new_event_id(),
            slots,
            limit,
            lease,
            fence: None,
        }
    }
}

/// One claimed item, read inside the claim transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedEvent {
    /// The fencing token every later transition of this item must present.
    pub token: ClaimToken,
    /// Aggregate identity: the ordering scope.
    pub aggregate_id: String,
    /// Aggregate version (from 1).
    pub aggregate_version: i64,
    /// Shard slot, as stored at enqueue.
    pub shard_slot: SlotId,
    /// Destination topic.
    pub topic: String,
    /// Message key (the partitioning key; defaults to the aggregate id).
    pub key: String,
    /// Event type, sent as the `ferry-event-type` header.
    pub event_type: String,
    /// Stored headers (JSON object of strings).
    pub headers: String,
    /// The immutable payload: text or bytes, sent unchanged.
    pub payload: crate::payload::Payload,
    /// Failed attempts so far.
    pub attempts: i32,
    /// When the intent was committed (row creation), µs since the epoch.
    pub created_at: Micros,
}

/// Result of a compare-and-set on one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CasResult {
    /// The row matched the token and moved.
    Applied,
    /// The token is stale (another claim took over, or the row left `CLAIMED`): zero rows.
    Fenced,
}

/// Per-item results of a batched compare-and-set, in input order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CasReport {
    /// `(seq, result)` per input item.
    pub items: Vec<(i64, CasResult)>,
}

impl CasReport {
    /// Number of applied items.
    pub fn applied(&self) -> usize {
        self.items
            .iter()
            .filter(|(_, r)| *r == CasResult::Applied)
            .count()
    }
    /// Number of fenced items.
    pub fn fenced(&self) -> usize {
        self.items.len() - self.applied()
    }
    /// [`CasReport::from_applied`] over the `(seq, claim_version, claim_id)` rows a CAS
    /// statement returned (`RETURNING`) for the rows it changed.
    pub fn from_returned(inputs: &[ClaimToken], rows: Vec<(i64, i64, String)>) -> Self {
        let applied = rows
            .into_iter()
            .map(|(seq, cv, cid)| (seq, (cv, cid)))
            .collect();
        Self::from_applied(inputs, &applied)
    }
    /// Builds a report from the inputs and the rows the database changed, each as
    /// `seq → (claim_version, claim_id)` of the token that matched it. An input is applied only
    /// if its whole token matched: a stale token next to the live one for the same row in one
    /// batch stays fenced. (A token given twice is applied twice, as the memory store does.)
    pub fn from_applied(
        inputs: &[ClaimToken],
        applied: &std::collections::HashMap<i64, (i64, String)>,
    ) -> Self {
        Self {
            items: inputs
                .iter()
                .map(|t| {
                    let r = match applied.get(&t.seq) {
                        Some((cv, cid)) if *cv == t.claim_version && *cid == t.claim_id => {
                            CasResult::Applied
                        }
                        _ => CasResult::Fenced,
                    };
                    (t.seq, r)
                })
                .collect(),
        }
    }
    /// A report with every input applied (a backend that changed every row it was given).
    pub fn all_applied(inputs: &[ClaimToken]) -> Self {
        Self {
            items: inputs.iter().map(|t| (t.seq, CasResult::Applied)).collect(),
        }
    }
}

/// A retry outcome for one claimed item.
#[derive(Debug, Clone)]
pub struct RetryItem {
    /// The item's token.
    pub token: ClaimToken,
    /// How long until it is due again.
    pub delay: Duration,
    /// The error, stored in `last_error`.
    pub error: String,
}
