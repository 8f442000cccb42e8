#!/usr/bin/env bash
# Scaling on this machine at the same global batch (256): 1 rank x batch 256 x 1 thread
# against 2 ranks x batch 128 x 1 thread each (DDP over Gloo), partrain and the Python DDP
# peer alternating in the same run. Efficiency = (2-rank img/s) / (2 x 1-rank img/s). The
# table splits partrain's step time into compute (forward, backward, optimizer), the wait
# for communication after backward, and the rest (loader wait, logging); memory bandwidth,
# which the two ranks share, is measured with the peers' membw probe (1 and 2 threads).
#
# Usage: bench/ddp/scaling.sh     Env: REPS (default 2), EPOCHS (default 3), OUT (default
#        /tmp/bench-ddp/scaling), MEMBW_SRC (default bench/peers/collectives/membw.cc)
source "$(dirname "$0")/common.sh"
REPS=${REPS:-2}
EPOCHS=${EPOCHS:-3}
MEMBW_SRC=${MEMBW_SRC:-$ROOT/bench/peers/collectives/membw.cc}
# Checked before the long runs: the bandwidth table is part of the result, not an extra.
[[ -f $MEMBW_SRC ]] || { echo "scaling.sh: no membw source at $MEMBW_SRC" >&2; exit 1; }
prepare scaling
echo "benchmark: scaling reps=$REPS epochs=$EPOCHS" >> "$OUT/machine.txt"

for ((r = 1; r <= REPS; r++)); do
  run_partrain "partrain__1x256__r$r" 1 --set data.batch_size=256 --set train.epochs="$EPOCHS" \
    --set data.num_workers=0 --set train.threads=1
  run_partrain "partrain__2x128__r$r" 2 --set data.batch_size=128 --set train.epochs="$EPOCHS" \
    --set data.num_workers=0 --set train.threads=1 --set comm.backend=gloo
  run_peer "peer-tensor__1x256__r$r" 1 --batch-size 256 --num-workers 0 --epochs "$EPOCHS" --data-mode tensor
  run_peer "peer-tensor__2x128__r$r" 2 --batch-size 128 --num-workers 0 --epochs "$EPOCHS" --data-mode tensor
done
finish
"$PY" "$BENCH_DIR/summarize.py" scaling "$OUT" | tee "$OUT/summary.md"

g++ -O3 -march=native -o "$OUT/membw" "$MEMBW_SRC"
echo
echo "Memory bandwidth (\`membw 64 20\`: 64 MiB buffers, 20 passes), one copy alone, then two at once:"
echo '```'
"$OUT/membw" 64 20 | tee "$OUT/membw_1.txt"
"$OUT/membw" 64 20 > "$OUT/membw_2a.txt" & a=$!
"$OUT/membw" 64 20 > "$OUT/membw_2b.txt" & b=$!
wait $a $b
cat "$OUT/membw_2a.txt" "$OUT/membw_2b.txt"
echo '```'
