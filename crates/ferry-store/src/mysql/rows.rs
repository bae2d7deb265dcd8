//! Decoding MariaDB rows: its `utf8mb4_bin` text columns arrive as bytes.
use ferry_core::{ClaimToken, ClaimedEvent, Payload, SlotId, SlotLease};
use sqlx::Row;

pub(crate) fn claimed_from_row(r: &sqlx::mysql::MySqlRow) -> ClaimedEvent {
    ClaimedEvent {
        token: ClaimToken {
            seq: r.get(0),
            event_id: txt(r, 1),
            claim_id: otxt(r, 2).unwrap_or_default(),
            claim_version: r.get(3),
        },
        aggregate_id: txt(r, 4),
        aggregate_version: r.get(5),
        shard_slot: r.get::<i16, _>(6) as SlotId,
        topic: txt(r, 7),
        key: txt(r, 8),
        event_type: txt(r, 9),
        headers: txt(r, 10),
        payload: payload(r, 11),
        attempts: r.get(13),
        created_at: r.get(14),
    }
}

/// Reads `payload, payload_bytes` starting at column `i`: text (utf8mb4_bin, sent as bytes, so
/// taken without a UTF-8 check) or bytes.
pub(crate) fn payload(r: &sqlx::mysql::MySqlRow, i: usize) -> Payload {
    match otxt(r, i) {
        Some(text) => Payload::Text(text),
        None => Payload::Bytes(r.get::<Option<Vec<u8>>, _>(i + 1).unwrap_or_default()),
    }
}

/// A `ferry_slot_lease` row read as `slot, owner, epoch, lease_until` (µs).
pub(crate) fn lease_from_row(r: &sqlx::mysql::MySqlRow) -> SlotLease {
    SlotLease {
        slot: r.get::<i16, _>(0) as SlotId,
        owner: txt(r, 1),
        epoch: r.get(2),
        lease_until: r.get(3),
    }
}

/// Reads a text column. The schema uses `utf8mb4_bin` (byte-exact keys), which the server
/// reports with the BINARY flag, so sqlx decodes it as bytes; the bytes are UTF-8 we wrote.
pub(crate) fn txt(r: &sqlx::mysql::MySqlRow, i: usize) -> String {
    otxt(r, i).unwrap_or_default()
}

pub(crate) fn otxt(r: &sqlx::mysql::MySqlRow, i: usize) -> Option<String> {
    r.get::<Option<Vec<u8>>, _>(i).map(|b| {
        String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    })
}
