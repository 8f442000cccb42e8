#!/usr/bin/env bash
# Runs `partrain bench rendezvous` (as ranks on the store server's host do, then with
# --remote-clock, as ranks on other hosts read its clock) and its peer, torch's TCPStore
# (torch_store.py), one after the other for each world size, then prints a Markdown table of
# seconds, store requests, the clock estimate's error and the ratio torch / partrain. The peer is run up to the first size it does not finish within
# LIMIT_S; past that it is not run again (a larger world would not finish either).
#
# Usage: bench/rendezvous/run.sh [BUILD_DIR] [WORLDS]
#   BUILD_DIR  holds the partrain executable (default: build)
#   WORLDS     default "256 1024 4096 16384 65536"
# Env: OUT (default BUILD_DIR/bench-rendezvous), LIMIT_S (default 300: the peer's bound and,
#      plus a margin, partrain's), PY (default /usr/bin/python3, the one with Debian's torch)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
WORLDS=${2:-"256 1024 4096 16384 65536"}
OUT=${OUT:-$BUILD/bench-rendezvous}
LIMIT_S=${LIMIT_S:-300}
PY=${PY:-/usr/bin/python3}
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.txt
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm), $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "memory: $(free -g | awk '/Mem:/ {print $2}') GiB; open files: soft $(ulimit -Sn), hard $(ulimit -Hn);" \
    "somaxconn $(cat /proc/sys/net/core/somaxconn); tcp_max_syn_backlog $(cat /proc/sys/net/ipv4/tcp_max_syn_backlog)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"

PEER=on
for W in $WORLDS; do
  echo "== W=$W partrain" >&2
  # A world this machine cannot hold is refused with exit 2 and a line naming the limit,
  # which the table shows. The outer bound is above the bench's own (twice the timeout and
  # 30 s when a rank fails), so its message, not this one's kill, ends a failed run.
  timeout $((2 * LIMIT_S + 90)) "$BUILD/partrain" bench rendezvous --world "$W" \
    --timeout-s "$LIMIT_S" --json "$OUT/partrain_w$W.json" > "$OUT/partrain_w$W.txt" 2>&1 || true
  cat "$OUT/partrain_w$W.txt" >&2
  echo "== W=$W partrain --remote-clock" >&2
  timeout $((2 * LIMIT_S + 90)) "$BUILD/partrain" bench rendezvous --world "$W" --remote-clock \
    --timeout-s "$LIMIT_S" --json "$OUT/partrain_remote_w$W.json" > "$OUT/partrain_remote_w$W.txt" 2>&1 || true
  cat "$OUT/partrain_remote_w$W.txt" >&2
  if [[ $PEER == on ]]; then
    echo "== W=$W torch TCPStore" >&2
    rc=0
    timeout $((LIMIT_S + 60)) "$PY" "$ROOT/bench/rendezvous/torch_store.py" --world "$W" \
      --limit-s "$LIMIT_S" --json "$OUT/torch_w$W.json" > "$OUT/torch_w$W.txt" 2>&1 || rc=$?
    cat "$OUT/torch_w$W.txt" >&2
    [[ $rc == 0 ]] || PEER=off
  fi
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
"$PY" "$ROOT/bench/rendezvous/summarize.py" "$OUT" "$WORLDS"
