-- Event ids the database fills (a plain INSERT that leaves event_id out) are UUIDv7, as the Rust
-- API's (ferry_core::new_event_id): 48 bits of Unix milliseconds, then random bits. Ids drawn
-- later sort later, so each insert lands at the right edge of the unique event_id index instead
-- of at a random leaf: the leaves a producer touches stay in memory however large the index
-- grows (docs/schema.md, "Producing from any language").
--
-- A random UUIDv4 from gen_random_uuid() (core since PostgreSQL 13) with its first 6 bytes
-- replaced by the millisecond timestamp and its version nibble set from 4 (0100) to 7 (0111);
-- the variant bits stay 10.
CREATE OR REPLACE FUNCTION ferry_uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
             PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::int8) FROM 3)
             FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$;

-- The fill of 0005_plain_insert.sql with UUIDv7 ids (coalesce evaluates an argument only when
-- the ones before it are NULL, so the slot is computed only when left out, as before).
CREATE OR REPLACE FUNCTION ferry_outbox_fill() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.shard_slot := coalesce(NEW.shard_slot, ferry_slot_for(NEW.aggregate_id));
    NEW.msg_key := coalesce(NEW.msg_key, NEW.aggregate_id);
    NEW.event_id := coalesce(NEW.event_id, ferry_uuid_v7()::text);
    RETURN NEW;
END $$;
