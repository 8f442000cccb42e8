#!/usr/bin/env bash
# partrain against PyTorch's Python DDP (the peer in bench/peers/python_ddp), same run:
# DigitalNet width 16, synthetic CIFAR-100 binary files (5000 train / 1000 test), 2 ranks x
# batch 128, 1 intra-op thread per rank, Gloo for both, num_workers 0 and 2. The contenders
# alternate within each repetition (and swap order every other repetition), so drifting load
# from other users of the machine hits both alike. Prints a Markdown table of medians and
# ratios; training images/s is the median of epochs >= 2 of each run, then the median over
# repetitions.
#
# The peer runs twice for num_workers 0: with its default --data-mode torchvision (the
# recipe: PIL + ToTensor + Normalize per sample) and --data-mode tensor (the whole set
# normalised once, its fastest form). partrain always decodes/normalises per batch.
#
# Usage: bench/ddp/vs_python_ddp.sh            Env: REPS (default 3), EPOCHS (default 3),
#        WORKERS (default "0 2"), OUT (default /tmp/bench-ddp/vs_python_ddp), see common.sh
source "$(dirname "$0")/common.sh"
REPS=${REPS:-3}
EPOCHS=${EPOCHS:-3}
WORKERS=${WORKERS:-"0 2"}
prepare vs_python_ddp
echo "benchmark: vs_python_ddp reps=$REPS epochs=$EPOCHS workers=$WORKERS" >> "$OUT/machine.txt"

for ((r = 1; r <= REPS; r++)); do
  for nw in $WORKERS; do
    contenders=(partrain peer-torchvision)
    [[ $nw == 0 ]] && contenders+=(peer-tensor)
    if (( r % 2 == 0 )); then mapfile -t contenders < <(printf '%s\n' "${contenders[@]}" | tac); fi
    for c in "${contenders[@]}"; do
      tag=${c}__nw${nw}__r$r
      case $c in
        partrain)
          run_partrain "$tag" 2 --set train.epochs="$EPOCHS" --set data.num_workers="$nw" \
            --set data.batch_size=128 --set train.threads=1 --set comm.backend=gloo ;;
        peer-*)
          run_peer "$tag" 2 --batch-size 128 --num-workers "$nw" --epochs "$EPOCHS" \
            --data-mode "${c#peer-}" ;;
      esac
    done
  done
done
finish
"$PY" "$BENCH_DIR/summarize.py" vs "$OUT" | tee "$OUT/summary.md"
