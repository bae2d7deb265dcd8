-- Event ids the view's trigger fills are UUIDv7, as the Rust API's (ferry_core::new_event_id):
-- 48 bits of Unix milliseconds (julianday('now'), millisecond precision), version 7, the variant
-- bits 10, then random bits. Ids drawn later sort later, so inserts land at the right edge of the
-- unique event_id index instead of at a random page. The trigger is otherwise unchanged
-- (0003_plain_insert.sql).
DROP TRIGGER IF EXISTS ferry_outbox_insert;
CREATE TRIGGER ferry_outbox_insert INSTEAD OF INSERT ON ferry_outbox_insert
BEGIN
    INSERT INTO ferry_outbox (event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key,
                              event_type, headers, payload, created_at, available_at)
    VALUES (
        coalesce(NEW.event_id, (
            SELECT substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(lower(hex(randomblob(2))), 2)
                   || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) || substr(lower(hex(randomblob(2))), 2)
                   || '-' || lower(hex(randomblob(6)))
            FROM (SELECT printf('%012x', CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)) AS t))),
        NEW.aggregate_id,
        NEW.aggregate_version,
        coalesce(NEW.shard_slot, (
            WITH RECURSIVE f(i, h) AS (
                SELECT 0, 37
                UNION ALL
                SELECT i + 1,
                       (((h | ((instr('0123456789ABCDEF', substr(hex(CAST(NEW.aggregate_id AS BLOB)), 2 * i + 1, 1)) - 1) * 16
                        + instr('0123456789ABCDEF', substr(hex(CAST(NEW.aggregate_id AS BLOB)), 2 * i + 2, 1)) - 1)) - (h & ((instr('0123456789ABCDEF', substr(hex(CAST(NEW.aggregate_id AS BLOB)), 2 * i + 1, 1)) - 1) * 16
                        + instr('0123456789ABCDEF', substr(hex(CAST(NEW.aggregate_id AS BLOB)), 2 * i + 2, 1)) - 1))) * 179) % 256
                FROM f
                WHERE i < length(CAST(NEW.aggregate_id AS BLOB)))
            SELECT h FROM f ORDER BY i DESC LIMIT 1)),
        NEW.topic,
        coalesce(NEW.msg_key, NEW.aggregate_id),
        NEW.event_type,
        coalesce(NEW.headers, '{}'),
        NEW.payload,
        CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER),
        CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)
    );
END;
