-- One process per owner id (as migrations/postgres/0007_member_instance.sql): the membership
-- row of an owner id names the instance that holds it; another instance takes it only once it
-- has expired.
ALTER TABLE ferry_relay_member ADD COLUMN instance TEXT NOT NULL DEFAULT '';
