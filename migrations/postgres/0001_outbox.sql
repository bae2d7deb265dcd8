-- ferry outbox schema, PostgreSQL 13+ (tested on 15).
CREATE TABLE IF NOT EXISTS ferry_outbox (
    -- insertion sequence: primary key, claim order within a slot, reconciliation watermark
    seq               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- the immutable intent
    event_id          VARCHAR(255) NOT NULL,
    aggregate_id      VARCHAR(255) NOT NULL,
    aggregate_version BIGINT       NOT NULL CHECK (aggregate_version >= 1),
    shard_slot        SMALLINT     NOT NULL CHECK (shard_slot >= 0 AND shard_slot < 256),
    topic             VARCHAR(255) NOT NULL,
    msg_key           VARCHAR(255) NOT NULL,
    event_type        VARCHAR(255) NOT NULL,
    headers           TEXT         NOT NULL DEFAULT '{}',
    payload           TEXT         NOT NULL,
    created_at        TIMESTAMPTZ  NOT NULL DEFAULT now(),
    -- recoverable delivery state
    state             VARCHAR(16)  NOT NULL DEFAULT 'PENDING'
                      CHECK (state IN ('PENDING', 'CLAIMED', 'SENT', 'QUARANTINED', 'SKIPPED')),
    available_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    claim_version     BIGINT       NOT NULL DEFAULT 0,
    claim_id          VARCHAR(64),
    lease_until       TIMESTAMPTZ,
    attempts          INTEGER      NOT NULL DEFAULT 0,
    last_error        TEXT,
    sent_at           TIMESTAMPTZ,
    resolved_by       VARCHAR(255),
    resolved_at       TIMESTAMPTZ,
    CONSTRAINT ferry_outbox_event_id_key UNIQUE (event_id),
    CONSTRAINT ferry_outbox_aggregate_version_key UNIQUE (aggregate_id, aggregate_version)
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.05);

-- Dispatch index: unfinished rows only, in claim (seq) order. The claim walks it and filters the
-- worker's slots, stopping after B matches, so millions of SENT rows cost the claim nothing and a
-- backlog of 100k due rows costs ~B x (256 / slots owned) index entries. Measured (1M SENT +
-- 100k PENDING, B = 500): 11.3 ms for all 256 slots, 13.1 ms for 16 slots; a (shard_slot, seq)
-- index made the planner bitmap-scan and sort the whole backlog (40-200 ms). See docs/schema.md.
CREATE INDEX IF NOT EXISTS ferry_outbox_dispatch
    ON ferry_outbox (seq) WHERE state IN ('PENDING', 'CLAIMED');
-- Predecessor check: "does this aggregate have an unfinished lower version?" over unfinished rows only.
CREATE INDEX IF NOT EXISTS ferry_outbox_unfinished
    ON ferry_outbox (aggregate_id, aggregate_version) WHERE state IN ('PENDING', 'CLAIMED', 'QUARANTINED');
-- lookup_claim and claim-scoped CAS.
CREATE INDEX IF NOT EXISTS ferry_outbox_claim_id
    ON ferry_outbox (claim_id) WHERE state = 'CLAIMED';
-- Retention: purge walks SENT rows by age.
CREATE INDEX IF NOT EXISTS ferry_outbox_sent_at
    ON ferry_outbox (sent_at) WHERE state = 'SENT';

-- The intent is immutable: only delivery-state columns may change.
CREATE OR REPLACE FUNCTION ferry_outbox_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ferry_outbox intent columns are immutable (event %)', OLD.event_id
        USING ERRCODE = 'check_violation';
END $$;
DROP TRIGGER IF EXISTS ferry_outbox_immutable ON ferry_outbox;
CREATE TRIGGER ferry_outbox_immutable
    BEFORE UPDATE OF event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key,
                     event_type, headers, payload, created_at
    ON ferry_outbox FOR EACH ROW
    WHEN (OLD.event_id IS DISTINCT FROM NEW.event_id
          OR OLD.aggregate_id IS DISTINCT FROM NEW.aggregate_id
          OR OLD.aggregate_version IS DISTINCT FROM NEW.aggregate_version
          OR OLD.shard_slot IS DISTINCT FROM NEW.shard_slot
          OR OLD.topic IS DISTINCT FROM NEW.topic
          OR OLD.msg_key IS DISTINCT FROM NEW.msg_key
          OR OLD.event_type IS DISTINCT FROM NEW.event_type
          OR OLD.headers IS DISTINCT FROM NEW.headers
          OR OLD.payload IS DISTINCT FROM NEW.payload
          OR OLD.created_at IS DISTINCT FROM NEW.created_at)
    EXECUTE FUNCTION ferry_outbox_immutable();

-- Shard-slot leases: one row per logical slot, owned by at most one live relay process.
CREATE TABLE IF NOT EXISTS ferry_slot_lease (
    slot        SMALLINT PRIMARY KEY CHECK (slot >= 0 AND slot < 256),
    owner       VARCHAR(255),
    epoch       BIGINT NOT NULL DEFAULT 0,
    lease_until TIMESTAMPTZ
);
INSERT INTO ferry_slot_lease (slot) SELECT g FROM generate_series(0, 255) AS g ON CONFLICT DO NOTHING;

-- Relay membership, for slot rebalancing.
CREATE TABLE IF NOT EXISTS ferry_relay_member (
    owner       VARCHAR(255) PRIMARY KEY,
    lease_until TIMESTAMPTZ NOT NULL,
    joined_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Commit wake-ups: one NOTIFY per inserting statement, delivered at commit (coalesced per
-- transaction by PostgreSQL). Relays LISTEN and poll only as a fallback.
CREATE OR REPLACE FUNCTION ferry_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ferry_outbox', '');
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS ferry_outbox_notify ON ferry_outbox;
CREATE TRIGGER ferry_outbox_notify AFTER INSERT ON ferry_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION ferry_outbox_notify();
