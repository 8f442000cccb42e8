#!/usr/bin/env bash
# train.shard none / optimizer / gradients against PyTorch's DDP with AdamW whole on every rank
# and with ZeroRedundancyOptimizer (ZeRO stage 1; torch 1.13 has no CPU ZeRO-2: its FSDP needs
# CUDA), on the model and batch of bench/ddp/resnet18_w128_adamw.yaml (resnet18 width 128,
# AdamW, batch 4 per rank, STEPS steps), for each world size in WORLDS, one process per rank and
# one thread each, one contender after the other. Prints per world size and contender: peak
# resident memory per rank (the largest, the smallest, their spread), images/s of all ranks
# together over the steps after the first window (partrain: metrics.jsonl's step lines; the
# peer: the sum of its ranks' rates after its warm-up), the ratios to unsharded partrain and
# to the peer of the same setting, and partrain rank 0's memory breakdown (report.json's
# ranks[].memory). REPORT_ONLY=1 prints the tables again from the results in OUT.
#
#   OUT=/tmp/bench-shard WORLDS="2 4" STEPS=16 bench/ddp/shard.sh
set -euo pipefail
# shellcheck source=bench/ddp/common.sh
. "$(dirname "$0")/common.sh"
WORLDS=${WORLDS:-2 4}
STEPS=${STEPS:-16}
WARMUP=4  # the peer's steps before its clock starts
(( STEPS > WARMUP )) || { echo "shard.sh: STEPS ($STEPS) must be more than the peer's warm-up ($WARMUP)" >&2; exit 2; }
SHARD_CONFIG=$BENCH_DIR/resnet18_w128_adamw.yaml

if [[ ${REPORT_ONLY:-0} == 1 ]]; then
  OUT=${OUT:-/tmp/bench-ddp/shard}
else
prepare shard
for world in $WORLDS; do
  for shard in none optimizer gradients; do
    tag=partrain-$shard-w$world
    rm -rf "${OUT:?}/$tag"
    echo "== $tag" >&2
    OMP_NUM_THREADS=1 "$EXE" run "$SHARD_CONFIG" --nproc-per-node "$world" --output "$OUT/$tag" \
      --set "train.shard=$shard" --set "train.max_steps=$STEPS" > "$OUT/$tag.log" 2>&1 ||
      { tail -20 "$OUT/$tag.log" >&2; exit 1; }
    tail -1 "$OUT/$tag.log" >&2
    # The checkpoint is written (its memory is part of the peak) but not kept: about 0.6 GB a
    # run, 6 GB a whole bench, which once filled the disk under a later run.
    rm -rf "${OUT:?}/$tag/checkpoints"
  done
  for optimizer in adamw zero; do
    tag=torch-$optimizer-w$world
    echo "== $tag" >&2
    # torch 1.13's launcher on Python 3.11 crashes unless --redirects/--tee are given
    OMP_NUM_THREADS=1 "$PY" -m torch.distributed.launch --redirects 2 --tee 2 --nnodes=1 \
      --nproc_per_node="$world" --master_port "$(free_port)" "$PEER_DIR/zero_peer.py" \
      --optimizer "$optimizer" --steps "$STEPS" --warmup "$WARMUP" > "$OUT/$tag.log" 2>&1 ||
      { tail -20 "$OUT/$tag.log" >&2; exit 1; }
    grep -h '# summary' "$OUT/$tag.log" | sed 's/^.*# summary //' > "$OUT/$tag.json"
  done
done
finish
fi

"$PY" - "$OUT" "$WORLDS" <<'PY'
import json, statistics, sys
out, worlds = sys.argv[1], [int(w) for w in sys.argv[2].split()]
print(open(f"{out}/machine.txt").read().strip())

def partrain(tag):
    report = json.load(open(f"{out}/{tag}/report.json"))
    rates = [json.loads(l)["images_per_s"] for l in open(f"{out}/{tag}/metrics.jsonl")
             if '"type": "step"' in l or '"type":"step"' in l]
    peaks = [r["peak_rss_mb"] for r in report["ranks"]]
    return peaks, statistics.median(rates[1:] or rates), report["ranks"][0].get("memory")

def torch_peer(tag):
    summary = json.load(open(f"{out}/{tag}.json"))
    ranks = summary["ranks"]
    # Each rank's own images/s: the run's are their sum, as partrain's metrics count all ranks.
    return [r["peak_rss_mb"] for r in ranks], sum(r["images_per_s"] for r in ranks)

for world in worlds:
    rows = {f"partrain {s}": partrain(f"partrain-{s}-w{world}")[:2]
            for s in ["none", "optimizer", "gradients"]}
    rows["torch DDP + AdamW"] = torch_peer(f"torch-adamw-w{world}")
    rows["torch DDP + ZeroRedundancyOptimizer"] = torch_peer(f"torch-zero-w{world}")
    base_peak, base_rate = max(rows["partrain none"][0]), rows["partrain none"][1]
    peer_of = {"partrain none": "torch DDP + AdamW", "partrain optimizer":
               "torch DDP + ZeroRedundancyOptimizer", "partrain gradients":
               "torch DDP + ZeroRedundancyOptimizer"}
    print(f"\nW = {world}\n")
    print("| contender | peak RSS per rank, max (MiB) | min | spread | images/s | peak vs none | "
          "img/s vs none | peak vs torch | img/s vs torch |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for name, (peaks, rate) in rows.items():
        peer = rows.get(peer_of.get(name, ""))
        vs = (f"{max(peaks) / max(peer[0]):.2f} | {rate / peer[1]:.2f}" if peer else "| ")
        print(f"| {name} | {max(peaks):.0f} | {min(peaks):.0f} | "
              f"{100 * (max(peaks) - min(peaks)) / min(peaks):.1f}% | {rate:.1f} | "
              f"{max(peaks) / base_peak:.2f} | {rate / base_rate:.2f} | {vs} |")
    print("\npartrain rank 0's memory breakdown (MiB):\n")
    print("| train.shard | floor | data | parameters | gradients | optimizer state | "
          "communication | activations | unexplained | peak |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for s in ["none", "optimizer", "gradients"]:
        peaks, _, m = partrain(f"partrain-{s}-w{world}")
        print(f"| {s} | " + " | ".join(f"{m[k]:.0f}" for k in
              ["floor_mb", "data_mb", "parameters_mb", "gradients_mb", "optimizer_state_mb",
               "communication_mb", "activations_mb", "unexplained_mb"]) + f" | {peaks[0]:.0f} |")
PY
