-- ferry outbox schema, SQLite 3.38+ (RETURNING 3.35, ->> 3.38); bundled 3.46 via libsqlite3-sys.
-- Timestamps are INTEGER microseconds since the Unix epoch.
CREATE TABLE IF NOT EXISTS ferry_outbox (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id          TEXT    NOT NULL,
    aggregate_id      TEXT    NOT NULL,
    aggregate_version INTEGER NOT NULL CHECK (aggregate_version >= 1),
    shard_slot        INTEGER NOT NULL CHECK (shard_slot >= 0 AND shard_slot < 256),
    topic             TEXT    NOT NULL,
    msg_key           TEXT    NOT NULL,
    event_type        TEXT    NOT NULL,
    headers           TEXT    NOT NULL DEFAULT '{}',
    payload           TEXT    NOT NULL,
    created_at        INTEGER NOT NULL,
    state             TEXT    NOT NULL DEFAULT 'PENDING'
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
    CONSTRAINT ferry_outbox_event_id_key UNIQUE (event_id),
    CONSTRAINT ferry_outbox_aggregate_version_key UNIQUE (aggregate_id, aggregate_version)
);
CREATE INDEX IF NOT EXISTS ferry_outbox_dispatch
    ON ferry_outbox (seq, shard_slot) WHERE state IN ('PENDING', 'CLAIMED');
CREATE INDEX IF NOT EXISTS ferry_outbox_unfinished
    ON ferry_outbox (aggregate_id, aggregate_version) WHERE state IN ('PENDING', 'CLAIMED', 'QUARANTINED');
CREATE INDEX IF NOT EXISTS ferry_outbox_claim_id
    ON ferry_outbox (claim_id) WHERE state = 'CLAIMED';
CREATE INDEX IF NOT EXISTS ferry_outbox_sent_at
    ON ferry_outbox (sent_at) WHERE state = 'SENT';

CREATE TRIGGER IF NOT EXISTS ferry_outbox_immutable
BEFORE UPDATE OF event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key,
                 event_type, headers, payload, created_at ON ferry_outbox
FOR EACH ROW WHEN NOT (NEW.event_id IS OLD.event_id AND NEW.aggregate_id IS OLD.aggregate_id
    AND NEW.aggregate_version IS OLD.aggregate_version AND NEW.shard_slot IS OLD.shard_slot
    AND NEW.topic IS OLD.topic AND NEW.msg_key IS OLD.msg_key AND NEW.event_type IS OLD.event_type
    AND NEW.headers IS OLD.headers AND NEW.payload IS OLD.payload AND NEW.created_at IS OLD.created_at)
BEGIN
    SELECT RAISE(ABORT, 'ferry_outbox intent columns are immutable');
END;

CREATE TABLE IF NOT EXISTS ferry_slot_lease (
    slot        INTEGER PRIMARY KEY CHECK (slot >= 0 AND slot < 256),
    owner       TEXT,
    epoch       INTEGER NOT NULL DEFAULT 0,
    lease_until INTEGER
);
WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s WHERE n < 255)
INSERT OR IGNORE INTO ferry_slot_lease (slot) SELECT n FROM s;

CREATE TABLE IF NOT EXISTS ferry_relay_member (
    owner       TEXT PRIMARY KEY,
    lease_until INTEGER NOT NULL,
    joined_at   INTEGER NOT NULL
);
