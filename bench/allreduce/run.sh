#!/usr/bin/env bash
# Runs `partrain bench allreduce` (asio-ring, gloo, asio-ring with a bf16 wire) and the Gloo
# peer benchmark (its ring_chunked, halving_doubling and bcube algorithms, built from
# bench/peers/collectives/gloo_bench.cc) one after the other in the same run, for W=2 and W=4,
# then prints a Markdown table of busbw and of the ratios asio-ring / Gloo's best.
#
# Usage: bench/allreduce/run.sh [BUILD_DIR] [SIZES] [WORLDS]
#   BUILD_DIR  holds the partrain executable (default: build)
#   SIZES      default 4K,64K,1M,16M,64M
#   WORLDS     default "2 4"
# Env: PEERS_DIR (default bench/peers/collectives), OUT (default BUILD_DIR/bench-allreduce),
#      ROUNDS (default 2: the whole sequence is repeated and each contender keeps its best
#      median, as the peer figures do; on a shared machine one round is mostly noise)
set -euo pipefail
source "$(dirname "$0")/common.sh"
allreduce_setup bench-allreduce "$@"

GLOO_BENCH=$OUT/gloo_bench
if [[ ! -x $GLOO_BENCH ]]; then
  g++ -O3 -march=native -std=c++17 -o "$GLOO_BENCH" "$PEERS_DIR/gloo_bench.cc" -lgloo -pthread
fi

for ((R=1; R<=ROUNDS; R++)); do
for W in $WORLDS; do
  echo "== round $R W=$W partrain (asio-ring, gloo)" >&2
  "$BUILD/partrain" bench allreduce --backend asio-ring,gloo --world "$W" --sizes "$SIZES" \
    --json "$OUT/partrain_w${W}_r$R.json" >&2
  echo "== round $R W=$W partrain (asio-ring, bf16 wire)" >&2
  "$BUILD/partrain" bench allreduce --backend asio-ring --wire-dtype bf16 --world "$W" \
    --sizes "$SIZES" --json "$OUT/partrain_bf16_w${W}_r$R.json" >&2
  for ALGO in ring_chunked halving_doubling bcube; do
    echo "== round $R W=$W gloo peer $ALGO" >&2
    "$PEERS_DIR/run_gloo.sh" "$GLOO_BENCH" "$W" "$ALGO" "$BYTES" > "$OUT/gloo_${ALGO}_w${W}_r$R.txt"
    cat "$OUT/gloo_${ALGO}_w${W}_r$R.txt" >&2
  done
done
done
note_load_after
python3 "$ROOT/bench/allreduce/compare.py" "$OUT" "$WORLDS"
