#!/usr/bin/env python3
"""Compares windows of a `pg-sampler.py` file: what each part cost per second in each window.

Usage: benches/scripts/pg-sampler-diff.py SAMPLES.jsonl [--window MINUTES] [--top N]

The run is cut into windows of `--window` minutes (5 by default), from the first sample on. Per
window it prints CPU seconds per second by process group, the statements that took the most
execution time (ms per second, calls per second, ms per call, shared blocks read and hit per
call), database counters per second, and the tables' sizes at the window's end (the largest
table's indexes one by one). With a steady
`--rate`, a cost per second that grows from window to window is a cost per event that grows.
"""
import json
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def windows(samples, minutes):
    t0 = samples[0]["t"]
    cuts, k = [samples[0]], 1
    for s in samples[1:]:
        if s["t"] - t0 >= k * minutes * 60:
            cuts.append(s)
            k += 1
    if cuts[-1] is not samples[-1]:
        cuts.append(samples[-1])
    return list(zip(cuts, cuts[1:]))


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    minutes = float(args[args.index("--window") + 1]) if "--window" in args else 5.0
    top = int(args[args.index("--top") + 1]) if "--top" in args else 12
    samples = load(args[0])
    if len(samples) < 2:
        sys.exit("pg-sampler-diff: fewer than two samples")
    t0 = samples[0]["t"]
    for a, b in windows(samples, minutes):
        dt = b["t"] - a["t"]
        print(f"== {(a['t'] - t0) / 60:.1f}-{(b['t'] - t0) / 60:.1f} min (load {b['load']})")
        # per process: what it used since the earlier sample (all of it if it is new)
        cpu = {
            g: sum(c - a["cpu"].get(g, {}).get(p, 0.0) for p, c in procs.items()) / dt
            for g, procs in b["cpu"].items()
        }
        total = sum(cpu.values())
        print(f"  cpu s/s total {total:.3f}: " + ", ".join(
            f"{g} {v:.3f}" for g, v in sorted(cpu.items(), key=lambda x: -x[1]) if v >= 0.005))
        before = {s["id"]: s for s in a["statements"]}
        rows = []
        for s in b["statements"]:
            p = before.get(s["id"], {"calls": 0, "ms": 0.0, "rows": 0, "hit": 0, "read": 0})
            calls = s["calls"] - p["calls"]
            if calls <= 0:
                continue
            ms = s["ms"] - p["ms"]
            rows.append((ms / dt, calls / dt, ms / calls, (s["read"] - p["read"]) / calls,
                         (s["hit"] - p["hit"]) / calls, (s["rows"] - p["rows"]) / calls,
                         s["query"]))
        rows.sort(key=lambda r: -r[0])
        print(f"  statements: {sum(r[0] for r in rows):.1f} ms/s in all")
        for r in rows[:top]:
            print(f"    {r[0]:8.1f} ms/s {r[1]:8.1f}/s {r[2]:8.3f} ms/call read {r[3]:7.1f} "
                  f"hit {r[4]:8.1f} rows {r[5]:7.1f}  {r[6][:90]}")
        db = {k: (b["db"][k] - a["db"][k]) / dt for k in b["db"]}
        print("  db /s: " + ", ".join(f"{k} {v:.1f}" for k, v in db.items()))
        big = sorted(b["tables"].items(), key=lambda x: -(x[1]["heap"] + x[1]["index"]))[:8]
        print("  tables (MiB heap+index, dead): " + ", ".join(
            f"{n.split('.')[-1]} {t['heap'] / 2**20:.1f}+{t['index'] / 2**20:.1f} d{t['dead']}"
            for n, t in big))
        # the indexes of the largest table, each (older samples carry no `indexes`)
        own = b.get("indexes", {}).get(big[0][0], {}) if big else {}
        if own:
            print(f"  indexes of {big[0][0].split('.')[-1]} (MiB): " + ", ".join(
                f"{n} {v / 2**20:.1f}" for n, v in sorted(own.items())))

if __name__ == "__main__":
    main()
