#!/usr/bin/env bash
# The steady-state run with retention on (docs/performance.md, "one hour at half capacity"):
# first the flat-out rate of this same configuration (retention, the business table folded, on
# PostgreSQL ANALYZE every minute), then the long run at half of it, on PostgreSQL with
# benches/scripts/pg-sampler.py beside it. Run it from the repository root on a quiet machine
# (nothing compiling), after `cargo build --release -p loadgen`.
#
# Usage: benches/scripts/steady-hour.sh [DURATION=60m] [CAPACITY_RUN=5m] [OUT=steady-<time>]
# Environment: STORE (postgres, the default; mysql; sqlite: the embedded default), PG (default
# postgres://postgres@127.0.0.1:5432/test), MY (default mysql://root@127.0.0.1:3306/test),
# LOADGEN (default ./target/release/loadgen).
# Output in OUT/: capacity.{txt,json}, run.{txt,json,err}; on PostgreSQL also samples.jsonl and
# windows.txt.
set -euo pipefail
STORE=${STORE:-postgres}
PG=${PG:-postgres://postgres@127.0.0.1:5432/test}
MY=${MY:-mysql://root@127.0.0.1:3306/test}
LOADGEN=${LOADGEN:-./target/release/loadgen}
duration=${1:-60m}
capacity_run=${2:-5m}
out=${3:-steady-$(date -u +%Y%m%dT%H%M)}
here=$(dirname "$0")
[ -x "$LOADGEN" ] || { echo "steady-hour: $LOADGEN not found: cargo build --release -p loadgen" >&2; exit 2; }
mkdir -p "$out"
case "$STORE" in
  postgres) common=(--store postgres --database-url "$PG" --retention 60s --fold-orders --pg-analyze-every 60s) ;;
  mysql) common=(--store mysql --database-url "$MY" --retention 60s --fold-orders) ;;
  sqlite) common=(--retention 60s --fold-orders) ;;
  *) echo "steady-hour: STORE must be postgres, mysql or sqlite, not '$STORE'" >&2; exit 2 ;;
esac
checkpoint() { if [ "$STORE" = postgres ]; then psql -X "$PG" -qc checkpoint; fi; }

echo "steady-hour: $(date -u +%H:%M:%S) $STORE, flat-out run of $capacity_run [load $(cut -d' ' -f1 /proc/loadavg)]"
checkpoint
"$LOADGEN" "${common[@]}" --duration "$capacity_run" --no-progress --json "$out/capacity.json" \
  > "$out/capacity.txt" 2>&1 || { tail -5 "$out/capacity.txt" >&2; exit 1; }
rate=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["sent_per_sec"] / 2))' "$out/capacity.json")
echo "steady-hour: flat out sent $((rate * 2))/s; running $duration at $rate/s"

checkpoint
echo "steady-hour: $(date -u +%H:%M:%S) start [load $(cut -d' ' -f1 /proc/loadavg)]"
"$LOADGEN" "${common[@]}" --duration "$duration" --rate "$rate" --report-interval 5m \
  --json "$out/run.json" > "$out/run.txt" 2> "$out/run.err" &
pid=$!
if [ "$STORE" = postgres ]; then
  python3 "$here/pg-sampler.py" "$PG" "$out/samples.jsonl" --every 60 --pid "$pid" 2> "$out/sampler.err" &
fi
status=0
wait "$pid" || status=$?
wait || true
if [ "$STORE" = postgres ]; then
  python3 "$here/pg-sampler-diff.py" "$out/samples.jsonl" --window 5 > "$out/windows.txt" || true
fi
echo "steady-hour: $(date -u +%H:%M:%S) done, loadgen exit $status"
grep -E "p99 first vs last|PASS|FAIL" "$out/run.txt" || true
exit "$status"
