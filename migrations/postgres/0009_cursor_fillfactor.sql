-- Cursor dispatch never updates an outbox row, so the 30 % of each heap page that fillfactor 70
-- keeps free for row dispatch's HOT updates (claims, acks) stays empty for good: a third more heap
-- per event. In cursor dispatch the outbox is filled to 100 % (new pages only; existing pages are
-- not rewritten); a switch to row dispatch sets 70 again (PgStore::set_dispatch_mode).
DO $$
BEGIN
    IF (SELECT mode FROM ferry_dispatch WHERE id = 1) = 'cursor' THEN
        ALTER TABLE ferry_outbox SET (fillfactor = 100);
    END IF;
END $$;
