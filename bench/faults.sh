#!/usr/bin/env bash
# Faults in running jobs, timed: a rank killed, a rank frozen, a rank that never arrives.
set -u
P=${PARTRAIN:-build/partrain}
D=/tmp/faults; rm -rf $D; mkdir -p $D
cat > $D/cfg.yaml <<'Y'
name: faults
device: cpu
strategy: ddp
launch: {nproc_per_node: 2}
comm: {backend: asio-ring, timeout_s: 5}
data: {dataset: synthetic, synthetic_train: 1200, synthetic_test: 200, batch_size: 32, num_workers: 0}
model: {name: digitalnet, width: 8}
train: {epochs: 50, threads: 1, log_every: 1}
checkpoint: {every_epochs: 0, resume: never}
Y
for sig in KILL STOP; do
  $P run $D/cfg.yaml --output $D/out-$sig > $D/$sig.log 2>&1 &
  L=$!
  until grep -q "step" $D/$sig.log 2>/dev/null; do sleep 0.1; done
  sleep 1
  W=$(for p in $(pgrep -P $L); do tr '\0' '\n' < /proc/$p/environ | grep -qx RANK=1 && echo $p; done)
  t0=$(date +%s.%N); kill -$sig $W; wait $L; rc=$?; t1=$(date +%s.%N)
  echo "SIG$sig rank 1: exit $rc after $(echo "$t1 - $t0" | bc) s: $(grep 'partrain:' $D/$sig.log | tail -2 | tr '\n' ' ')"
done
t0=$(date +%s.%N)
RANK=0 WORLD_SIZE=2 PARTRAIN_RENDEZVOUS=file://$D/rdzv $P worker $D/cfg.yaml --set comm.timeout_s=5 > $D/absent.log 2>&1; rc=$?
t1=$(date +%s.%N)
echo "rank 1 never starts (timeout 5 s): exit $rc after $(echo "$t1 - $t0" | bc) s: $(tail -1 $D/absent.log)"
