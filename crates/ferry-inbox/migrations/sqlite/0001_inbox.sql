-- ferry consumer Inbox, SQLite 3.35+; bundled 3.46 via libsqlite3-sys.
-- Timestamps are INTEGER microseconds since the Unix epoch.
CREATE TABLE IF NOT EXISTS ferry_inbox (
    consumer          TEXT    NOT NULL,
    event_id          TEXT    NOT NULL,
    aggregate_id      TEXT    NOT NULL,
    aggregate_version INTEGER NOT NULL,
    recorded_at       INTEGER NOT NULL,
    PRIMARY KEY (consumer, event_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ferry_inbox_aggregate_version
    ON ferry_inbox (consumer, aggregate_id, aggregate_version);

CREATE TABLE IF NOT EXISTS ferry_inbox_aggregate (
    consumer     TEXT    NOT NULL,
    aggregate_id TEXT    NOT NULL,
    applied_upto INTEGER NOT NULL DEFAULT 0,
    max_seen     INTEGER NOT NULL DEFAULT 0,
    gap_since_us INTEGER,
    updated_at   INTEGER NOT NULL,
    PRIMARY KEY (consumer, aggregate_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ferry_inbox_aggregate_gap
    ON ferry_inbox_aggregate (consumer, gap_since_us) WHERE gap_since_us IS NOT NULL;
