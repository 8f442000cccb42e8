#!/usr/bin/env bash
# torchrun's elastic mode on two network-namespace hosts (tests/multinode/netns.sh), one rank
# each, timed: how long from the loss of host 1 (SIGKILL to its torchrun and worker) to the
# first step of the world of 1 on host 0, and from the start of host 1's torchrun again to the
# first step of the world of 2. Each run is checked: both torchruns exit 0, the worlds resumed
# 2 -> 1 -> 2 from step checkpoints, and the losses equal an uninterrupted partrain run's.
# Rank 0 waits 0.05 s a step to make the run last (DigitalNet w8, global batch 32, CPU), so a
# first step costs that much more than it would. One epoch of 128 steps at a small learning
# rate, as in the engines.torchrun_elastic test: the losses stay within 1e-6 of the
# uninterrupted run's (longer runs drift further: float sums round differently per world).
# Usage: bench/preemption/elastic.sh   (as root; PARTRAIN: default build/partrain; RUNS:
# default 3; LAST_CALL: torchrun's last_call_timeout in s, default its own 30; OUT: scratch
# folder, default a fresh one under the system temp dir)
set -euo pipefail
cd "$(dirname "$0")/../.."
P=$(realpath "${PARTRAIN:-build/partrain}")
RUNS=${RUNS:-3}
LAST_CALL=${LAST_CALL:-30}
D=${OUT:-$(mktemp -d)}
python=python3
[ -x /usr/bin/python3 ] && python=/usr/bin/python3
# shellcheck source=tests/multinode/netns.sh
. tests/multinode/netns.sh
if why=$(netns_why_not); then echo "elastic.sh: $why" >&2; exit 2; fi
trap netns_down EXIT
netns_up 2 || { echo "elastic.sh: cannot make two network-namespace hosts" >&2; exit 1; }
mkdir -p "$D"

# The engines.torchrun_elastic test's config, so that the times are of the run it checks.
cp tests/engines/elastic.yaml "$D/elastic.yaml"
"$P" run "$D/elastic.yaml" --output "$D/ref" > "$D/ref.log" 2>&1

now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }

# start_host HOST LOG OUTPUT: host HOST's torchrun in the background; its pid in $started.
start_host() {
  (netns_run "$1" env PARTRAIN_TEST_STEP_DELAY=0:0.05 timeout -k 5 300 "$python" \
    -m torch.distributed.run --nnodes=1:2 --nproc_per_node=1 --rdzv_backend=c10d \
    --rdzv_endpoint="host0:$((29400 + run))" --rdzv_id="bench-$run" \
    --rdzv_conf="last_call_timeout=$LAST_CALL" --max_restarts=3 --monitor_interval=1 \
    --redirects 2 --tee 2 --no_python "$P" worker "$D/elastic.yaml" --set output.dir="$3") \
    > "$2" 2>&1 &
  started=$!
}

# until_seen WHAT SECONDS COMMAND...: polls COMMAND every 20 ms; exits 1 after SECONDS.
until_seen() {
  local what=$1 seconds=$2 i
  shift 2
  for ((i = 0; i < seconds * 50; i++)); do
    "$@" && return 0
    sleep 0.02
  done
  echo "elastic.sh: run $run: no $what within $seconds s (logs in $D)" >&2
  exit 1
}
# stepped_after LOG MARK: LOG has a step line after the line with MARK.
stepped_after() { sed -n "/$2/,\$p" "$1" 2> /dev/null | grep -q -E "step [0-9]+/"; }
stepped() { grep -q "step 8/" "$1" 2> /dev/null; }

for ((run = 1; run <= RUNS; run++)); do
  out=$D/out$run log=$D/host0-$run.log
  start_host 0 "$log" "$out"
  host0=$started
  start_host 1 "$D/host1a-$run.log" "$out"
  until_seen "step 8 in the world of 2" 120 stepped "$log"

  t=$(now)
  netns_kill 1
  until_seen "step in the world of 1" 180 stepped_after "$log" "written by 2 ranks, now 1"
  shrink=$(since "$t")

  t=$(now)
  start_host 1 "$D/host1b-$run.log" "$out"
  host1=$started
  until_seen "step in the world of 2" 180 stepped_after "$log" "written by 1 rank, now 2"
  grow=$(since "$t")

  rc0=0 rc1=0
  wait "$host0" || rc0=$?
  wait "$host1" || rc1=$?
  [ "$rc0 $rc1" = "0 0" ] || { echo "elastic.sh: run $run: torchrun exited $rc0 and $rc1" >&2; exit 1; }
  check=$("$python" tests/engines/compare_losses.py "$D/ref" "$out" --epochs 1 --any-world)
  printf 'run %d: kill -> first step at world 1: %.1f s; join -> first step at world 2: %.1f s; %s\n' \
    "$run" "$shrink" "$grow" "$check"
  netns_kill 0 || true
done
