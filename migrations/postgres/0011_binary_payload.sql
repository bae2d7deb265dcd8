-- Binary payloads (Avro, Protobuf): a row carries its payload either as text in `payload` (JSON,
-- the default) or as bytes in `payload_bytes`, exactly one of them; the relay sends either
-- unchanged (docs/schema.md, "Binary payloads"). On a table that already holds rows: ADD COLUMN
-- of a nullable column without a default and DROP NOT NULL change only the catalog; the CHECK
-- reads every existing row once (all have text, so all pass), under the ALTER's ACCESS
-- EXCLUSIVE lock: inserts wait for that scan.
ALTER TABLE ferry_outbox
    ADD COLUMN IF NOT EXISTS payload_bytes BYTEA,
    ALTER COLUMN payload DROP NOT NULL;
ALTER TABLE ferry_outbox DROP CONSTRAINT IF EXISTS ferry_outbox_payload_one;
ALTER TABLE ferry_outbox ADD CONSTRAINT ferry_outbox_payload_one
    CHECK ((payload IS NULL) <> (payload_bytes IS NULL));

-- The intent stays immutable: 0001's trigger, with payload_bytes.
DROP TRIGGER IF EXISTS ferry_outbox_immutable ON ferry_outbox;
CREATE TRIGGER ferry_outbox_immutable
    BEFORE UPDATE OF event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key,
                     event_type, headers, payload, payload_bytes, created_at
    ON ferry_outbox FOR EACH ROW
    WHEN (OLD.event_id IS DISTINCT FROM NEW.event_id
          OR OLD.aggregate_id IS DISTINCT FROM NEW.aggregate_id
          OR OLD.aggregate_version IS DISTINCT FROM NEW.aggregate_version
          OR OLD.shard_slot IS DISTINCT FROM NEW.shard_slot
          OR OLD.topic IS DISTINCT FROM NEW.topic
          OR OLD.msg_key IS DISTINCT FROM NEW.msg_key
          OR OLD.event_type IS DISTINCT FROM NEW.event_type
          OR OLD.headers IS DISTINCT FROM NEW.headers
          OR OLD.payload IS DISTINCT FROM NEW.payload
          OR OLD.payload_bytes IS DISTINCT FROM NEW.payload_bytes
          OR OLD.created_at IS DISTINCT FROM NEW.created_at)
    EXECUTE FUNCTION ferry_outbox_immutable();

-- 0008's cursor view, with payload_bytes appended (CREATE OR REPLACE VIEW may only add columns
-- at the end).
CREATE OR REPLACE VIEW ferry_outbox_cursor_view AS
SELECT o.seq, o.event_id, o.aggregate_id, o.aggregate_version, o.shard_slot, o.created_at, o.payload,
       coalesce(x.state, CASE WHEN o.state NOT IN ('PENDING', 'CLAIMED') THEN o.state
                              WHEN l.cursor_tick IS NOT NULL
                                   AND (pg_visible_in_snapshot(coalesce(o.xid, 0)::text::xid8, tp.snap)
                                        OR (pg_visible_in_snapshot(coalesce(o.xid, 0)::text::xid8, tc.snap)
                                            AND o.seq <= l.cursor_seq))
                              THEN 'SENT' ELSE 'PENDING' END) AS state,
       coalesce(x.claim_version, 0) AS claim_version, x.claim_id, coalesce(x.attempts, 0) AS attempts,
       x.last_error, x.sent_at, x.resolved_by, x.available_at, o.xid, o.payload_bytes
FROM ferry_outbox o
JOIN ferry_slot_lease l ON l.slot = o.shard_slot
LEFT JOIN ferry_tick tp ON tp.tick_id = l.cursor_tick - 1
LEFT JOIN ferry_tick tc ON tc.tick_id = l.cursor_tick
LEFT JOIN ferry_outbox_exception x ON x.seq = o.seq;
