#!/usr/bin/env bash
# A real Prometheus server scrapes a live relay and evaluates the shipped alert rules
# (docs/alerts/ferry.rules.yml); the stalled-sink alert is then read through its HTTP API.
# The relay runs on SQLite against a Kafka "broker" that accepts connections and never answers.
# Usage: .ci/prometheus-scrape.sh <prometheus binary> <ferry binary>
set -euo pipefail
PROM=$1 FERRY=$2
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# a listener that accepts (the kernel completes the handshake) and never reads or answers
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(64)
print(s.getsockname()[1], flush=True); time.sleep(3600)' > "$work/silent.port" &
pids+=($!)
for _ in $(seq 50); do [ -s "$work/silent.port" ] && break; sleep 0.1; done
silent=$(cat "$work/silent.port")
metrics=$(free_port) prom_port=$(free_port)
db="sqlite://$work/ferry.db"
"$FERRY" migrate --database-url "$db" >/dev/null
"$FERRY" enqueue --database-url "$db" --event '{"aggregate_id":"a","aggregate_version":1,"topic":"t","event_type":"E","payload":"{}"}' >/dev/null
FERRY_LOG=warn "$FERRY" relay --database-url "$db" --sink kafka --kafka-brokers "127.0.0.1:$silent" \
  --sink-stall 2s --metrics-listen "127.0.0.1:$metrics" --shutdown-timeout 1s 2> "$work/relay.log" &
pids+=($!)
cat > "$work/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $PWD/docs/alerts/ferry.rules.yml
scrape_configs:
  - job_name: ferry
    static_configs:
      - targets: ["127.0.0.1:$metrics"]
YML
"$PROM" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn 2> "$work/prometheus.log" &
pids+=($!)
query() { curl -fsS --get "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1"; }
# the alert goes pending once the stall passes 2 s (it fires after its `for: 1m`); 60 s at most
for _ in $(seq 60); do
  if out=$(query 'ALERTS{alertname="FerrySinkStalled"}' 2>/dev/null) && grep -q '"alertstate":"\(pending\|firing\)"' <<<"$out"; then
    up=$(query 'up{job="ferry"}')
    grep -q '"value":\[[0-9.]*,"1"\]' <<<"$up" || { echo "scrape target not up: $up" >&2; exit 1; }
    echo "prometheus: FerrySinkStalled is $(grep -o '"alertstate":"[a-z]*"' <<<"$out" | head -1) for the live relay"
    exit 0
  fi
  sleep 1
done
echo "FerrySinkStalled never went pending; last answer: ${out:-none}" >&2
echo "--- relay log" >&2; tail -20 "$work/relay.log" >&2
echo "--- prometheus log" >&2; tail -20 "$work/prometheus.log" >&2
exit 1
