-- Retention watermark per topic (ferry replay): the newest created_at (µs since the epoch) of any
-- row `ferry purge` deleted, written in the transaction of the delete itself, so that a replay
-- whose range starts at or before it is refused (rows of the range may be gone).
CREATE TABLE IF NOT EXISTS ferry_retention_mark (
    topic             VARCHAR(255) PRIMARY KEY,
    purged_created_at BIGINT       NOT NULL,
    purged_at         BIGINT       NOT NULL
);
