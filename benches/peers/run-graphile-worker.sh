#!/usr/bin/env bash
# Usage (from the repository root; any directory works):
#        bash benches/peers/run-graphile-worker.sh [N=200000]                 burn-down of N no-op jobs
#        bash benches/peers/run-graphile-worker.sh steady RATE [SECS=20] [PRODUCER_CONNS=8]
# Env: GW_CONCURRENCY (24) GW_POOL (25) GW_LOCALQ (500) GW_COMPLETE_DELAY (0) GW_ADD_BATCH (20000)
#      PGHOST/PGPORT/PGUSER/PGPASSWORD/PGDATABASE (127.0.0.1/5432/peers/peers/peers)
source "$(dirname "$0")/lib/common.sh"
ensure_pg_running; ensure_db
ensure_node
ensure_npm "graphile-worker@$GW_VERSION" "pg@$PG_VERSION_NPM"
log "graphile-worker $(npm_version graphile-worker), node $(node --version), load $(loadavg)"
# reset: drop the schema; the worker re-runs its migrations (outside the timed part)
psql -qAtc "set client_min_messages=warning; drop schema if exists graphile_worker cascade; drop table if exists peers_orders;"
cd "$NODE_DIR"
if [ "${1:-}" = steady ]; then
  exec timeout 180 node gw.mjs steady "${2:-1000}" "${3:-20}" "${4:-8}"
else
  exec timeout 180 node gw.mjs burndown "${1:-200000}"
fi
