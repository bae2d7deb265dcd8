-- A producer in plain SQL (SQLite): SQLite triggers cannot change the row being inserted, so
-- foreign producers insert into the view ferry_outbox_insert; its INSTEAD OF trigger fills
-- shard_slot, msg_key, event_id, headers and the timestamps and writes ferry_outbox in the same
-- transaction. BEGIN IMMEDIATE takes the write lock up front (no upgrade deadlock).
-- Run (after `ferry migrate --database-url sqlite://outbox.db`):
--   sqlite3 outbox.db < docs/examples/produce_sqlite.sql
-- Stop at the first error (the shell would otherwise go on and COMMIT the business row without
-- its intent), and wait for the write lock as ferry does instead of failing at once:
.bail on
.timeout 30000
CREATE TABLE IF NOT EXISTS demo_orders (
    order_id TEXT PRIMARY KEY,
    status   TEXT NOT NULL,
    version  INTEGER NOT NULL
);

BEGIN IMMEDIATE;
INSERT INTO demo_orders (order_id, status, version) VALUES ('order-1001', 'PLACED', 1);
INSERT INTO ferry_outbox_insert (aggregate_id, aggregate_version, topic, event_type, payload)
VALUES ('order-1001', 1, 'orders', 'OrderPlaced', '{"order_id":"order-1001","status":"PLACED"}');
COMMIT;

BEGIN IMMEDIATE;
UPDATE demo_orders SET status = 'PAID', version = version + 1 WHERE order_id = 'order-1001';
INSERT INTO ferry_outbox_insert (aggregate_id, aggregate_version, topic, event_type, payload)
SELECT order_id, version, 'orders', 'OrderPaid', json_object('order_id', order_id, 'status', status)
FROM demo_orders WHERE order_id = 'order-1001';
COMMIT;

-- A binary payload (Avro, Protobuf, …): a BLOB in payload (SQLite keeps it a BLOB) reaches Kafka
-- unchanged. Here a Protobuf-like message with 0x00, invalid UTF-8 and 0xFF in it.
BEGIN IMMEDIATE;
INSERT INTO ferry_outbox_insert (aggregate_id, aggregate_version, topic, event_type, payload)
VALUES ('sensor-1', 1, 'orders', 'ReadingTaken', X'08960100C328FF');
COMMIT;
