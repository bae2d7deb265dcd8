//! The slots the cases claim and read.

/// Every slot.
pub(super) fn all_slots() -> Vec<ferry_core::SlotId> {
    (0..ferry_core::SLOT_COUNT).collect()
}
