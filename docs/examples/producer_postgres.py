"""A producer in Python (psycopg 3, PostgreSQL): the business row and its intent in one
transaction, with a plain INSERT; ferry fills shard_slot and event_id (a msg_key left out is the
aggregate id).

    ferry migrate --database-url postgres://postgres@127.0.0.1:5432/test
    pip install "psycopg[binary]"
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test python3 docs/examples/producer_postgres.py
"""
import json
import os
import sys

import psycopg

CUSTOMERS = ["customer-7", "customer-8"]
VERSIONS = int(os.environ.get("VERSIONS", "5"))
# A binary payload (Avro, Protobuf, …): a Protobuf-like message with 0x00, invalid UTF-8 and 0xFF.
READING = bytes([0x08, 0x96, 0x01, 0x00, 0xC3, 0x28, 0xFF])


def main() -> None:
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS demo_customers ("
            " customer_id TEXT PRIMARY KEY, points BIGINT NOT NULL, version BIGINT NOT NULL)"
        )
        conn.commit()
        for _ in range(VERSIONS):
            for customer in CUSTOMERS:
                with conn.transaction():
                    # the business change; its new version numbers the intent
                    version, points = conn.execute(
                        "INSERT INTO demo_customers (customer_id, points, version) VALUES (%s, 10, 1) "
                        "ON CONFLICT (customer_id) DO UPDATE "
                        "SET points = demo_customers.points + 10, version = demo_customers.version + 1 "
                        "RETURNING version, points",
                        (customer,),
                    ).fetchone()
                    conn.execute(
                        "INSERT INTO ferry_outbox (aggregate_id, aggregate_version, topic, event_type, payload) "
                        "VALUES (%s, %s, %s, %s, %s)",
                        (customer, version, "orders", "PointsAdded",
                         json.dumps({"customer_id": customer, "points": points})),
                    )
        # bytes go in payload_bytes instead of payload (exactly one of the two), sent unchanged
        with conn.transaction():
            conn.execute(
                "INSERT INTO ferry_outbox (aggregate_id, aggregate_version, topic, event_type, payload_bytes) "
                "VALUES (%s, %s, %s, %s, %s)",
                ("sensor-2", 1, "orders", "ReadingTaken", READING),
            )
    print(f"committed {VERSIONS * len(CUSTOMERS) + 1} intents", file=sys.stderr)


if __name__ == "__main__":
    main()
