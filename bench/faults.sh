#!/usr/bin/env bash
# Faults in running jobs, timed: a rank killed, a rank frozen, a rank that never arrives.
# Prints one line each: what was done, the exit code, the seconds from the fault to the exit,
# and partrain's message. Usage: bench/faults.sh   (PARTRAIN: the executable, default
# build/partrain; OUT: scratch folder, default /tmp/partrain-faults)
set -u
P=${PARTRAIN:-build/partrain}
D=${OUT:-/tmp/partrain-faults}
rm -rf "$D"
mkdir -p "$D"
cat > "$D/cfg.yaml" <<'Y'
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

seconds_since() { echo "$(date +%s.%N) - $1" | bc; }

for sig in KILL STOP; do
  "$P" run "$D/cfg.yaml" --output "$D/out-$sig" > "$D/$sig.log" 2>&1 &
  launcher=$!
  for _ in $(seq 600); do grep -q "step" "$D/$sig.log" 2>/dev/null && break; sleep 0.1; done
  sleep 1
  victim=""
  for p in $(pgrep -P "$launcher"); do
    tr '\0' '\n' < "/proc/$p/environ" | grep -qx RANK=1 && victim=$p
  done
  [ -n "$victim" ] || { echo "SIG$sig: no rank 1 found"; kill "$launcher"; continue; }
  t0=$(date +%s.%N)
  kill "-$sig" "$victim"
  wait "$launcher"
  rc=$?
  echo "SIG$sig rank 1: exit $rc after $(seconds_since "$t0") s: $(grep 'partrain:' "$D/$sig.log" | tail -2 | tr '\n' ' ')"
done

t0=$(date +%s.%N)
RANK=0 WORLD_SIZE=2 PARTRAIN_RENDEZVOUS="file://$D/rdzv" "$P" worker "$D/cfg.yaml" > "$D/absent.log" 2>&1
rc=$?
echo "rank 1 never starts (timeout 5 s): exit $rc after $(seconds_since "$t0") s: $(tail -1 "$D/absent.log")"
