#!/usr/bin/env bash
# Usage: bash benches/peers/run-pg-boss.sh [N=200000]   (from the repository root; any directory works)
#        burn-down of N no-op jobs (one queue, batch insert, batched fetch)
# Env: PGBOSS_BATCH (500) PGBOSS_LOCAL_CONC (4) PGBOSS_INSERT_BATCH (10000), PG* as in lib/common.sh
source "$(dirname "$0")/lib/common.sh"
ensure_pg_running; ensure_db
ensure_node
ensure_npm "pg-boss@$PGBOSS_VERSION" "pg@$PG_VERSION_NPM"
log "pg-boss $(npm_version pg-boss), node $(node --version), load $(loadavg)"
psql -qAtc "set client_min_messages=warning; drop schema if exists pgboss cascade;"
cd "$NODE_DIR"
exec timeout 180 node pgboss.mjs burndown "${1:-200000}"
