//! Every statement of the SQLite backend, named: one place to read its protocol.

/// Statement (mod.rs).
pub(crate) const PROBE_VERSION: &str =
    "SELECT 1 FROM ferry_outbox WHERE aggregate_id = ? AND aggregate_version = ?";

/// Statement (mod.rs).
pub(crate) const PROBE_EVENT_ID: &str = "SELECT 1 FROM ferry_outbox WHERE event_id = ?";

/// Acquire slots (mod.rs).
pub(crate) const ACQUIRE_SLOTS: &str = "UPDATE ferry_slot_lease SET \
                   epoch = CASE WHEN owner IS ?1 THEN epoch ELSE epoch + 1 END, owner = ?1, lease_until = ?3 + ?4 \
                 WHERE slot IN (SELECT value FROM json_each(?2)) AND (owner IS NULL OR owner = ?1 OR lease_until <= ?3) \
                 RETURNING slot, owner, epoch, lease_until";

/// Release slots (mod.rs).
pub(crate) const RELEASE_SLOTS: &str =
    "UPDATE ferry_slot_lease SET owner = NULL, lease_until = NULL WHERE owner = ?1 \
                 AND slot IN (SELECT value FROM json_each(?2))";

/// Member heartbeat (mod.rs).
pub(crate) const MEMBER_HEARTBEAT: &str = "INSERT INTO ferry_relay_member (owner, instance, lease_until, joined_at, sink_stalled_us) \
                 VALUES (?1, ?4, ?2 + ?3, ?2, ?5) \
                 ON CONFLICT (owner) DO UPDATE SET lease_until = excluded.lease_until, instance = excluded.instance, \
                   sink_stalled_us = excluded.sink_stalled_us \
                 WHERE ferry_relay_member.instance = excluded.instance OR ferry_relay_member.lease_until <= ?2";

/// Members (mod.rs).
pub(crate) const LIVE_MEMBERS: &str =
    "SELECT owner FROM ferry_relay_member WHERE lease_until > ? ORDER BY owner";

/// Members (mod.rs).
pub(crate) const MEMBERS_WITH_STALLS: &str =
    "SELECT owner, sink_stalled_us FROM ferry_relay_member WHERE lease_until > ? ORDER BY owner";

/// Leave (mod.rs).
pub(crate) const LEAVE_MEMBER: &str = "DELETE FROM ferry_relay_member WHERE owner = ?";

/// Slot leases (mod.rs).
pub(crate) const SLOT_LEASES: &str = "SELECT slot, owner, epoch, lease_until FROM ferry_slot_lease WHERE owner IS NOT NULL ORDER BY slot";

/// Dispatch mode (cursor.rs).
pub(crate) const DISPATCH_MODE: &str = "SELECT mode FROM ferry_dispatch WHERE id = 1";

/// Dispatch mode: members (cursor.rs).
pub(crate) const DISPATCH_MODE_MEMBERS: &str =
    "SELECT count(*) FROM ferry_relay_member WHERE owner <> ?1 AND lease_until > ?2";

/// Dispatch mode: set (cursor.rs).
pub(crate) const DISPATCH_MODE_SET: &str =
    "UPDATE ferry_dispatch SET mode = ?1, changed_at = ?2 WHERE id = 1";

/// Load cursors (cursor.rs).
pub(crate) const LOAD_CURSORS: &str = "SELECT slot, epoch, cursor_version, coalesce(cursor_xid, 0), cursor_seq FROM ferry_slot_lease \
                 WHERE owner = ?1 AND lease_until > ?2 AND cursor_seq IS NOT NULL \
                   AND slot IN (SELECT value FROM json_each(?3)) ORDER BY slot";

/// Cursor read: head (cursor.rs).
pub(crate) const CURSOR_READ_HEAD: &str =
    "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'ferry_outbox'), 0)";

/// Advance (cursor.rs).
pub(crate) const ADVANCE: &str = "UPDATE ferry_slot_lease SET cursor_xid = t.xid, cursor_seq = t.seq, \
                   cursor_version = cursor_version + 1, cursor_claim_id = ?2 \
                 FROM (SELECT value->>0 AS slot, value->>1 AS epoch, value->>2 AS version, value->>3 AS xid, \
                         value->>4 AS seq FROM json_each(?1)) AS t \
                 WHERE ferry_slot_lease.slot = t.slot AND ferry_slot_lease.owner = ?3 \
                   AND ferry_slot_lease.lease_until > ?4 AND ferry_slot_lease.epoch = t.epoch \
                   AND ferry_slot_lease.cursor_version = t.version AND ferry_slot_lease.cursor_seq IS NOT NULL \
                 RETURNING ferry_slot_lease.slot";

/// Advance: exceptions (cursor.rs).
pub(crate) const ADVANCE_EXCEPTIONS: &str = "INSERT INTO ferry_outbox_exception (seq, shard_slot, aggregate_id, aggregate_version, state, \
                       available_at, attempts, last_error, created_at) \
                     SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, value->>6, value->>7, ?2 \
                     FROM json_each(?1) WHERE true ON CONFLICT (seq) DO NOTHING";
