-- Paused topics (`ferry pause`): a relay claims and sends no intent of a paused topic, and
-- holds the later versions of its aggregates behind it (docs/architecture.md, "Pausing").
-- topic '*' pauses every topic. paused_at: µs since the epoch (the operator's clock).
CREATE TABLE IF NOT EXISTS ferry_pause (
    topic     VARCHAR(255) PRIMARY KEY,
    reason    TEXT         NOT NULL,
    operator  TEXT         NOT NULL,
    paused_at BIGINT       NOT NULL
);
