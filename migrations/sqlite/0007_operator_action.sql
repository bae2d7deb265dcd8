-- The record of every bulk operator action on quarantined events (`ferry quarantine requeue|skip`
-- with a filter): who, when (µs since the epoch), why, in which dispatch mode, how many events it
-- moved, and the filter it selected them by. Written in the same transaction as the action
-- itself, so `moved` is exactly what the action changed. `ferry status` shows the newest few.
CREATE TABLE IF NOT EXISTS ferry_operator_action (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    at               INTEGER NOT NULL,
    operator         TEXT    NOT NULL,
    action           TEXT    NOT NULL CHECK (action IN ('requeue', 'skip')),
    reason           TEXT    NOT NULL,
    dispatch         TEXT    NOT NULL,
    moved            INTEGER NOT NULL,
    -- the filter: NULL where not given; times as µs since the epoch (the intent's created_at)
    where_topic      TEXT,
    where_aggregate  TEXT,
    where_error      TEXT,
    created_since_us INTEGER,
    created_until_us INTEGER
);
