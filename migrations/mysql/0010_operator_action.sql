-- The record of every bulk operator action on quarantined events (`ferry quarantine requeue|skip`
-- with a filter): who, when, why, in which dispatch mode, how many events it moved, and the
-- filter it selected them by. Written in the same transaction as the action itself, so `moved`
-- is exactly what the action changed. `ferry status` shows the newest few (primary-key order).
CREATE TABLE IF NOT EXISTS ferry_operator_action (
    id               BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at               DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    operator         VARCHAR(255) NOT NULL,
    action           VARCHAR(16)  NOT NULL,
    reason           TEXT         NOT NULL,
    dispatch         VARCHAR(8)   NOT NULL,
    moved            BIGINT       NOT NULL,
    -- the filter: NULL where not given; times as µs since the epoch (the intent's created_at)
    where_topic      TEXT         NULL,
    where_aggregate  TEXT         NULL,
    where_error      TEXT         NULL,
    created_since_us BIGINT       NULL,
    created_until_us BIGINT       NULL,
    CONSTRAINT ferry_operator_action_check CHECK (action IN ('requeue', 'skip'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
