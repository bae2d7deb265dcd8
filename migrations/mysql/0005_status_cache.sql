-- The outbox status shared by the relays of one database (MyStore::shared_status), as on
-- PostgreSQL (migrations/postgres/0004_status_cache.sql). In cursor dispatch a count walks the
-- backlog behind the cursors (about 2.5 µs of server CPU per row), and every relay counted on
-- its own every status interval. One relay at a time takes `computing_until` (a lease),
-- counts, and stores the result; the others read it while it is fresher than their interval.
CREATE TABLE IF NOT EXISTS ferry_status_cache (
    id              TINYINT     NOT NULL PRIMARY KEY,
    pending         BIGINT      NULL,
    claimed         BIGINT      NULL,
    quarantined     BIGINT      NULL,
    -- age of the oldest unfinished intent when counted, µs (NULL: none)
    oldest_age_us   BIGINT      NULL,
    blocked         BIGINT      NULL,
    computed_at     DATETIME(6) NULL,
    computing_until DATETIME(6) NULL,
    CONSTRAINT ferry_status_cache_one CHECK (id = 1)
) ENGINE = InnoDB;
INSERT IGNORE INTO ferry_status_cache (id) VALUES (1);
