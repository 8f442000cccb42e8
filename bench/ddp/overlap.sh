#!/usr/bin/env bash
# Overlap of the gradient allreduce with backward, 2 ranks x batch 128, DigitalNet width WIDTH
# (default 16) on synthetic CIFAR-100 (100 classes). For each backend (gloo, asio-ring) and bucket size
# (25 MB: the whole gradient in the first bucket, as PyTorch's DDP would put it; 0.1 MB:
# three buckets, so the first goes on the wire while autograd computes the rest) it reads
# from report.json the time each step waited after backward (ranks[].comm_wait_seconds /
# steps) and the time the communication thread spent in allreduce (comm_busy_seconds / steps),
# and compares both with `partrain bench allreduce` of the same bytes run alone, measured in
# the same run before and after the training runs. The Python DDP peer's --profile-steps
# breakdown (backward with and without its allreduce, a bare allreduce) runs alongside.
#
# Usage: bench/ddp/overlap.sh     Env: REPS (default 2), EPOCHS (default 3), BACKENDS
#        (default "gloo asio-ring"; e.g. "shm asio-ring"), BUCKETS (default "25 0.1"), WIDTH
#        (default 16), PEER (default 1: the Python peer's breakdown too, at width 16 only), OUT
#        (default /tmp/bench-ddp/overlap), see common.sh
# Backends alternate within each repetition, so that a change in the machine's load falls on
# all of them alike.
source "$(dirname "$0")/common.sh"
REPS=${REPS:-2}
EPOCHS=${EPOCHS:-3}
BACKENDS=${BACKENDS:-"gloo asio-ring"}
BUCKETS=${BUCKETS:-"25 0.1"}
WIDTH=${WIDTH:-16}
PEER=${PEER:-1}
prepare overlap

# DigitalNet(c, in, classes): four 3x3 convs without bias (in->c->2c->4c->8c), a BN (weight
# and bias) after each, and Linear(8c -> classes) with bias.
C=$WIDTH IN=3 CLASSES=100
PARAMS=$(( 9 * (IN * C + C * 2 * C + 2 * C * 4 * C + 4 * C * 8 * C) + 2 * (C + 2 * C + 4 * C + 8 * C) \
           + 8 * C * CLASSES + CLASSES ))
BYTES=$(( PARAMS * 4 ))
echo "benchmark: overlap reps=$REPS epochs=$EPOCHS params=$PARAMS gradient_bytes=$BYTES" >> "$OUT/machine.txt"
echo "DigitalNet width $C, $CLASSES classes: $PARAMS parameters, $BYTES gradient bytes" >&2

bench_alone() {
  "$EXE" bench allreduce --backend "$(echo "$BACKENDS" | tr -s ' ' ,)" --world 2 --sizes "$BYTES" \
    --iters 200 --json "$OUT/allreduce_$1.json" >&2
}
bench_alone before
for ((r = 1; r <= REPS; r++)); do
  for backend in $BACKENDS; do
    for mb in $BUCKETS; do
      run_partrain "partrain-${backend}__bucket${mb}mb__r$r" 2 --set comm.backend="$backend" \
        --set comm.bucket_mb="$mb" --set train.epochs="$EPOCHS" --set data.num_workers=0 \
        --set train.threads=1 --set model.width="$WIDTH"
    done
  done
  # The peer's own breakdown: forward, backward with and without DDP's allreduce, a bare
  # allreduce of the flat gradient (its --profile-steps), for the same model and batch.
  [[ $PEER == 1 && $WIDTH == 16 ]] || continue
  run_peer "peer-tensor__profile__r$r" 2 --batch-size 128 --num-workers 0 --epochs 1 \
    --data-mode tensor --profile-steps 15
done
bench_alone after
finish
"$PY" "$BENCH_DIR/summarize.py" overlap "$OUT" | tee "$OUT/summary.md"
