#!/usr/bin/env bash
# What the breakdown, TensorBoard and the trace cost: the same 2-rank CPU run
# (cifar100_synth_w16.yaml) with an executable built without the breakdown (BASE_PARTRAIN, e.g.
# an older build; optional), with this build and TensorBoard off (`no_tensorboard`: breakdown,
# straggler and flight records measured), with this build as it always runs (`default`: the
# same and TensorBoard's event file), and with --trace (steps 10..29 traced and written to
# trace.json). The contenders alternate within each repetition. Prints per contender training
# images/s (median over runs of the median of epochs 2..N), the ratio to the first contender,
# and what `partrain explain` says of the last traced run.
#
#   OUT=/tmp/bench-observe REPS=3 bench/ddp/observe.sh
#   BASE_PARTRAIN=/path/to/other/build/partrain OUT=/tmp/bench-observe REPS=3 bench/ddp/observe.sh
set -euo pipefail
# shellcheck source=bench/ddp/common.sh
. "$(dirname "$0")/common.sh"
prepare observe
REPS=${REPS:-3}
OBSERVE_EXE=$EXE
contenders=(no_tensorboard default trace)
if [[ -n ${BASE_PARTRAIN:-} ]]; then
  [[ -x $BASE_PARTRAIN ]] || { echo "BASE_PARTRAIN=$BASE_PARTRAIN is not an executable" >&2; exit 1; }
  cp "$BASE_PARTRAIN" "$OUT/partrain-base"
  contenders=(base "${contenders[@]}")
fi

for rep in $(seq 1 "$REPS"); do
  for name in "${contenders[@]}"; do
    case $name in
      base) EXE=$OUT/partrain-base run_partrain "base-$rep" 2 ;;
      no_tensorboard) EXE=$OBSERVE_EXE run_partrain "$name-$rep" 2 --set observe.tensorboard=false ;;
      default) EXE=$OBSERVE_EXE run_partrain "$name-$rep" 2 ;;
      trace) EXE=$OBSERVE_EXE run_partrain "$name-$rep" 2 --trace ;;
    esac
  done
done
finish

"$PY" - "$OUT" "$REPS" "${contenders[@]}" <<'PY'
import json, statistics, sys
out, reps, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}
for name in names:
    rates = []
    for rep in range(1, reps + 1):
        epochs = json.load(open(f"{out}/{name}-{rep}/report.json"))["epochs"]
        rates.append(statistics.median(e["train_images_per_s"] for e in epochs[1:] or epochs))
    rows[name] = (statistics.median(rates), rates)
print(open(f"{out}/machine.txt").read().strip())
print()
print(f"| contender | train img/s | per run | vs {names[0]} |")
print("|---|--:|---|--:|")
for name, (rate, rates) in rows.items():
    print(f"| {name} | {rate:.0f} | {', '.join(f'{r:.0f}' for r in rates)} | {rate / rows[names[0]][0]:.3f}x |")
PY
echo
echo "\$ partrain explain trace-$REPS/report.json --trace trace-$REPS/trace.json"
"$OBSERVE_EXE" explain "$OUT/trace-$REPS/report.json" --trace "$OUT/trace-$REPS/trace.json"
