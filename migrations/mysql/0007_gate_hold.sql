-- A long producer transaction delays only the slots it wrote (docs/architecture.md, "MySQL/MariaDB:
-- the commit gate"). Four gate rows instead of two: when the ticker has waited a while for a row,
-- it leaves a waiter queued on it (no new transaction can take that row) and alternates between
-- two others; what the few transactions left holding the waited-for row wrote is read with a
-- dirty read once each of them is idle, and only the slots holding their rows are held back
-- (ferry_gate_hold). Every statement is idempotent (a migration that died half-way is re-run).
INSERT IGNORE INTO ferry_commit_gate (parity) VALUES (2), (3);

-- The horizon moves to a new table, and the old one is dropped: a relay of an earlier version
-- still running during an upgrade then fails to read or publish a horizon (and delivers nothing
-- in cursor dispatch until it is replaced) instead of publishing one that ignores gate rows 2
-- and 3.
-- Every intent with seq <= horizon_seq is committed or rolled back. While partial_seq is set,
-- every intent with seq <= partial_seq is too, except in the slots of ferry_gate_hold, where
-- those with seq >= below_seq may still be open. Written only by the ticker, partial_seq and the
-- holds in one transaction. ticker_conn is the ticker's main connection id, ticker_conns every
-- connection of its session (ended together when a stopped ticker is replaced).
CREATE TABLE IF NOT EXISTS ferry_gate_horizon (
    id           TINYINT      NOT NULL PRIMARY KEY,
    horizon_seq  BIGINT       NOT NULL,
    partial_seq  BIGINT       NULL,
    ticked_at    DATETIME(6)  NULL,
    ticker_conn  BIGINT       NULL,
    ticker_conns VARCHAR(255) NULL,
    CONSTRAINT ferry_gate_horizon_one CHECK (id = 1)
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS ferry_gate_hold (
    shard_slot SMALLINT NOT NULL PRIMARY KEY,
    below_seq  BIGINT   NOT NULL
) ENGINE = InnoDB;
-- (re-run after the DROP below: the empty table makes the copy a no-op, and the horizon starts
-- at 0, which only makes readers wait for the next tick)
CREATE TABLE IF NOT EXISTS ferry_horizon (
    id          TINYINT NOT NULL PRIMARY KEY,
    horizon_seq BIGINT  NOT NULL
) ENGINE = InnoDB;
INSERT IGNORE INTO ferry_gate_horizon (id, horizon_seq) SELECT 1, horizon_seq FROM ferry_horizon WHERE id = 1;
INSERT IGNORE INTO ferry_gate_horizon (id, horizon_seq) VALUES (1, 0);
DROP TABLE IF EXISTS ferry_horizon;

-- The gate of 0004 with four rows: a statement's first row takes the first row nobody else holds
-- or awaits exclusively (a row the transaction holds already counts as free: its own lock is
-- granted again); the later rows of a statement take what its first row took (MariaDB ignores
-- SKIP LOCKED in a trigger from a statement's second row on, see 0003). (Preferring the row a
-- session took last, with `WHERE parity = @ferry_gate ... SKIP LOCKED`, was tried: MariaDB 10.11
-- waited there behind a queued exclusive request instead of skipping.) The filling of 0004 is
-- unchanged.
CREATE OR REPLACE TRIGGER ferry_outbox_gate BEFORE INSERT ON ferry_outbox FOR EACH ROW
BEGIN
    DECLARE g TINYINT DEFAULT NULL;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET g = NULL;
    IF @ferry_gate_stmt <=> NOW(6) AND @ferry_gate IS NOT NULL THEN
        SELECT parity INTO g FROM ferry_commit_gate WHERE parity = @ferry_gate LOCK IN SHARE MODE;
    ELSE
        SELECT parity INTO g FROM ferry_commit_gate ORDER BY parity LIMIT 1 LOCK IN SHARE MODE SKIP LOCKED;
        IF g IS NULL THEN
            -- every row taken exclusively: only while a second ticker misbehaves; wait, never skip
            SELECT parity INTO g FROM ferry_commit_gate WHERE parity = 0 LOCK IN SHARE MODE;
        END IF;
        SET @ferry_gate = g, @ferry_gate_stmt = NOW(6);
    END IF;
    -- plain INSERTs from any language: fill what the Rust API fills
    IF NEW.shard_slot IS NULL THEN
        SET NEW.shard_slot = ferry_slot_for(NEW.aggregate_id);
    END IF;
    IF NEW.msg_key IS NULL THEN
        SET NEW.msg_key = NEW.aggregate_id;
    END IF;
    IF NEW.event_id IS NULL THEN
        SET NEW.event_id = UUID();
    END IF;
    IF NEW.headers IS NULL THEN
        SET NEW.headers = '{}';
    END IF;
END;
