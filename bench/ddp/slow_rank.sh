#!/usr/bin/env bash
# One rank slowed from outside: the 2-rank CPU run (cifar100_synth_w16.yaml) once as it is and
# once with rank 1's worker stopped for half of every period (SIGSTOP, then SIGCONT after
# SLOW_MS of every 2 x SLOW_MS), as a GPU shared with another job or a throttled laptop would
# be. SLOW_PERIOD_MS and SLOW_DUTY (per cent of the period stopped) set another cycle: rank 1
# away 60 ms of every 100 ms is SLOW_PERIOD_MS=100 SLOW_DUTY=60. Prints per contender training images/s over the run and over its last epoch (once
# data.balance auto has settled), the final train loss, the split at the end and report.json's
# straggler record, and what `partrain explain` says of each run.
#
# SLOW_MODE=share slows rank 1 another way: rank 0 runs alone on CPU 0, rank 1 on CPU 1 beside
# a busy loop of another process, so the kernel gives rank 1 about half of its CPU in time
# slices of a few milliseconds (a device shared with another job, evenly), instead of 50 ms
# stops that land in its computation or in its waits.
#
# A contender is NAME or NAME+slow; NAME is what the run sets with EXTRA_NAME (an
# environment variable holding `--set` arguments; unset: none), "+slow" throttles rank 1.
#
#   OUT=/tmp/bench-slow bench/ddp/slow_rank.sh
#   CONTENDERS="even even+slow" SLOW_MS=50 EPOCHS=3 bench/ddp/slow_rank.sh
#   # data.balance auto against even, both at the same global batch (2 x 128):
#   G="--set data.batch_size=null --set data.global_batch_size=256"
#   CONTENDERS="even even+slow auto auto+slow" EXTRA_even="$G" \
#     EXTRA_auto="$G --set data.balance=auto" bench/ddp/slow_rank.sh
#   # steps long beside the throttle's period (BENCHMARKS.md says why that matters):
#   G="--set data.batch_size=null --set data.global_batch_size=512 --set model.width=32"
#   EPOCHS=8 CONTENDERS="even even+slow auto auto+slow" EXTRA_even="$G" \
#     EXTRA_auto="$G --set data.balance=auto" bench/ddp/slow_rank.sh
set -euo pipefail
# shellcheck source=bench/ddp/common.sh
. "$(dirname "$0")/common.sh"
prepare slow_rank
CONTENDERS=${CONTENDERS:-even even+slow}
SLOW_MS=${SLOW_MS:-50}
SLOW_PERIOD_MS=${SLOW_PERIOD_MS:-$((2 * SLOW_MS))}
SLOW_DUTY=${SLOW_DUTY:-50}
SLOW_MODE=${SLOW_MODE:-stop}
EPOCHS=${EPOCHS:-3}
read -ra contenders <<< "$CONTENDERS"
case $SLOW_MODE in
  stop) how="rank 1 stopped $((SLOW_PERIOD_MS * SLOW_DUTY / 100)) ms of every ${SLOW_PERIOD_MS} ms" ;;
  share) how="rank 1 sharing CPU 1 with a busy loop, rank 0 alone on CPU 0" ;;
  *) echo "SLOW_MODE is stop or share, not $SLOW_MODE" >&2; exit 2 ;;
esac
echo "benchmark: slow rank, $how, epochs=$EPOCHS" >> "$OUT/machine.txt"

# worker_of LAUNCHER RANK: the pid of the launcher's child that runs RANK (its environment
# holds RANK=N), or nothing yet.
worker_of() {
  local launcher=$1 rank=$2 child
  for child in $(pgrep -P "$launcher"); do
    if tr '\0' '\n' < "/proc/$child/environ" 2>/dev/null | grep -qx "RANK=$rank"; then
      echo "$child"; return
    fi
  done
}

# throttle LAUNCHER: stops and continues rank 1 in a duty cycle while the launcher lives; at
# most 20 minutes (the bound of the loop), and it leaves the worker running.
throttle() {
  local launcher=$1 worker="" stopped running cycles=0 max_cycles
  stopped=$(awk "BEGIN { print $SLOW_PERIOD_MS * $SLOW_DUTY / 100 / 1000 }")
  running=$(awk "BEGIN { print $SLOW_PERIOD_MS * (100 - $SLOW_DUTY) / 100 / 1000 }")
  max_cycles=$((1200 * 1000 / SLOW_PERIOD_MS))
  while kill -0 "$launcher" 2>/dev/null && (( cycles++ < max_cycles )); do
    [[ -n $worker ]] || worker=$(worker_of "$launcher" 1)
    if [[ -n $worker ]]; then
      kill -STOP "$worker" 2>/dev/null || true
      sleep "$stopped"
      kill -CONT "$worker" 2>/dev/null || true
    fi
    sleep "$running"
  done
}

# share LAUNCHER: pins rank 0 to CPU 0 and rank 1 to CPU 1, with a busy loop on CPU 1, while
# the launcher lives; at most 20 minutes (the bound of the loop). The loop ends with it.
share() {
  local launcher=$1 w0="" w1="" hog="" ticks=0
  while kill -0 "$launcher" 2>/dev/null && (( ticks++ < 12000 )); do
    if [[ -z $hog ]]; then
      [[ -n $w0 ]] || w0=$(worker_of "$launcher" 0)
      [[ -n $w1 ]] || w1=$(worker_of "$launcher" 1)
      if [[ -n $w0 && -n $w1 ]]; then
        taskset -a -pc 0 "$w0" > /dev/null
        taskset -a -pc 1 "$w1" > /dev/null
        taskset -c 1 bash -c 'while :; do :; done' &
        hog=$!
      fi
    fi
    sleep 0.1
  done
  [[ -z $hog ]] || kill "$hog" 2>/dev/null || true
}

for contender in "${contenders[@]}"; do
  name=${contender%+slow}
  var=EXTRA_${name//[^A-Za-z0-9]/_}
  read -ra extra <<< "${!var:-}"
  rm -rf "${OUT:?}/$contender"
  echo "== $contender ${extra[*]}" >&2
  OMP_NUM_THREADS=1 "$EXE" run "$CONFIG" --output "$OUT/$contender" --set "data.root=$DATA" \
    --set train.epochs="$EPOCHS" "${extra[@]}" > "$OUT/$contender.log" 2>&1 &
  launcher=$!
  if [[ $contender == *+slow && $SLOW_MODE == share ]]; then
    share "$launcher" &
  elif [[ $contender == *+slow ]]; then
    throttle "$launcher" &
  fi
  thrott=$!
  wait "$launcher" || { tail -20 "$OUT/$contender.log" >&2; exit 1; }
  wait "$thrott" || true
  tail -1 "$OUT/$contender.log" >&2
done
finish

"$PY" - "$OUT" "${contenders[@]}" <<'PY' | tee "$OUT/summary.md"
import json, sys
out, contenders = sys.argv[1], sys.argv[2:]
print(open(f"{out}/machine.txt").read().strip())
print()
print("| contender | train images/s | vs first | last epoch images/s | vs first | final train loss "
      "| split at the end | straggler |")
print("|---|--:|--:|--:|--:|--:|---|---|")
first = first_last = None
for c in contenders:
    rep = json.load(open(f"{out}/{c}/report.json"))
    rate = rep["images_per_s"]
    last = rep["epochs"][-1]
    last_rate = last["images"] / last["train_seconds"]
    first = first or rate
    first_last = first_last or last_rate
    b = rep.get("balance")
    split = "per rank" if not b else ":".join(str(x) for x in b["shares"]) + (
        f" ({len(b['changes'])} changes)" if b["changes"] else "")
    s = rep.get("straggler")
    who = "none" if not s else (f"rank {s['rank']}, last at {s['steps_last']} of {s['steps']} steps, "
                                f"cost {s['seconds_cost']:.1f} s")
    print(f"| {c} | {rate:.0f} | {rate / first:.2f}x | {last_rate:.0f} | {last_rate / first_last:.2f}x "
          f"| {last['train_loss']:.4f} | {split} | {who} |")
PY
for contender in "${contenders[@]}"; do
  echo
  echo "\$ partrain explain $contender/report.json"
  "$EXE" explain "$OUT/$contender/report.json"
done
