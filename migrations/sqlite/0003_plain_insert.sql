-- One plain INSERT from any language (docs/schema.md, "Producing from any language"). SQLite
-- triggers cannot change the row being inserted, so producers that do not compute every column
-- insert into this view instead; its INSTEAD OF trigger fills shard_slot, msg_key, event_id,
-- headers and the timestamps exactly as the Rust API does and inserts into ferry_outbox, in the
-- producer's own transaction.
CREATE VIEW IF NOT EXISTS ferry_outbox_insert AS
SELECT event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key, event_type, headers, payload
FROM ferry_outbox;

-- shard_slot: FNV-1a-64 over the aggregate id's UTF-8 bytes, modulo 256 (ferry_core::slot_for).
-- Only the low 8 bits of FNV-1a's state reach the result, so the state is kept modulo 256
-- (offset basis 0x…25 = 37, prime 0x…b3 = 179); the bytes are read from hex(), XOR is
-- (a | b) - (a & b). The timestamps are microseconds since the Unix epoch, from julianday()
-- (millisecond precision; every SQLite version has it).
CREATE TRIGGER IF NOT EXISTS ferry_outbox_insert INSTEAD OF INSERT ON ferry_outbox_insert
BEGIN
    INSERT INTO ferry_outbox (event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key,
                              event_type, headers, payload, created_at, available_at)
    VALUES (
        coalesce(NEW.event_id, lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' ||
                 substr(hex(randomblob(2)), 2) || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) ||
                 substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6)))),
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
