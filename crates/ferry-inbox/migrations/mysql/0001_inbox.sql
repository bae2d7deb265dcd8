-- ferry consumer Inbox, MySQL 8.0+ / MariaDB 10.6+; tested on MariaDB 10.11.
-- One row per (consumer, event) whose effect was committed. The primary key is the dedupe:
-- a second transaction inserting the same pair waits for the first and then gets a duplicate.
-- Binary collation: ids are compared byte for byte, as on PostgreSQL and SQLite.
CREATE TABLE IF NOT EXISTS ferry_inbox (
    consumer          VARCHAR(255) NOT NULL,
    event_id          VARCHAR(255) NOT NULL,
    aggregate_id      VARCHAR(255) NOT NULL,
    aggregate_version BIGINT       NOT NULL,
    recorded_at       DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer, event_id),
    KEY ferry_inbox_aggregate_version (consumer, aggregate_id, aggregate_version)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Per (consumer, aggregate): highest contiguous applied version, highest version seen, and
-- since when a gap is open (µs since the epoch; NULL = no gap).
CREATE TABLE IF NOT EXISTS ferry_inbox_aggregate (
    consumer     VARCHAR(255) NOT NULL,
    aggregate_id VARCHAR(255) NOT NULL,
    applied_upto BIGINT       NOT NULL DEFAULT 0,
    max_seen     BIGINT       NOT NULL DEFAULT 0,
    gap_since_us BIGINT       NULL,
    updated_at   DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer, aggregate_id),
    KEY ferry_inbox_aggregate_gap (consumer, gap_since_us)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
