-- `ferry_outbox_predecessor` leads with `state` (docs/schema.md §3.3): a row claim finds each
-- aggregate's lowest PENDING version past its window with one probe, never reading the SENT
-- versions, which sit under their own prefix (ferry_store::mysql::claim). The predecessor probe
-- reads one range per unfinished state, as before. Rebuilt only where the index exists with the
-- old column order: in cursor dispatch it does not exist (a switch to row dispatch builds it with
-- the new order), and a re-run finds it rebuilt already.
SET @ferry_ddl = (
    SELECT IF(COUNT(*) > 0,
              'ALTER TABLE ferry_outbox DROP INDEX ferry_outbox_predecessor, ADD INDEX ferry_outbox_predecessor (state, aggregate_id, aggregate_version)',
              'DO 0')
    FROM information_schema.STATISTICS
    WHERE table_schema = DATABASE() AND table_name = 'ferry_outbox'
      AND index_name = 'ferry_outbox_predecessor' AND seq_in_index = 1 AND column_name = 'aggregate_id');
EXECUTE IMMEDIATE @ferry_ddl;
SET @ferry_ddl = NULL;
