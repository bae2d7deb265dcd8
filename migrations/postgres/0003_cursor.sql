-- Cursor dispatch (docs/architecture.md, "Cursor dispatch").
-- The outbox's stored dispatch mode: 'row' (per-row claims) or 'cursor' (a durable cursor per
-- slot). Existing installs start in 'row' (their rows carry row-mode state); a relay started in
-- cursor mode converts the outbox once (PgStore::set_dispatch_mode).
CREATE TABLE IF NOT EXISTS ferry_dispatch (
    id         SMALLINT PRIMARY KEY CHECK (id = 1),
    mode       VARCHAR(16) NOT NULL CHECK (mode IN ('row', 'cursor')),
    changed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO ferry_dispatch (id, mode) VALUES (1, 'row') ON CONFLICT DO NOTHING;

-- The inserting top-level transaction id (xid8 as bigint). Added without a default first (no
-- table rewrite), then the default applies to new rows only; rows written before this migration
-- have NULL (switching to cursor dispatch gives the unfinished ones the lowest xid).
ALTER TABLE ferry_outbox ADD COLUMN IF NOT EXISTS xid BIGINT;
ALTER TABLE ferry_outbox ALTER COLUMN xid SET DEFAULT (pg_current_xact_id()::text::bigint);
-- Read windows walk this index between two snapshots' bounds.
CREATE INDEX IF NOT EXISTS ferry_outbox_cursor ON ferry_outbox (xid, seq);

-- Snapshot ticks, as PgQ's: window t holds the rows whose inserting transaction is visible in
-- tick t's snapshot and not in tick t-1's. Ticks are numbered without gaps (tick t is only
-- created once tick t-1 exists) by whichever reader first needs them; old ones are deleted
-- once every cursor is past them.
CREATE TABLE IF NOT EXISTS ferry_tick (
    tick_id    BIGINT PRIMARY KEY,
    snap       pg_snapshot NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The cursor of each slot lives in its lease row: position (cursor_tick, cursor_xid, cursor_seq)
-- (see ferry_core::CursorPos). cursor_version is the batch-level claim version; cursor_claim_id
-- the last advance's id (lost-commit recovery).
ALTER TABLE ferry_slot_lease ADD COLUMN IF NOT EXISTS cursor_tick BIGINT;
ALTER TABLE ferry_slot_lease ADD COLUMN IF NOT EXISTS cursor_xid BIGINT;
ALTER TABLE ferry_slot_lease ADD COLUMN IF NOT EXISTS cursor_seq BIGINT;
ALTER TABLE ferry_slot_lease ADD COLUMN IF NOT EXISTS cursor_version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE ferry_slot_lease ADD COLUMN IF NOT EXISTS cursor_claim_id VARCHAR(64);

-- Per-row delivery state in cursor mode, only for exceptions: items that were not acked and the
-- later events of their aggregates held behind them. The per-row protocol applies here.
CREATE TABLE IF NOT EXISTS ferry_outbox_exception (
    seq               BIGINT PRIMARY KEY,
    shard_slot        SMALLINT     NOT NULL,
    aggregate_id      VARCHAR(255) NOT NULL,
    aggregate_version BIGINT       NOT NULL,
    state             VARCHAR(16)  NOT NULL
                      CHECK (state IN ('PENDING', 'CLAIMED', 'SENT', 'QUARANTINED', 'SKIPPED')),
    available_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    claim_version     BIGINT       NOT NULL DEFAULT 0,
    claim_id          VARCHAR(64),
    lease_until       TIMESTAMPTZ,
    attempts          INTEGER      NOT NULL DEFAULT 0,
    last_error        TEXT,
    sent_at           TIMESTAMPTZ,
    resolved_by       VARCHAR(255),
    resolved_at       TIMESTAMPTZ,
    created_at        TIMESTAMPTZ  NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ferry_outbox_exception_open
    ON ferry_outbox_exception (aggregate_id, aggregate_version) WHERE state IN ('PENDING', 'CLAIMED', 'QUARANTINED');

-- Effective delivery state in cursor mode: an exception row's state, else a finished row-mode
-- state (rows written before a switch to cursor mode), else SENT behind the slot's cursor, else
-- PENDING. Read by status, record, reconcile and purge in cursor mode.
CREATE OR REPLACE VIEW ferry_outbox_cursor_view AS
SELECT o.seq, o.event_id, o.aggregate_id, o.aggregate_version, o.shard_slot, o.created_at, o.payload,
       coalesce(x.state, CASE WHEN o.state NOT IN ('PENDING', 'CLAIMED') THEN o.state
                              WHEN l.cursor_tick IS NOT NULL
                                   AND (pg_visible_in_snapshot(coalesce(o.xid, 0)::text::xid8, tp.snap)
                                        OR (pg_visible_in_snapshot(coalesce(o.xid, 0)::text::xid8, tc.snap)
                                            AND (coalesce(o.xid, 0), o.seq) <= (l.cursor_xid, l.cursor_seq)))
                              THEN 'SENT' ELSE 'PENDING' END) AS state,
       coalesce(x.claim_version, 0) AS claim_version, x.claim_id, coalesce(x.attempts, 0) AS attempts,
       x.last_error, x.sent_at, x.resolved_by, x.available_at, o.xid
FROM ferry_outbox o
JOIN ferry_slot_lease l ON l.slot = o.shard_slot
LEFT JOIN ferry_tick tp ON tp.tick_id = l.cursor_tick - 1
LEFT JOIN ferry_tick tc ON tc.tick_id = l.cursor_tick
LEFT JOIN ferry_outbox_exception x ON x.seq = o.seq;
