#!/usr/bin/env bash
# What model.torchscript costs: the built-in DigitalNet (a LibTorch Sequential) against the
# same network written in Python (examples/digitalnet.py), saved with torch.jit.script and run
# by LibTorch's TorchScript interpreter. Same config, data, width, batch and seed for both
# (bench/ddp/cifar100_synth_w16.yaml: 2 ranks x batch 128, Gloo, one thread per rank); the two
# alternate within each repetition. Prints per contender the training images/s (median over
# runs of the median of epochs 2..N) and the ratio to the built-in model.
#
#   OUT=/tmp/bench-ts REPS=3 bench/ddp/torchscript.sh
set -euo pipefail
# shellcheck source=bench/ddp/common.sh
. "$(dirname "$0")/common.sh"
prepare torchscript
REPS=${REPS:-3}
MODEL=$OUT/digitalnet_w16.pt
"$PY" "$ROOT/examples/save_digitalnet.py" --out "$MODEL" --in-channels 3 --num-classes 100 \
  --width 16 >&2
echo "model: $MODEL, scripted by torch $("$PY" -c 'import torch; print(torch.__version__)')" >> "$OUT/machine.txt"

for rep in $(seq 1 "$REPS"); do
  run_partrain "builtin-$rep" 2
  run_partrain "torchscript-$rep" 2 --set model.name=null --set model.width=null \
    --set model.norm=null --set "model.torchscript=$MODEL"
done
finish

"$PY" - "$OUT" "$REPS" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
rows = {}
for name in ["builtin", "torchscript"]:
    rates = []
    for rep in range(1, reps + 1):
        epochs = json.load(open(f"{out}/{name}-{rep}/report.json"))["epochs"]
        rates.append(statistics.median(e["train_images_per_s"] for e in epochs[1:] or epochs))
    rows[name] = (statistics.median(rates), rates)
base = rows["builtin"][0]
print(open(f"{out}/machine.txt").read().strip())
print()
print("| model | train img/s (2 ranks) | per run | vs built-in |")
print("|---|--:|---|--:|")
for name, (rate, rates) in rows.items():
    print(f"| {name} | {rate:.0f} | {', '.join(f'{r:.0f}' for r in rates)} | {rate / base:.2f}x |")
PY
