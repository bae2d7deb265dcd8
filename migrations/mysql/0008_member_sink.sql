-- `ferry status` shows, for every live relay process, whether its sink is stalled: the time its
-- sink had gone without an ack while events were in flight, past its stall threshold, at its
-- last membership heartbeat (NULL: not stalled).
ALTER TABLE ferry_relay_member ADD COLUMN IF NOT EXISTS sink_stalled_us BIGINT NULL;
