-- Cursor dispatch (docs/architecture.md, "Cursor dispatch").
-- The outbox's stored dispatch mode: 'row' (per-row claims) or 'cursor' (a durable cursor per
-- slot). Existing installs start in 'row' (their rows carry row-mode state); a relay started in
-- cursor mode converts the outbox once (ferry_store::sqlite::SqliteStore::set_dispatch_mode).
CREATE TABLE IF NOT EXISTS ferry_dispatch (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    mode       TEXT    NOT NULL CHECK (mode IN ('row', 'cursor')),
    changed_at INTEGER NOT NULL
);
INSERT OR IGNORE INTO ferry_dispatch (id, mode, changed_at) VALUES (1, 'row', 0);

-- The cursor of each slot lives in its lease row: every intent of the slot with seq <= cursor_seq
-- is dispatched. cursor_xid is always 0 here (one writer at a time: AUTOINCREMENT order is commit
-- order). cursor_version is the batch-level claim version; cursor_claim_id the last advance's id.
ALTER TABLE ferry_slot_lease ADD COLUMN cursor_xid INTEGER;
ALTER TABLE ferry_slot_lease ADD COLUMN cursor_seq INTEGER;
ALTER TABLE ferry_slot_lease ADD COLUMN cursor_version INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ferry_slot_lease ADD COLUMN cursor_claim_id TEXT;

-- Per-row delivery state in cursor mode, only for exceptions: items that were not acked and the
-- later events of their aggregates held behind them. The per-row protocol applies here.
CREATE TABLE IF NOT EXISTS ferry_outbox_exception (
    seq               INTEGER PRIMARY KEY,
    shard_slot        INTEGER NOT NULL,
    aggregate_id      TEXT    NOT NULL,
    aggregate_version INTEGER NOT NULL,
    state             TEXT    NOT NULL
                      CHECK (state IN ('PENDING', 'CLAIMED', 'SENT', 'QUARANTINED', 'SKIPPED')),
    available_at      INTEGER NOT NULL,
    claim_version     INTEGER NOT NULL DEFAULT 0,
    claim_id          TEXT,
    lease_until       INTEGER,
    attempts          INTEGER NOT NULL DEFAULT 0,
    last_error        TEXT,
    sent_at           INTEGER,
    resolved_by       TEXT,
    resolved_at       INTEGER,
    created_at        INTEGER NOT NULL
);
-- "Does this aggregate have an open exception?" (the cursor read's hold check, the predecessor rule).
CREATE INDEX IF NOT EXISTS ferry_outbox_exception_open
    ON ferry_outbox_exception (aggregate_id, aggregate_version) WHERE state IN ('PENDING', 'CLAIMED', 'QUARANTINED');

-- Effective delivery state in cursor mode: an exception row's state, else a finished row-mode
-- state (rows written before a switch to cursor mode), else SENT behind the slot's cursor, else
-- PENDING. Read by status, record, reconcile and purge in cursor mode.
CREATE VIEW IF NOT EXISTS ferry_outbox_cursor_view AS
SELECT o.seq, o.event_id, o.aggregate_id, o.aggregate_version, o.shard_slot, o.created_at, o.payload,
       coalesce(x.state, CASE WHEN o.state NOT IN ('PENDING', 'CLAIMED') THEN o.state
                              WHEN l.cursor_seq IS NOT NULL AND o.seq <= l.cursor_seq
                              THEN 'SENT' ELSE 'PENDING' END) AS state,
       coalesce(x.claim_version, 0) AS claim_version, x.claim_id, coalesce(x.attempts, 0) AS attempts,
       x.last_error, x.sent_at, x.resolved_by, x.available_at
FROM ferry_outbox o
JOIN ferry_slot_lease l ON l.slot = o.shard_slot
LEFT JOIN ferry_outbox_exception x ON x.seq = o.seq;
