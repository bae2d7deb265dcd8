-- One process per owner id. The membership row of an owner id names the instance (a random id
-- per relay start) that holds it; a heartbeat from another instance takes the row only once it
-- has expired, so two processes configured with the same owner id cannot both run, even when
-- they start at the same instant (SlotOwnership::heartbeat_member).
ALTER TABLE ferry_relay_member ADD COLUMN IF NOT EXISTS instance VARCHAR(64) NOT NULL DEFAULT '';
