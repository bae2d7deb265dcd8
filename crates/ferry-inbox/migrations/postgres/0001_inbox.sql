-- ferry consumer Inbox, PostgreSQL 12+ (tested on 15).
-- One row per (consumer, event) whose effect was committed. The primary key is the dedupe:
-- a second transaction inserting the same pair waits for the first and then conflicts.
CREATE TABLE IF NOT EXISTS ferry_inbox (
    consumer          VARCHAR(255) NOT NULL,
    event_id          VARCHAR(255) NOT NULL,
    aggregate_id      VARCHAR(255) NOT NULL,
    aggregate_version BIGINT       NOT NULL,
    recorded_at       TIMESTAMPTZ  NOT NULL DEFAULT now(),
    CONSTRAINT ferry_inbox_pkey PRIMARY KEY (consumer, event_id)
);
-- versions recorded ahead of a gap are found by this index when the gap closes
CREATE INDEX IF NOT EXISTS ferry_inbox_aggregate_version
    ON ferry_inbox (consumer, aggregate_id, aggregate_version);

-- Per (consumer, aggregate): the highest version applied contiguously, the highest version
-- seen, and since when a gap is open (µs since the epoch; NULL = no gap). Its row lock
-- serializes deliveries of one aggregate to one consumer when gap detection is on.
CREATE TABLE IF NOT EXISTS ferry_inbox_aggregate (
    consumer     VARCHAR(255) NOT NULL,
    aggregate_id VARCHAR(255) NOT NULL,
    applied_upto BIGINT       NOT NULL DEFAULT 0,
    max_seen     BIGINT       NOT NULL DEFAULT 0,
    gap_since_us BIGINT,
    updated_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    CONSTRAINT ferry_inbox_aggregate_pkey PRIMARY KEY (consumer, aggregate_id)
);
CREATE INDEX IF NOT EXISTS ferry_inbox_aggregate_gap
    ON ferry_inbox_aggregate (consumer, gap_since_us) WHERE gap_since_us IS NOT NULL;
