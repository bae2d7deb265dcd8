#!/usr/bin/env bash
# Usage: repeat.sh K <script> [args...]
#   e.g. (from the repository root)  benches/peers/repeat.sh 3 benches/peers/run-graphile-worker.sh 200000
# Runs the script K times (env passes through), keeps every RESULT line in $PEERS_LOG (default
# $HOME/.cache/ferry-peers/results.log) and prints one "MEDIAN ..." line: for every numeric field the median over
# the K runs, for text fields the distinct values joined by '|'. Load averages before/after are kept.
set -uo pipefail
K="$1"; shift
LOG="${PEERS_LOG:-$HOME/.cache/ferry-peers/results.log}"; mkdir -p "$(dirname "$LOG")"
tmp="$(mktemp)"
for i in $(seq 1 "$K"); do
  before="$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' '/')"
  line="$("$@" 2>>"${LOG%.log}.stderr" | grep '^RESULT' | tail -1)"
  [ -n "$line" ] || line="RESULT failed=yes cmd=\"$*\""
  line="$line load_before=$before date=$(date -u +%FT%TZ) env=\"$(env | grep -E '^(GW_|PTO_|PGBOSS_)' | tr '\n' ' ' | sed 's/ $//')\""
  echo "$line" | tee -a "$LOG" >&2
  echo "$line" >> "$tmp"
done
python3 - "$tmp" <<'PY'
import re, shlex, statistics, sys
rows = []
for l in open(sys.argv[1]):
    d = {}
    for tok in shlex.split(l.strip())[1:]:
        if '=' in tok: k, v = tok.split('=', 1); d[k] = v
    rows.append(d)
keys = []
for r in rows:
    for k in r:
        if k not in keys: keys.append(k)
out = []
for k in keys:
    vals = [r[k] for r in rows if k in r]
    try:
        nums = [float(v) for v in vals]
        m = statistics.median(nums)
        out.append(f"{k}={m:.1f}" if m != int(m) else f"{k}={int(m)}")
    except ValueError:
        distinct = list(dict.fromkeys(vals))
        s = '|'.join(distinct)
        out.append(f'{k}="{s}"' if ' ' in s else f"{k}={s}")
print('MEDIAN runs=%d ' % len(rows) + ' '.join(out))
PY
rm -f "$tmp"
