-- A producer in plain SQL (MariaDB 10.6+; MySQL is not supported): the business row and its intent in one transaction.
-- ferry fills shard_slot, msg_key, event_id and headers; created_at defaults to UTC_TIMESTAMP(6).
-- Run (after `ferry migrate --database-url mysql://root@127.0.0.1:3306/DATABASE`):
--   mysql -h 127.0.0.1 -u root DATABASE < docs/examples/produce_mysql.sql
CREATE TABLE IF NOT EXISTS demo_orders (
    order_id VARCHAR(64) PRIMARY KEY,
    status   VARCHAR(16) NOT NULL,
    version  BIGINT NOT NULL
) ENGINE = InnoDB;

START TRANSACTION;
INSERT INTO demo_orders (order_id, status, version) VALUES ('order-1001', 'PLACED', 1);
INSERT INTO ferry_outbox (aggregate_id, aggregate_version, topic, event_type, payload)
VALUES ('order-1001', 1, 'orders', 'OrderPlaced', '{"order_id":"order-1001","status":"PLACED"}');
COMMIT;

-- The next version reads the current one under a row lock, so it commits after it.
START TRANSACTION;
SELECT version + 1 INTO @v FROM demo_orders WHERE order_id = 'order-1001' FOR UPDATE;
UPDATE demo_orders SET status = 'PAID', version = @v WHERE order_id = 'order-1001';
INSERT INTO ferry_outbox (aggregate_id, aggregate_version, topic, event_type, payload)
VALUES ('order-1001', @v, 'orders', 'OrderPaid', JSON_OBJECT('order_id', 'order-1001', 'status', 'PAID'));
COMMIT;

START TRANSACTION;
SELECT version + 1 INTO @v FROM demo_orders WHERE order_id = 'order-1001' FOR UPDATE;
UPDATE demo_orders SET status = 'SHIPPED', version = @v WHERE order_id = 'order-1001';
INSERT INTO ferry_outbox (aggregate_id, aggregate_version, topic, event_type, payload, headers)
VALUES ('order-1001', @v, 'orders', 'OrderShipped', JSON_OBJECT('order_id', 'order-1001', 'status', 'SHIPPED'),
        '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}');
COMMIT;

-- A binary payload (Avro, Protobuf, …): bytes go in payload_bytes instead of payload (exactly one
-- of the two) and reach Kafka unchanged. Here a Protobuf-like message with 0x00, invalid UTF-8
-- and 0xFF in it.
START TRANSACTION;
INSERT INTO ferry_outbox (aggregate_id, aggregate_version, topic, event_type, payload_bytes)
VALUES ('sensor-1', 1, 'orders', 'ReadingTaken', X'08960100C328FF');
COMMIT;
