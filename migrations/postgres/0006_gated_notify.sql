-- Commit wake-ups without serialising commits. PostgreSQL takes one cluster-wide lock for every
-- committing transaction that queued a NOTIFY and holds it until the commit record is flushed
-- (PreCommit_Notify), so with one NOTIFY per producer transaction the producers' commits flush
-- one at a time instead of sharing a WAL flush. Only the transaction that wins a per-database
-- advisory lock (held to its end) notifies; transactions that overlap it skip the NOTIFY and
-- commit concurrently. Each skipped transaction commits while a notifying one is in flight, and
-- the relay woken by that one reads again before it sleeps (a read that returned events is
-- followed by another after at most poll_min), so an overlapping commit is read at once in the
-- common case and at worst after the relay's idle poll.
CREATE OR REPLACE FUNCTION ferry_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- 0x66657272 = 'ferr'
    IF pg_try_advisory_xact_lock(1717924466) THEN
        PERFORM pg_notify('ferry_outbox', '');
    END IF;
    RETURN NULL;
END $$;
