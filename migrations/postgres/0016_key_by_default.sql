-- A message key equal to the aggregate id is no longer stored twice: `msg_key` NULL means "the
-- aggregate id" (every read of the column is coalesce(msg_key, aggregate_id)). The Rust API
-- writes NULL when the key is the aggregate id, and a plain INSERT that leaves msg_key out keeps
-- it NULL instead of copying the aggregate id into it. A row costs the id's bytes less (17 B for
-- loadgen's ids, 37 B for a UUID aggregate id): docs/schema.md §2.1, docs/performance.md.
--
-- DROP NOT NULL only changes the catalog (no table rewrite, no scan); it takes the table's lock
-- for that moment. Rows written before keep their stored key.
--
-- Relays of an earlier version cannot read a row whose msg_key is NULL: migrate, then replace
-- them (docs/operations.md, "Upgrades").
ALTER TABLE ferry_outbox ALTER COLUMN msg_key DROP NOT NULL;

CREATE OR REPLACE FUNCTION ferry_outbox_fill() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.shard_slot := coalesce(NEW.shard_slot, ferry_slot_for(NEW.aggregate_id));
    NEW.event_id := coalesce(NEW.event_id, ferry_uuid_v7()::text);
    RETURN NEW;
END $$;

DROP TRIGGER IF EXISTS ferry_outbox_fill ON ferry_outbox;
CREATE TRIGGER ferry_outbox_fill BEFORE INSERT ON ferry_outbox FOR EACH ROW
    WHEN (NEW.shard_slot IS NULL OR NEW.event_id IS NULL)
    EXECUTE FUNCTION ferry_outbox_fill();
