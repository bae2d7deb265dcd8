-- Binary payloads (Avro, Protobuf): a row carries its payload either as text in `payload` (JSON,
-- the default) or as bytes in `payload_bytes`, exactly one of them; the relay sends either
-- unchanged (docs/schema.md, "Binary payloads"). One ALTER, so it applies whole or not at all.
-- On a table that already holds rows MariaDB may rebuild the table (ALGORITHM=COPY for the
-- CHECK, which it validates against every existing row): writes to ferry_outbox wait until the
-- copy ends, which takes as long as copying the table (docs/operations.md, "Upgrading").
ALTER TABLE ferry_outbox
    ADD COLUMN IF NOT EXISTS payload_bytes LONGBLOB NULL,
    MODIFY payload LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    ADD CONSTRAINT ferry_outbox_payload_one CHECK ((payload IS NULL) <> (payload_bytes IS NULL));

-- The intent stays immutable: 0001's trigger, with payload_bytes.
CREATE OR REPLACE TRIGGER ferry_outbox_immutable BEFORE UPDATE ON ferry_outbox FOR EACH ROW
IF NOT (NEW.event_id <=> OLD.event_id AND NEW.aggregate_id <=> OLD.aggregate_id
        AND NEW.aggregate_version <=> OLD.aggregate_version AND NEW.shard_slot <=> OLD.shard_slot
        AND NEW.topic <=> OLD.topic AND NEW.msg_key <=> OLD.msg_key
        AND NEW.event_type <=> OLD.event_type AND NEW.headers <=> OLD.headers
        AND NEW.payload <=> OLD.payload AND NEW.payload_bytes <=> OLD.payload_bytes
        AND NEW.created_at <=> OLD.created_at) THEN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'ferry_outbox intent columns are immutable';
END IF;

-- 0003's cursor view, with payload_bytes.
CREATE OR REPLACE VIEW ferry_outbox_cursor_view AS
SELECT o.seq, o.event_id, o.aggregate_id, o.aggregate_version, o.shard_slot, o.created_at, o.payload,
       coalesce(x.state, CASE WHEN o.state NOT IN ('PENDING', 'CLAIMED') THEN o.state
                              WHEN l.cursor_seq IS NOT NULL AND o.seq <= l.cursor_seq
                              THEN 'SENT' ELSE 'PENDING' END) AS state,
       coalesce(x.claim_version, 0) AS claim_version, x.claim_id, coalesce(x.attempts, 0) AS attempts,
       x.last_error, x.sent_at, x.resolved_by, x.available_at, o.payload_bytes
FROM ferry_outbox o
JOIN ferry_slot_lease l ON l.slot = o.shard_slot
LEFT JOIN ferry_outbox_exception x ON x.seq = o.seq;
