# shellcheck shell=bash
# Sourced by the bench/allreduce scripts, after `set -euo pipefail`, with the script's own
# arguments: allreduce_setup OUT_NAME "$@" reads [BUILD_DIR] [SIZES] [WORLDS] and sets ROOT,
# BUILD, SIZES, WORLDS, BYTES (SIZES in bytes), PEERS_DIR, OUT (default BUILD_DIR/OUT_NAME)
# and ROUNDS, makes $OUT and notes the machine in $OUT/machine.txt; note_load_after appends
# the load at the end. bench/multinode/link.sh sources it for to_bytes.
# shellcheck disable=SC2034  # the variables are for the scripts that source this file
allreduce_setup() {
  local out_name=$1
  shift
  ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  BUILD=$(cd "${1:-$ROOT/build}" && pwd)
  SIZES=${2:-4K,64K,1M,16M,64M}
  WORLDS=${3:-"2 4"}
  PEERS_DIR=${PEERS_DIR:-$ROOT/bench/peers/collectives}
  OUT=${OUT:-$BUILD/$out_name}
  ROUNDS=${ROUNDS:-2}
  mkdir -p "$OUT"
  BYTES=$(to_bytes "$SIZES")
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -srm), $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "sizes: $SIZES  worlds: $WORLDS  rounds: $ROUNDS (best median of each kept)"
  } > "$OUT/machine.txt"
}

# to_bytes 4K,1M: the sizes in bytes, comma-separated.
to_bytes() {
  python3 -c '
import sys
units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
print(",".join(str(int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)) for s in sys.argv[1].split(",")))' "$1"
}

note_load_after() {
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
}
