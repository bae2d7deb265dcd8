"""A producer in Python (the standard library's sqlite3): the business row and its intent in one
transaction. SQLite triggers cannot change the row being inserted, so the intent goes into the
view ferry_outbox_insert, which fills shard_slot, msg_key, event_id, headers and the timestamps.

    ferry migrate --database-url sqlite://outbox.db
    DATABASE_PATH=outbox.db python3 docs/examples/producer_sqlite.py
"""
import json
import os
import sqlite3
import sys

CUSTOMERS = ["customer-7", "customer-8"]
VERSIONS = int(os.environ.get("VERSIONS", "5"))
# A binary payload (Avro, Protobuf, …): a Protobuf-like message with 0x00, invalid UTF-8 and 0xFF.
READING = bytes([0x08, 0x96, 0x01, 0x00, 0xC3, 0x28, 0xFF])


def main() -> None:
    # autocommit mode, so that BEGIN IMMEDIATE below takes the write lock up front
    conn = sqlite3.connect(os.environ["DATABASE_PATH"], isolation_level=None, timeout=30)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS demo_customers ("
        " customer_id TEXT PRIMARY KEY, points INTEGER NOT NULL, version INTEGER NOT NULL)"
    )
    for _ in range(VERSIONS):
        for customer in CUSTOMERS:
            conn.execute("BEGIN IMMEDIATE")
            try:
                version, points = conn.execute(
                    "INSERT INTO demo_customers (customer_id, points, version) VALUES (?, 10, 1) "
                    "ON CONFLICT (customer_id) DO UPDATE "
                    "SET points = points + 10, version = version + 1 RETURNING version, points",
                    (customer,),
                ).fetchone()
                conn.execute(
                    "INSERT INTO ferry_outbox_insert (aggregate_id, aggregate_version, topic, event_type, payload) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (customer, version, "orders", "PointsAdded",
                     json.dumps({"customer_id": customer, "points": points})),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
    # bytes (a Python bytes value is stored as a BLOB, which SQLite keeps a BLOB in payload)
    # are sent unchanged; one statement in autocommit mode is its own transaction
    conn.execute(
        "INSERT INTO ferry_outbox_insert (aggregate_id, aggregate_version, topic, event_type, payload) "
        "VALUES (?, ?, ?, ?, ?)",
        ("sensor-2", 1, "orders", "ReadingTaken", READING),
    )
    conn.close()
    print(f"committed {VERSIONS * len(CUSTOMERS) + 1} intents", file=sys.stderr)


if __name__ == "__main__":
    main()
