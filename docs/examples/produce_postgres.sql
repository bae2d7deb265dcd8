-- A producer in plain SQL (PostgreSQL): the business row and its intent in one transaction.
-- ferry fills shard_slot and event_id, a msg_key left out is the aggregate id; headers default to
-- '{}', created_at to now().
-- Run (after `ferry migrate --database-url "$DATABASE_URL"`):
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f docs/examples/produce_postgres.sql
CREATE TABLE IF NOT EXISTS demo_orders (
    order_id TEXT PRIMARY KEY,
    status   TEXT NOT NULL,
    version  BIGINT NOT NULL
);

BEGIN;
INSERT INTO demo_orders (order_id, status, version) VALUES ('order-1001', 'PLACED', 1);
INSERT INTO ferry_outbox (aggregate_id, aggregate_version, topic, event_type, payload)
VALUES ('order-1001', 1, 'orders', 'OrderPlaced', '{"order_id":"order-1001","status":"PLACED"}');
COMMIT;

-- The next version reads the current one (here: in the UPDATE), so it commits after it.
BEGIN;
WITH o AS (UPDATE demo_orders SET status = 'PAID', version = version + 1
           WHERE order_id = 'order-1001' RETURNING order_id, status, version)
INSERT INTO ferry_outbox (aggregate_id, aggregate_version, topic, event_type, payload)
SELECT order_id, version, 'orders', 'OrderPaid', json_build_object('order_id', order_id, 'status', status)::text FROM o;
COMMIT;

BEGIN;
WITH o AS (UPDATE demo_orders SET status = 'SHIPPED', version = version + 1
           WHERE order_id = 'order-1001' RETURNING order_id, status, version)
INSERT INTO ferry_outbox (aggregate_id, aggregate_version, topic, event_type, payload, headers)
SELECT order_id, version, 'orders', 'OrderShipped', json_build_object('order_id', order_id, 'status', status)::text,
       '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}' FROM o;
COMMIT;

-- A binary payload (Avro, Protobuf, …): bytes go in payload_bytes instead of payload (exactly one
-- of the two) and reach Kafka unchanged. Here a Protobuf-like message with 0x00, invalid UTF-8
-- and 0xFF in it.
BEGIN;
INSERT INTO ferry_outbox (aggregate_id, aggregate_version, topic, event_type, payload_bytes)
VALUES ('sensor-1', 1, 'orders', 'ReadingTaken', decode('08960100c328ff', 'hex'));
COMMIT;
