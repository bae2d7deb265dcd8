#!/usr/bin/env python3
"""Samples where a long PostgreSQL run spends its time, once per interval, as JSON lines.

Usage: benches/scripts/pg-sampler.py DATABASE_URL OUT.jsonl [--every SECONDS] [--pid PID]

Each line holds, at one instant:
- `cpu`: CPU seconds so far of each thread of the watched process (`--pid`, e.g. loadgen's),
  grouped by thread name, and of each PostgreSQL process, grouped by `application_name` (client
  backends) or `backend_type` (checkpointer, walwriter, ...), read from /proc;
- `statements`: pg_stat_statements' counters per statement (calls, total_exec_time, rows,
  shared blocks hit and read), when the extension is installed in the database;
- `tables`: per table of every non-system schema its heap and index bytes, live and dead
  tuples, sequential scans and the tuples they read, index scans;
- `indexes`: per table, the bytes of each of its indexes;
- `db`: pg_stat_database's block and transaction counters, pg_stat_bgwriter's;
- `load`: /proc/loadavg.

Differences between two lines are the cost of the interval between them: `pg-sampler-diff.py`
prints them per event. It reads with `psql`, so the URL's credentials never appear in its output.
"""
import argparse
import json
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def psql(url, sql):
    out = subprocess.run(
        ["psql", url, "-XAt", "-F", "\t", "-c", sql],
        check=True, capture_output=True, text=True,
    ).stdout
    return [line.split("\t") for line in out.splitlines() if line]


def cpu_of(path):
    try:
        with open(path) as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def comm_of(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def thread_group(name):
    # tokio-runtime-worker, rdk:broker1, ... : drop the digits so one group a kind
    return "".join(c for c in name if not c.isdigit())


def sample(url, pid):
    # per group, per process (thread): CPU seconds so far; a difference is taken per process,
    # so connections that close and reopen between two samples do not count backwards
    cpu = {}
    if pid and os.path.isdir(f"/proc/{pid}/task"):
        for tid in os.listdir(f"/proc/{pid}/task"):
            c = cpu_of(f"/proc/{pid}/task/{tid}/stat")
            if c is not None:
                g = "loadgen:" + thread_group(comm_of(f"/proc/{pid}/task/{tid}/comm"))
                cpu.setdefault(g, {})[tid] = c
    for p, app, btype in psql(
        url, "SELECT pid, coalesce(application_name, ''), backend_type FROM pg_stat_activity"
    ):
        c = cpu_of(f"/proc/{p}/stat")
        if c is None:
            continue
        g = "pg:" + (app if btype == "client backend" and app else btype)
        cpu.setdefault(g, {})[p] = c
    statements = []
    try:
        rows = psql(
            url,
            "SELECT queryid, calls, total_exec_time, rows, shared_blks_hit, shared_blks_read, "
            "left(regexp_replace(query, '\\s+', ' ', 'g'), 160) FROM pg_stat_statements",
        )
    except subprocess.CalledProcessError:
        rows = []  # the extension is not installed, or its library not loaded
    if rows:
        for row in rows:
            statements.append(
                {
                    "id": row[0], "calls": int(row[1]), "ms": float(row[2]), "rows": int(row[3]),
                    "hit": int(row[4]), "read": int(row[5]), "query": row[6],
                }
            )
    tables = {}
    for row in psql(
        url,
        "SELECT schemaname || '.' || relname, pg_relation_size(relid), pg_indexes_size(relid), "
        "n_live_tup, n_dead_tup, seq_scan, coalesce(seq_tup_read, 0), coalesce(idx_scan, 0) "
        "FROM pg_stat_user_tables",
    ):
        tables[row[0]] = {
            "heap": int(row[1]), "index": int(row[2]), "live": int(row[3]), "dead": int(row[4]),
            "seq_scan": int(row[5]), "seq_read": int(row[6]), "idx_scan": int(row[7]),
        }
    indexes = {}
    for row in psql(
        url,
        "SELECT schemaname || '.' || relname, indexrelname, pg_relation_size(indexrelid) "
        "FROM pg_stat_user_indexes",
    ):
        indexes.setdefault(row[0], {})[row[1]] = int(row[2])
    d = psql(
        url,
        "SELECT xact_commit, xact_rollback, blks_read, blks_hit, tup_inserted, tup_updated, "
        "tup_deleted, temp_bytes FROM pg_stat_database WHERE datname = current_database()",
    )[0]
    b = psql(
        url,
        "SELECT checkpoints_timed, checkpoints_req, buffers_checkpoint, buffers_clean, "
        "buffers_backend, buffers_backend_fsync, buffers_alloc FROM pg_stat_bgwriter",
    )[0]
    db = dict(zip(
        ["xact_commit", "xact_rollback", "blks_read", "blks_hit", "tup_inserted", "tup_updated",
         "tup_deleted", "temp_bytes"], map(int, d),
    ))
    db.update(zip(
        ["checkpoints_timed", "checkpoints_req", "buffers_checkpoint", "buffers_clean",
         "buffers_backend", "buffers_backend_fsync", "buffers_alloc"], map(int, b),
    ))
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    return {"t": time.time(), "cpu": cpu, "statements": statements, "tables": tables,
            "indexes": indexes, "db": db,
            "load": float(load)}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="See the module docstring (head of this file) for what each line holds.")
    parser.add_argument("database_url")
    parser.add_argument("out", metavar="OUT.jsonl")
    parser.add_argument("--every", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument("--pid", type=int, help="the process whose threads' CPU is sampled")
    args = parser.parse_args()
    if args.out.startswith("-"):
        parser.error(f"OUT.jsonl {args.out!r} looks like a flag: give the output file second")
    if args.every <= 0:
        parser.error("--every must be positive")
    url, every, pid = args.database_url, args.every, args.pid
    with open(args.out, "a") as f:
        while True:
            t0 = time.time()
            try:
                f.write(json.dumps(sample(url, pid)) + "\n")
                f.flush()
            except (subprocess.CalledProcessError, OSError, IndexError) as e:
                print(f"pg-sampler: sample failed: {e}", file=sys.stderr)
            while time.time() - t0 < every:
                if pid and not os.path.exists(f"/proc/{pid}"):
                    return
                time.sleep(min(1.0, max(0.0, every - (time.time() - t0))))


if __name__ == "__main__":
    main()
