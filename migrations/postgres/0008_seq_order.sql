-- Per-aggregate order under contending producers (docs/architecture.md, "Per-aggregate order").
-- A window is now read in seq order, not (xid, seq) order: a transaction takes its xid at its
-- first write, may then wait on an aggregate's row lock and insert v(n+1) after v(n)'s
-- transaction committed, with the lower xid; its seq is drawn at the insert, after that commit.

-- The outbox sequence's last value, read by the statement that stored the tick, after its
-- snapshot was taken: every row visible in the tick's snapshot has a seq at or below it (the
-- upper bound of a window's seq range). NULL for ticks stored before this migration.
ALTER TABLE ferry_tick ADD COLUMN IF NOT EXISTS seq_hi BIGINT;

-- Positions inside a window meant "up to (xid, seq)"; they now mean "up to seq". A cursor in the
-- middle of a window goes back to the window's start (its rows are read and sent again:
-- duplicates, never a loss), and cursor_version moves so that an advance prepared by a relay
-- of the previous version is fenced.
UPDATE ferry_slot_lease SET cursor_xid = 0, cursor_seq = 0, cursor_version = cursor_version + 1
 WHERE cursor_tick IS NOT NULL AND (cursor_xid <> 0 OR cursor_seq <> 0);

CREATE OR REPLACE VIEW ferry_outbox_cursor_view AS
SELECT o.seq, o.event_id, o.aggregate_id, o.aggregate_version, o.shard_slot, o.created_at, o.payload,
       coalesce(x.state, CASE WHEN o.state NOT IN ('PENDING', 'CLAIMED') THEN o.state
                              WHEN l.cursor_tick IS NOT NULL
                                   AND (pg_visible_in_snapshot(coalesce(o.xid, 0)::text::xid8, tp.snap)
                                        OR (pg_visible_in_snapshot(coalesce(o.xid, 0)::text::xid8, tc.snap)
                                            AND o.seq <= l.cursor_seq))
                              THEN 'SENT' ELSE 'PENDING' END) AS state,
       coalesce(x.claim_version, 0) AS claim_version, x.claim_id, coalesce(x.attempts, 0) AS attempts,
       x.last_error, x.sent_at, x.resolved_by, x.available_at, o.xid
FROM ferry_outbox o
JOIN ferry_slot_lease l ON l.slot = o.shard_slot
LEFT JOIN ferry_tick tp ON tp.tick_id = l.cursor_tick - 1
LEFT JOIN ferry_tick tc ON tc.tick_id = l.cursor_tick
LEFT JOIN ferry_outbox_exception x ON x.seq = o.seq;
