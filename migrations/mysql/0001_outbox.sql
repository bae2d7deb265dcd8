-- ferry outbox schema, MariaDB 10.6+ (SKIP LOCKED); tested on 10.11. MySQL is not supported
-- (later migrations use MariaDB-only DDL).
CREATE TABLE IF NOT EXISTS ferry_outbox (
    seq               BIGINT       NOT NULL AUTO_INCREMENT,
    event_id          VARCHAR(255) NOT NULL,
    aggregate_id      VARCHAR(255) NOT NULL,
    aggregate_version BIGINT       NOT NULL,
    shard_slot        SMALLINT     NOT NULL,
    topic             VARCHAR(255) NOT NULL,
    msg_key           VARCHAR(255) NOT NULL,
    event_type        VARCHAR(255) NOT NULL,
    headers           TEXT         NOT NULL,
    payload           LONGTEXT     NOT NULL,
    created_at        DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    state             VARCHAR(16)  NOT NULL DEFAULT 'PENDING',
    available_at      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    claim_version     BIGINT       NOT NULL DEFAULT 0,
    claim_id          VARCHAR(64)  NULL,
    lease_until       DATETIME(6)  NULL,
    attempts          INT          NOT NULL DEFAULT 0,
    last_error        TEXT         NULL,
    sent_at           DATETIME(6)  NULL,
    resolved_by       VARCHAR(255) NULL,
    resolved_at       DATETIME(6)  NULL,
    PRIMARY KEY (seq),
    UNIQUE KEY ferry_outbox_event_id_key (event_id),
    UNIQUE KEY ferry_outbox_aggregate_version_key (aggregate_id, aggregate_version),
    -- no partial indexes here: leading with state keeps SENT rows out of the claim's range scans
    KEY ferry_outbox_dispatch (state, shard_slot, seq),
    KEY ferry_outbox_predecessor (aggregate_id, state, aggregate_version),
    KEY ferry_outbox_claim_id (claim_id),
    KEY ferry_outbox_sent_at (state, sent_at),
    CONSTRAINT ferry_outbox_version_check CHECK (aggregate_version >= 1),
    CONSTRAINT ferry_outbox_state_check CHECK (state IN ('PENDING', 'CLAIMED', 'SENT', 'QUARANTINED', 'SKIPPED'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS ferry_slot_lease (
    slot        SMALLINT     NOT NULL PRIMARY KEY,
    owner       VARCHAR(255) NULL,
    epoch       BIGINT       NOT NULL DEFAULT 0,
    lease_until DATETIME(6)  NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

INSERT IGNORE INTO ferry_slot_lease (slot)
    WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s WHERE n < 255) SELECT n FROM s;

CREATE TABLE IF NOT EXISTS ferry_relay_member (
    owner       VARCHAR(255) NOT NULL PRIMARY KEY,
    lease_until DATETIME(6)  NOT NULL,
    joined_at   DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TRIGGER IF NOT EXISTS ferry_outbox_immutable BEFORE UPDATE ON ferry_outbox FOR EACH ROW
IF NOT (NEW.event_id <=> OLD.event_id AND NEW.aggregate_id <=> OLD.aggregate_id
        AND NEW.aggregate_version <=> OLD.aggregate_version AND NEW.shard_slot <=> OLD.shard_slot
        AND NEW.topic <=> OLD.topic AND NEW.msg_key <=> OLD.msg_key
        AND NEW.event_type <=> OLD.event_type AND NEW.headers <=> OLD.headers
        AND NEW.payload <=> OLD.payload AND NEW.created_at <=> OLD.created_at) THEN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'ferry_outbox intent columns are immutable';
END IF;
