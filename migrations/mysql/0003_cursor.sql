-- Cursor dispatch on MariaDB (docs/schema.md §5.3, "MariaDB: the commit gate"). Existing installs start in 'row' mode; a relay started in cursor mode converts
-- the outbox once (ferry_store::mysql::MyStore, CursorStore::set_dispatch_mode).
CREATE TABLE IF NOT EXISTS ferry_dispatch (
    id         TINYINT     NOT NULL PRIMARY KEY,
    mode       VARCHAR(8)  NOT NULL,
    changed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    CONSTRAINT ferry_dispatch_one CHECK (id = 1),
    CONSTRAINT ferry_dispatch_mode_check CHECK (mode IN ('row', 'cursor'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
INSERT IGNORE INTO ferry_dispatch (id, mode) VALUES (1, 'row');

-- The cursor of each slot lives in its lease row: every intent of the slot with seq <= cursor_seq
-- is dispatched. cursor_version is the batch-level claim version, cursor_claim_id the last
-- advance's id (lost-commit recovery).
ALTER TABLE ferry_slot_lease
    ADD COLUMN IF NOT EXISTS cursor_seq      BIGINT      NULL,
    ADD COLUMN IF NOT EXISTS cursor_version  BIGINT      NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS cursor_claim_id VARCHAR(64) NULL;

-- Per-row delivery state in cursor mode, only for exceptions: items that were not acked and the
-- later events of their aggregates held behind them. The per-row protocol applies here.
CREATE TABLE IF NOT EXISTS ferry_outbox_exception (
    seq               BIGINT       NOT NULL PRIMARY KEY,
    shard_slot        SMALLINT     NOT NULL,
    aggregate_id      VARCHAR(255) NOT NULL,
    aggregate_version BIGINT       NOT NULL,
    state             VARCHAR(16)  NOT NULL,
    available_at      DATETIME(6)  NOT NULL,
    claim_version     BIGINT       NOT NULL DEFAULT 0,
    claim_id          VARCHAR(64)  NULL,
    lease_until       DATETIME(6)  NULL,
    attempts          INT          NOT NULL DEFAULT 0,
    last_error        TEXT         NULL,
    sent_at           DATETIME(6)  NULL,
    resolved_by       VARCHAR(255) NULL,
    resolved_at       DATETIME(6)  NULL,
    created_at        DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    -- "does this aggregate have an open exception?" (the read's hold check, the predecessor rule)
    KEY ferry_outbox_exception_open (aggregate_id, state, aggregate_version),
    KEY ferry_outbox_exception_due (state, shard_slot, seq),
    CONSTRAINT ferry_outbox_exception_state_check
        CHECK (state IN ('PENDING', 'CLAIMED', 'SENT', 'QUARANTINED', 'SKIPPED'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The commit gate. MySQL shows SQL no transaction id or snapshot, so the cursor's horizon comes
-- from locks: every transaction that inserts an intent first holds a shared lock on one of two
-- gate rows (the trigger below, before the row's AUTO_INCREMENT value is drawn) until it ends.
-- The ticker (one relay per database, elected by GET_LOCK) holds or waits for an exclusive lock
-- on one row at a time; a shared request SKIP LOCKED passes over a row held or awaited
-- exclusively, so producers do not wait for it. When the ticker's exclusive request on a row is
-- granted, every transaction that held that row has ended: every seq at or below the head read
-- before the request is committed or rolled back, and is published as the horizon below.
CREATE TABLE IF NOT EXISTS ferry_commit_gate (
    parity TINYINT NOT NULL PRIMARY KEY
) ENGINE = InnoDB;
INSERT IGNORE INTO ferry_commit_gate (parity) VALUES (0), (1);

-- Every intent with seq <= horizon_seq is committed or rolled back (no transaction holding one
-- is still open). Written only by the ticker; ticker_conn is its connection id (status reports
-- the oldest other open transaction, which is what can hold the horizon back).
CREATE TABLE IF NOT EXISTS ferry_horizon (
    id          TINYINT     NOT NULL PRIMARY KEY,
    horizon_seq BIGINT      NOT NULL,
    ticked_at   DATETIME(6) NULL,
    ticker_conn BIGINT      NULL,
    CONSTRAINT ferry_horizon_one CHECK (id = 1)
) ENGINE = InnoDB;
INSERT IGNORE INTO ferry_horizon (id, horizon_seq) VALUES (1, 0);

-- MariaDB 10.11 does not honour SKIP LOCKED in a trigger from the second row of a multi-row
-- INSERT on (the request waits instead): the later rows of a statement take the gate its first
-- row took, which the transaction already holds, so they never wait. Every row still takes a gate
-- with a locking read, so a stale session variable (another statement in the same microsecond)
-- can cost a wait, never soundness.
CREATE TRIGGER IF NOT EXISTS ferry_outbox_gate BEFORE INSERT ON ferry_outbox FOR EACH ROW
BEGIN
    DECLARE g TINYINT DEFAULT NULL;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET g = NULL;
    IF @ferry_gate_stmt <=> NOW(6) AND @ferry_gate IS NOT NULL THEN
        SELECT parity INTO g FROM ferry_commit_gate WHERE parity = @ferry_gate LOCK IN SHARE MODE;
    ELSE
        SELECT parity INTO g FROM ferry_commit_gate WHERE parity = 0 LOCK IN SHARE MODE SKIP LOCKED;
        IF g IS NULL THEN
            SELECT parity INTO g FROM ferry_commit_gate WHERE parity = 1 LOCK IN SHARE MODE SKIP LOCKED;
        END IF;
        IF g IS NULL THEN
            -- both rows taken exclusively: only while a second ticker misbehaves; wait, never skip
            SELECT parity INTO g FROM ferry_commit_gate WHERE parity = 0 LOCK IN SHARE MODE;
        END IF;
        SET @ferry_gate = g, @ferry_gate_stmt = NOW(6);
    END IF;
END;

-- Effective delivery state in cursor mode: an exception row's state, else a finished row-mode
-- state (rows written before a switch to cursor mode), else SENT behind the slot's cursor, else
-- PENDING. Read by status, record, reconcile and purge in cursor mode.
CREATE OR REPLACE VIEW ferry_outbox_cursor_view AS
SELECT o.seq, o.event_id, o.aggregate_id, o.aggregate_version, o.shard_slot, o.created_at, o.payload,
       coalesce(x.state, CASE WHEN o.state NOT IN ('PENDING', 'CLAIMED') THEN o.state
                              WHEN l.cursor_seq IS NOT NULL AND o.seq <= l.cursor_seq
                              THEN 'SENT' ELSE 'PENDING' END) AS state,
       coalesce(x.claim_version, 0) AS claim_version, x.claim_id, coalesce(x.attempts, 0) AS attempts,
       x.last_error, x.sent_at, x.resolved_by, x.available_at
FROM ferry_outbox o
JOIN ferry_slot_lease l ON l.slot = o.shard_slot
LEFT JOIN ferry_outbox_exception x ON x.seq = o.seq;
