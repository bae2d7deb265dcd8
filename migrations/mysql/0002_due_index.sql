-- Row-mode claims in seq order without walking the table (docs/schema.md, MariaDB claim plan).
-- The claim scans `state = 'PENDING'` (or 'CLAIMED') in seq order and filters the owner's slots,
-- due time and lease expiry from the index itself; rows are looked up only for matches. The old
-- (state, shard_slot, seq) index could not give seq order across many slots, so the optimizer
-- either sorted every pending row of the slots or walked the primary key through all SENT rows.
ALTER TABLE ferry_outbox ADD INDEX IF NOT EXISTS ferry_outbox_due (state, seq, shard_slot, available_at, lease_until);
ALTER TABLE ferry_outbox DROP INDEX IF EXISTS ferry_outbox_dispatch;
