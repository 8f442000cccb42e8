#!/usr/bin/env bash
# partrain worker under torchrun, one host, static rendezvous, two ranks: the same losses as
# partrain run. Then torchrun's restart: a second torchrun continues the run to epoch 2, its
# first attempt loses rank 1 at once, and the restarted group resumes from the epoch-1
# checkpoint with a fresh store and token, ending with partrain run's epoch-2 losses. Last, a
# global batch with data.balance auto and rank 1 slowed (3 ms a sample, the test hook): the
# ranks under torchrun move samples to rank 0 and say so.
#   torchrun_test.sh PARTRAIN_EXE
# shellcheck source=tests/engines/engine_common.sh
. "$(dirname "$0")/engine_common.sh" "$1"

"$python" -c 'import torch.distributed.run' 2> /dev/null ||
  skip "no Python torch with torch.distributed.run (Debian: python3-torch)"

reference_run "$work/ref" --set train.epochs=2

# torchrun [extra options] -- [worker --set options]; replaces the (sub)shell it runs in, so
# $! of a background call is the timeout process, which passes a kill on to torchrun.
torchrun() {
  local options=()
  while [ "$1" != -- ]; do options+=("$1"); shift; done
  shift
  local port
  port=$(free_port_pair)
  # Debian's torch 1.13 on Python 3.11 fails to start workers without --redirects/--tee.
  exec timeout -k 5 120 "$python" -m torch.distributed.run --nproc_per_node=2 --nnodes=1 --node_rank=0 \
    --rdzv_backend=static --master_addr=127.0.0.1 --master_port="$port" --monitor_interval=1 \
    --redirects 2 --tee 2 "${options[@]}" \
    --no_python "$exe" worker "$work/tiny.yaml" --set output.dir="$work/tr" "$@"
}

echo "== torchrun, 2 ranks, epoch 1"
(torchrun --max_restarts=0 --) > "$work/tr1.log" 2>&1 ||
  { cat "$work/tr1.log"; echo "FAIL: torchrun exited non-zero"; exit 1; }
compare_losses "$work/ref" "$work/tr" --epochs 1

echo "== torchrun --max_restarts=1, epoch 2; rank 1 of the first attempt killed"
log=$work/tr2.log
torchrun --max_restarts=1 -- --set train.epochs=2 > "$log" 2>&1 &
launcher=$!
cleanups+=("kill $launcher 2> /dev/null")
# The first attempt's rank 1: a child of torchrun's agent with RANK=1 in its environment.
killed=""
for _ in $(seq 1 600); do
  for pid in $(ps -eo pid= -o args= | awk -v exe="$exe" '$2 == exe && $3 == "worker" {print $1}'); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -qx 'TORCHELASTIC_RESTART_COUNT=0' &&
       tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -qx 'RANK=1'; then
      kill -9 "$pid" && killed=$pid
    fi
  done
  [ -n "$killed" ] && break
  sleep 0.05
done
[ -n "$killed" ] || { cat "$log"; echo "FAIL: never saw rank 1 of torchrun's first attempt"; exit 1; }
rc=0
wait "$launcher" || rc=$?  # bounded: torchrun runs under timeout (124 when it ran out)
[ "$rc" = 0 ] || { cat "$log"; echo "FAIL: torchrun with a restart exited $rc"; exit 1; }
grep -q "resumed from .*epoch 1 done" "$log" ||
  { cat "$log"; echo "FAIL: the restarted group did not resume from the epoch-1 checkpoint"; exit 1; }
compare_losses "$work/ref" "$work/tr" --epochs 2

echo "== torchrun, 2 ranks, data.balance auto, rank 1 slowed"
(export PARTRAIN_TEST_SAMPLE_DELAY=1:0.003
 torchrun --max_restarts=0 -- --set output.dir="$work/tr-auto" --set data.synthetic_train=512 \
   --set data.batch_size=null --set data.global_batch_size=32 --set data.balance=auto) \
  > "$work/tr-auto.log" 2>&1 || { cat "$work/tr-auto.log"; echo "FAIL: torchrun with auto"; exit 1; }
grep -q "balance auto: step" "$work/tr-auto.log" ||
  { cat "$work/tr-auto.log"; echo "FAIL: auto did not move the split under torchrun"; exit 1; }
"$python" - "$work/tr-auto/report.json" <<'PY' || { cat "$work/tr-auto.log"; exit 1; }
import json, sys
balance = json.load(open(sys.argv[1]))["balance"]
shares = balance["shares"]
if balance["mode"] != "auto" or sum(shares) != 32 or not shares[0] > shares[1]:
    sys.exit(f"FAIL: balance {balance}: expected rank 0 to hold more of the 32 samples")
PY
echo "PASS: torchrun (static rendezvous, 2 ranks, a restart, auto balance) trained as partrain run did"
