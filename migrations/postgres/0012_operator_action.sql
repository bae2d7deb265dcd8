-- The record of every bulk operator action on quarantined events (`ferry quarantine requeue|skip`
-- with a filter): who, when, why, in which dispatch mode, how many events it moved, and the
-- filter it selected them by. Written in the same transaction as the action itself, so `moved`
-- is exactly what the action changed. `ferry status` shows the newest few (primary-key order).
CREATE TABLE IF NOT EXISTS ferry_operator_action (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at               TIMESTAMPTZ  NOT NULL DEFAULT now(),
    operator         VARCHAR(255) NOT NULL,
    action           VARCHAR(16)  NOT NULL CHECK (action IN ('requeue', 'skip')),
    reason           TEXT         NOT NULL,
    dispatch         VARCHAR(8)   NOT NULL,
    moved            BIGINT       NOT NULL,
    -- the filter: NULL where not given; times as µs since the epoch (the intent's created_at)
    where_topic      TEXT,
    where_aggregate  TEXT,
    where_error      TEXT,
    created_since_us BIGINT,
    created_until_us BIGINT
);
