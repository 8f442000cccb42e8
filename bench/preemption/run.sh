#!/usr/bin/env bash
# Preemption, measured side by side on CPU (2 ddp ranks, synthetic CIFAR-shaped data):
#   * SIGTERM to `partrain run` mid-epoch: seconds from the signal to the launcher's exit,
#     its exit code, and the size of the checkpoint it saved (DigitalNet, and resnet18);
#   * the cost of step checkpoints: images/s of the same run with checkpoint.every_steps off
#     and at EVERY (default 100), one after the other, and their ratio;
#   * the cost of the per-step exchange: images/s of this build against BASELINE (another
#     partrain executable without it, e.g. the main branch's), when given.
# Usage: bench/preemption/run.sh   (PARTRAIN: default build/partrain; OUT: scratch folder,
# default a fresh one under the system temp dir; EVERY; BASELINE)
set -u
P=${PARTRAIN:-build/partrain}
D=${OUT:-$(mktemp -d)}
EVERY=${EVERY:-100}
BASELINE=${BASELINE:-}
mkdir -p "$D"

config() {  # config MODEL WIDTH EPOCHS
  cat > "$D/$1.yaml" <<Y
name: preemption
device: cpu
strategy: ddp
seed: 1
launch: {nproc_per_node: 2}
comm: {backend: asio-ring, timeout_s: 30}
data: {dataset: synthetic, synthetic_train: 6000, synthetic_test: 500, batch_size: 32, num_workers: 1}
model: {name: $1, width: $2, norm: none}
train: {epochs: $3, threads: 1, log_every: 1}
checkpoint: {every_epochs: 1, keep: 2, resume: auto}
Y
}

images_per_s() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['images_per_s'])" "$1"; }

stop_timing() {  # stop_timing MODEL
  local log="$D/stop-$1.log" out="$D/stop-$1"
  rm -rf "$out"
  "$P" run "$D/$1.yaml" --output "$out" > "$log" 2>&1 &
  local launcher=$!
  for _ in $(seq 1200); do grep -q "epoch 1/.* step 6/" "$log" 2>/dev/null && break; sleep 0.05; done
  local t0
  t0=$(date +%s.%N)
  kill -TERM "$launcher"
  wait "$launcher"
  local rc=$?
  local took
  took=$(echo "$(date +%s.%N) - $t0" | bc)
  local file
  file=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['file'])" "$out/checkpoints/latest.json")
  echo "$1: SIGTERM -> exit $rc after $took s; $(grep 'partrain: stopped' "$log" | tail -1); checkpoint $file $(stat -c %s "$out/checkpoints/$file") bytes"
}

config digitalnet 32 1
config resnet18 16 1
stop_timing digitalnet
stop_timing resnet18

config digitalnet 32 2
"$P" run "$D/digitalnet.yaml" --output "$D/off" --set checkpoint.resume=never > "$D/off.log" 2>&1
"$P" run "$D/digitalnet.yaml" --output "$D/on" --set checkpoint.resume=never \
  --set "checkpoint.every_steps=$EVERY" > "$D/on.log" 2>&1
off=$(images_per_s "$D/off/report.json")
on=$(images_per_s "$D/on/report.json")
steps=0
for f in "$D"/on/checkpoints/*.step-*.pt; do [ -e "$f" ] && steps=$((steps + 1)); done
echo "digitalnet w32, 2 epochs: every_steps off $off img/s, every_steps=$EVERY $on img/s (ratio $(echo "scale=3; $on / $off" | bc); $steps step checkpoints kept of keep 2)"
if [ -n "$BASELINE" ]; then
  "$BASELINE" run "$D/digitalnet.yaml" --output "$D/base" --set checkpoint.resume=never > "$D/base.log" 2>&1
  base=$(images_per_s "$D/base/report.json")
  echo "digitalnet w32, 2 epochs: baseline $base img/s, this build (with the step exchange) $off img/s (ratio $(echo "scale=3; $off / $base" | bc))"
fi
