-- The outbox status shared by the relays of one database (PgStore::shared_status). Counting the
-- undispatched intents walks the backlog (cursor dispatch derives states per row): measured
-- 1-2.5 s per count with a 100k backlog on 2 cores, and eight relays each counting every 5 s
-- spent about two cores on it. One relay at a time takes `computing_until` (a lease), counts,
-- and stores the result; the others read it while it is fresher than their poll interval.
CREATE TABLE IF NOT EXISTS ferry_status_cache (
    id              SMALLINT PRIMARY KEY CHECK (id = 1),
    pending         BIGINT,
    claimed         BIGINT,
    quarantined     BIGINT,
    -- age of the oldest unfinished intent when counted, µs (NULL: none)
    oldest_age_us   BIGINT,
    blocked         BIGINT,
    computed_at     TIMESTAMPTZ,
    computing_until TIMESTAMPTZ
);
INSERT INTO ferry_status_cache (id) VALUES (1) ON CONFLICT DO NOTHING;
