#!/usr/bin/env bash
# train.precision f32 against bf16 on the CPU: configs/fashion_mnist.yaml (Fashion-MNIST, 2
# ranks x 128, DigitalNet width 16, 3 epochs) run ROUNDS times with each precision, the two
# alternating so that a change in the machine's load falls on both; then a table of each run's
# training images/s (report.json's images_per_s) and final test accuracy, and the ratio of the
# medians.
#
# Usage: bench/ddp/precision.sh   Env: ROUNDS (default 2), EPOCHS (default 3), OUT (default
#        /tmp/bench-ddp/precision), see common.sh
source "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-2}
EPOCHS=${EPOCHS:-3}
prepare precision
echo "benchmark: precision f32 vs bf16, configs/fashion_mnist.yaml, epochs=$EPOCHS, rounds=$ROUNDS" >> "$OUT/machine.txt"
for round in $(seq 1 "$ROUNDS"); do
  for precision in f32 bf16; do
    tag=$precision-r$round
    rm -rf "${OUT:?}/$tag"
    echo "== $tag" >&2
    "$EXE" run "$ROOT/configs/fashion_mnist.yaml" --set train.precision="$precision" \
      --set train.epochs="$EPOCHS" --output "$OUT/$tag" > "$OUT/$tag.log" 2>&1 ||
      { tail -20 "$OUT/$tag.log" >&2; exit 1; }
    tail -1 "$OUT/$tag.log" >&2
  done
done
finish
"$PY" - "$OUT" "$ROUNDS" <<'PY' | tee "$OUT/summary.md"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rate = {"f32": [], "bf16": []}
print("| run | precision | train images/s | final test accuracy |")
print("|---|---|--:|--:|")
for r in range(1, rounds + 1):
    for p in ("f32", "bf16"):
        rep = json.load(open(f"{out}/{p}-r{r}/report.json"))
        rate[p].append(rep["images_per_s"])
        print(f"| {r} | {p} | {rep['images_per_s']:.0f} | {100 * rep['final']['test_accuracy']:.2f} % |")
m32, m16 = statistics.median(rate["f32"]), statistics.median(rate["bf16"])
print(f"\nmedian images/s: f32 {m32:.0f}, bf16 {m16:.0f}; bf16 / f32 = {m16 / m32:.2f}x")
PY
