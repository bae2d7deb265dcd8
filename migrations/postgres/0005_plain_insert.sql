-- One plain INSERT from any language (docs/schema.md, "Producing from any language"): a producer
-- may leave out shard_slot, msg_key and event_id (headers and created_at have defaults already);
-- the database fills them exactly as the Rust API does. The trigger only runs for rows that
-- leave one of them out, so producers that fill every column pay one WHEN test per row.

-- The shard slot of an aggregate: FNV-1a-64 over the aggregate id's UTF-8 bytes, modulo 256
-- (ferry_core::slot_for). Only the low 8 bits of FNV-1a's state ever reach the result (256
-- divides 2^64, and the low bits of a product and of an XOR depend only on the low bits of their
-- operands), so the state is kept modulo 256: offset basis 0x…25 = 37, prime 0x…b3 = 179.
CREATE OR REPLACE FUNCTION ferry_slot_for(aggregate_id text) RETURNS smallint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    b bytea := convert_to(aggregate_id, 'UTF8');
    h integer := 37;
BEGIN
    FOR i IN 0 .. length(b) - 1 LOOP
        h := ((h # get_byte(b, i)) * 179) & 255;
    END LOOP;
    RETURN h;
END $$;

CREATE OR REPLACE FUNCTION ferry_outbox_fill() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.shard_slot IS NULL THEN
        NEW.shard_slot := ferry_slot_for(NEW.aggregate_id);
    END IF;
    IF NEW.msg_key IS NULL THEN
        NEW.msg_key := NEW.aggregate_id;
    END IF;
    IF NEW.event_id IS NULL THEN
        NEW.event_id := gen_random_uuid()::text;
    END IF;
    RETURN NEW;
END $$;

DROP TRIGGER IF EXISTS ferry_outbox_fill ON ferry_outbox;
CREATE TRIGGER ferry_outbox_fill BEFORE INSERT ON ferry_outbox FOR EACH ROW
    WHEN (NEW.shard_slot IS NULL OR NEW.msg_key IS NULL OR NEW.event_id IS NULL)
    EXECUTE FUNCTION ferry_outbox_fill();
