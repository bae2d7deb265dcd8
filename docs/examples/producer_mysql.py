"""A producer in Python (PyMySQL, MariaDB 10.6+; MySQL is not supported): the business row and
its intent in one transaction, with a plain INSERT; ferry fills shard_slot, msg_key, event_id
and headers.

    ferry migrate --database-url mysql://root@127.0.0.1:3306/test
    pip install PyMySQL
    DATABASE_URL=mysql://root@127.0.0.1:3306/test python3 docs/examples/producer_mysql.py
"""
import json
import os
import sys
from urllib.parse import unquote, urlparse

import pymysql

CUSTOMERS = ["customer-7", "customer-8"]
VERSIONS = int(os.environ.get("VERSIONS", "5"))
# A binary payload (Avro, Protobuf, …): a Protobuf-like message with 0x00, invalid UTF-8 and 0xFF.
READING = bytes([0x08, 0x96, 0x01, 0x00, 0xC3, 0x28, 0xFF])


def connect() -> pymysql.connections.Connection:
    u = urlparse(os.environ["DATABASE_URL"])
    return pymysql.connect(
        host=u.hostname or "127.0.0.1",
        port=u.port or 3306,
        user=unquote(u.username or "root"),
        password=unquote(u.password or ""),
        database=u.path.lstrip("/"),
        autocommit=False,
    )


def main() -> None:
    conn = connect()
    with conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE IF NOT EXISTS demo_customers ("
            " customer_id VARCHAR(64) PRIMARY KEY, points BIGINT NOT NULL, version BIGINT NOT NULL)"
            " ENGINE = InnoDB"
        )
    conn.commit()
    for _ in range(VERSIONS):
        for customer in CUSTOMERS:
            with conn.cursor() as cur:
                # the business change under a row lock; its new version numbers the intent
                cur.execute(
                    "INSERT INTO demo_customers (customer_id, points, version) VALUES (%s, 10, 1) "
                    "ON DUPLICATE KEY UPDATE points = points + 10, version = version + 1",
                    (customer,),
                )
                cur.execute(
                    "SELECT version, points FROM demo_customers WHERE customer_id = %s FOR UPDATE",
                    (customer,),
                )
                version, points = cur.fetchone()
                cur.execute(
                    "INSERT INTO ferry_outbox (aggregate_id, aggregate_version, topic, event_type, payload) "
                    "VALUES (%s, %s, %s, %s, %s)",
                    (customer, version, "orders", "PointsAdded",
                     json.dumps({"customer_id": customer, "points": points})),
                )
            conn.commit()
    # bytes go in payload_bytes instead of payload (exactly one of the two), sent unchanged
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO ferry_outbox (aggregate_id, aggregate_version, topic, event_type, payload_bytes) "
            "VALUES (%s, %s, %s, %s, %s)",
            ("sensor-2", 1, "orders", "ReadingTaken", READING),
        )
    conn.commit()
    conn.close()
    print(f"committed {VERSIONS * len(CUSTOMERS) + 1} intents", file=sys.stderr)


if __name__ == "__main__":
    main()
