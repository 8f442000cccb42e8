#!/usr/bin/env bash
# Real data: partrain on Fashion-MNIST, 2 ranks on CPU (bench/ddp/fashion_mnist_w16.yaml:
# DigitalNet width 16, batch 128 per rank, 3 epochs, Gloo), then the Python DDP peer with the
# same settings (PEER=1), and a table of test accuracy per epoch for both.
#
# Usage: bench/ddp/fashion_mnist.sh   Env: PEER (default 0; 1 also runs the peer), EPOCHS
#        (default 3), FMNIST_DIR (default /usr/share/datasets/fashion-mnist), OUT (default
#        /tmp/bench-ddp/fashion_mnist), see common.sh
source "$(dirname "$0")/common.sh"
PEER=${PEER:-0}
EPOCHS=${EPOCHS:-3}
FMNIST_DIR=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
CONFIG=$BENCH_DIR/fashion_mnist_w16.yaml
prepare fashion_mnist
echo "benchmark: fashion_mnist epochs=$EPOCHS" >> "$OUT/machine.txt"

# run_partrain points data.root at the synthetic CIFAR files; a later --set wins.
run_partrain partrain__fmnist__r1 2 --set data.root="$FMNIST_DIR" --set train.epochs="$EPOCHS"
if [[ $PEER == 1 ]]; then
  OMP_NUM_THREADS=1 "$PY" -m torch.distributed.launch --redirects 2 --tee 2 --nnodes=1 \
    --nproc_per_node=2 --master_port "$(free_port)" "$PEER_DIR/ddp_peer.py" \
    --dataset fashion-mnist --data-dir "$FMNIST_DIR" --width 16 --batch-size 128 --threads 1 \
    --num-workers 0 --epochs "$EPOCHS" --seed 0 > "$OUT/peer-torchvision__fmnist__r1.log" 2>&1
  grep '# summary' "$OUT/peer-torchvision__fmnist__r1.log" >&2
fi
finish
"$PY" "$BENCH_DIR/summarize.py" curve "$OUT" | tee "$OUT/summary.md"
