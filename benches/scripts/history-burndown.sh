#!/usr/bin/env bash
# Burn-down of N new intents on a PostgreSQL outbox that already holds H delivered intents, one
# `ferry relay --sink null`, timed from its start until `ferry_sent_total` reaches N.
# usage: benches/scripts/history-burndown.sh H N [label]     (H, N: multiples of 100,000)
#   AGAIN=1: keep the database of the previous run and add N more (H = what it holds already)
#   RELAY_LOG=info: the relay's log level (the log goes to $TMPDIR/ferry-history-relay-<label>.log)
# Needs a release build (cargo build --release -p ferry-cli), psql, curl and bc; it drops and
# creates the database ferry_hist on the local server (postgres://postgres@127.0.0.1:5432).
set -euo pipefail
H=$1; N=$2; LABEL=${3:-run}
ADMIN=postgres://postgres@127.0.0.1:5432/postgres
DB=ferry_hist
URL=postgres://postgres@127.0.0.1:5432/$DB
FERRY=${FERRY:-$(cd "$(dirname "$0")/../.." && pwd)/target/release/ferry}
AGGS=100000
AGAIN=${AGAIN:-0}
if [ "$AGAIN" = 0 ]; then
psql -q $ADMIN -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
$FERRY migrate --database-url $URL --log warn
psql -q -v ON_ERROR_STOP=1 $URL <<SQL
DROP INDEX IF EXISTS ferry_outbox_dispatch; DROP INDEX IF EXISTS ferry_outbox_unfinished;
CREATE TABLE aggs AS SELECT 'agg-'||g AS id, ferry_slot_for('agg-'||g) AS slot FROM generate_series(0, $AGGS - 1) g;
SQL
fi
fill() { # from_version to_version
  for v in $(seq $1 $2); do
    psql -q -v ON_ERROR_STOP=1 $URL -c "INSERT INTO ferry_outbox (event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key, event_type, payload)
      SELECT gen_random_uuid()::text, a.id, $v, a.slot, 'orders', a.id, 'OrderCreated',
             '{\"order\":' || $v || ',\"pad\":\"' || repeat('x', 180) || '\"}' FROM aggs a"
  done
}
t0=$(date +%s.%N)
HV=$((H / AGGS))
if [ "$AGAIN" = 0 ] && [ "$HV" -gt 0 ]; then fill 1 $HV; fi
if [ "$AGAIN" = 0 ]; then
# The history is delivered: cursor mode with tick 0 seeing every committed row, as a
# conversion does, every slot at the start of window 1.
psql -q -v ON_ERROR_STOP=1 $URL <<SQL
UPDATE ferry_dispatch SET mode = 'cursor';
INSERT INTO ferry_tick (tick_id, snap, seq_hi) SELECT 0, pg_current_snapshot(), coalesce(max(seq), 0) FROM ferry_outbox;
UPDATE ferry_slot_lease SET cursor_tick = 1, cursor_xid = 0, cursor_seq = 0, cursor_version = cursor_version + 1;
SQL
fi
t1=$(date +%s.%N)
NV=$((N / AGGS))
fill $((HV + 1)) $((HV + NV))
psql -q $URL -c "VACUUM ANALYZE" -c checkpoint
t2=$(date +%s.%N)
size=$(psql -qtA $URL -c "SELECT pg_size_pretty(pg_total_relation_size('ferry_outbox'))")
echo "[$LABEL] history $H filled+new $N in $(echo "$t2 - $t0" | bc) s; outbox $size; load $(cut -d' ' -f1-3 /proc/loadavg)"
$FERRY relay --database-url $URL --sink null --metrics-listen 127.0.0.1:39190 --log ${RELAY_LOG:-warn} >${TMPDIR:-/tmp}/ferry-history-relay-$LABEL.log 2>&1 &
rp=$!
s=$(date +%s.%N)
while true; do
  sent=$(curl -s 127.0.0.1:39190/metrics 2>/dev/null | awk '$1=="ferry_sent_total"{print $2}' || true)
  if [ -n "$sent" ] && [ "${sent%.*}" -ge "$N" ]; then break; fi
  sleep 0.1
done
e=$(date +%s.%N)
kill $rp; wait $rp 2>/dev/null || true
secs=$(echo "$e - $s" | bc)
echo "RESULT label=$LABEL history=$H n=$N drain_s=$secs ev_per_s=$(echo "$N / $secs" | bc) load=$(cut -d' ' -f1-3 /proc/loadavg)"
