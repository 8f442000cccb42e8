#!/usr/bin/env bash
# What the breakdown and the trace cost: the same 2-rank CPU run (cifar100_synth_w16.yaml)
# with an executable built without them (BASE_PARTRAIN, e.g. the main branch's build), with
# this build as it always runs (breakdown and straggler measured, no trace), and with
# --trace (steps 10..29 traced and written to trace.json). The contenders alternate within
# each repetition. Prints per contender training images/s (median over runs of the median of
# epochs 2..N), the ratio to the build without them, and what `partrain explain` says of the
# last traced run.
#
#   BASE_PARTRAIN=/path/to/other/build/partrain OUT=/tmp/bench-observe REPS=3 bench/ddp/observe.sh
set -euo pipefail
# shellcheck source=bench/ddp/common.sh
. "$(dirname "$0")/common.sh"
prepare observe
REPS=${REPS:-3}
[[ -x ${BASE_PARTRAIN:-} ]] || { echo "set BASE_PARTRAIN to a partrain built without the breakdown" >&2; exit 1; }
OBSERVE_EXE=$EXE
BASE_EXE=$OUT/partrain-base
cp "$BASE_PARTRAIN" "$BASE_EXE"

for rep in $(seq 1 "$REPS"); do
  EXE=$BASE_EXE run_partrain "base-$rep" 2
  EXE=$OBSERVE_EXE run_partrain "breakdown-$rep" 2
  EXE=$OBSERVE_EXE run_partrain "trace-$rep" 2 --trace
done
finish

"$PY" - "$OUT" "$REPS" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
rows = {}
for name in ["base", "breakdown", "trace"]:
    rates = []
    for rep in range(1, reps + 1):
        epochs = json.load(open(f"{out}/{name}-{rep}/report.json"))["epochs"]
        rates.append(statistics.median(e["train_images_per_s"] for e in epochs[1:] or epochs))
    rows[name] = (statistics.median(rates), rates)
print(open(f"{out}/machine.txt").read().strip())
print()
print("| contender | train img/s | per run | vs base |")
print("|---|--:|---|--:|")
for name, (rate, rates) in rows.items():
    print(f"| {name} | {rate:.0f} | {', '.join(f'{r:.0f}' for r in rates)} | {rate / rows['base'][0]:.3f}x |")
PY
echo
echo "\$ partrain explain trace-$REPS/report.json --trace trace-$REPS/trace.json"
"$OBSERVE_EXE" explain "$OUT/trace-$REPS/report.json" --trace "$OUT/trace-$REPS/trace.json"
