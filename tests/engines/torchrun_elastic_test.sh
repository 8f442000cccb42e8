#!/usr/bin/env bash
# torchrun's elastic mode on two test hosts (network namespaces, tests/multinode/netns.sh),
# one rank each, sharing the output folder as nodes share a network filesystem:
#   1. both start `torchrun --nnodes=1:2 --rdzv_backend=c10d`: a world of 2;
#   2. host 1 loses power mid-run (SIGKILL to its torchrun and worker): host 0's torchrun
#      re-forms a world of 1, which resumes from the newest step checkpoint;
#   3. host 1's torchrun starts again: host 0's torchrun stops its worker (which saves its
#      step), a world of 2 re-forms, resumes from that step and finishes.
# Host 0 (and the second host 1) exit 0, the workers resumed at 2 -> 1 -> 2 ranks without
# starting over, and every loss equals an uninterrupted partrain run's to float rounding
# (global batch, no BatchNorm: the same samples per step at any world size).
#   torchrun_elastic_test.sh PARTRAIN_EXE
# shellcheck source=tests/engines/engine_common.sh
. "$(dirname "$0")/engine_common.sh" "$1"
# shellcheck source=tests/multinode/netns.sh
. "$here/../multinode/netns.sh"

"$python" -c 'import torch.distributed.run' 2> /dev/null ||
  skip "no Python torch with torch.distributed.run (Debian: python3-torch)"
why=$(netns_why_not) && skip "$why"
cleanups+=(netns_down)
netns_up 2 || { echo "FAIL: cannot make two network-namespace hosts"; exit 1; }

# One epoch of 128 steps of 32 samples; rank 0 (host 0 in every world) waits 0.1 s a step
# so that the run lasts through the kill and the join. The float sums over the ranks round
# differently at each world size, and training makes such differences grow: at this small
# learning rate they stay within 1e-8 of the losses through the first epoch (compare_losses'
# tolerance is 1e-6), but reach 3e-5 (uninterrupted runs of 1 and 2 ranks) to 1e-4 (runs that
# changed world) in a second one, and 4e-4 at a learning rate of 0.05.
cp "$here/elastic.yaml" "$work/elastic.yaml"
timeout -k 5 120 "$exe" run "$work/elastic.yaml" --output "$work/ref" > "$work/ref.log" 2>&1 ||
  { cat "$work/ref.log"; echo "FAIL: partrain run (the reference) failed"; exit 1; }

port=29400
# start_host HOST LOG: host HOST's torchrun in the background (bounded by timeout); its pid
# in $started.
start_host() {
  (netns_run "$1" env PARTRAIN_TEST_STEP_DELAY=0:0.1 timeout -k 5 150 "$python" \
    -m torch.distributed.run --nnodes=1:2 --nproc_per_node=1 --rdzv_backend=c10d \
    --rdzv_endpoint="host0:$port" --rdzv_id=elastic-test --rdzv_conf=last_call_timeout=5 \
    --max_restarts=3 --monitor_interval=1 --redirects 2 --tee 2 \
    --no_python "$exe" worker "$work/elastic.yaml" --set output.dir="$work/out") > "$2" 2>&1 &
  started=$!
}

# show_state: what wait_for (engine_common.sh) prints when a wait runs out.
show_state() {
  for log in "$work"/host*.log; do echo "---- $log"; cat "$log"; done
}
# seen LOG PATTERN: LOG holds a line matching PATTERN.
seen() { grep -q -E "$2" "$1" 2> /dev/null; }
# trained_after MARK: rank 0 logged a step after the line with MARK.
trained_after() { sed -n "/$1/,\$p" "$work/host0.log" | grep -q -E "step [0-9]+/"; }

echo "== world of 2 at ${SECONDS} s"
start_host 0 "$work/host0.log"
host0=$started
start_host 1 "$work/host1a.log"
cleanups+=("kill $host0 $started 2> /dev/null")
wait_for "rank 0 reached step 8" 60 seen "$work/host0.log" "step 8/"
seen "$work/host0.log" "a world of 2 ranks, started by torchrun" ||
  { cat "$work/host0.log"; echo "FAIL: the first world was not 2 hosts"; exit 1; }

echo "== host 1 lost (SIGKILL) at ${SECONDS} s"
netns_kill 1 || { echo "FAIL: the processes of host 1 would not die"; exit 1; }
wait "$started" 2> /dev/null || true
wait_for "a world of 1 resumed" 60 seen "$work/host0.log" "resumed from .*written by 2 ranks, now 1"
echo "== world of 1 at ${SECONDS} s"
wait_for "the world of 1 took a step" 30 trained_after "written by 2 ranks, now 1"

echo "== host 1 joins at ${SECONDS} s"
start_host 1 "$work/host1b.log"
host1=$started
cleanups+=("kill $host1 2> /dev/null")
wait_for "a world of 2 resumed" 60 seen "$work/host0.log" "resumed from .*written by 1 rank, now 2"
echo "== world of 2 again at ${SECONDS} s"

rc0=0 rc1=0
wait "$host0" || rc0=$?  # bounded: torchrun runs under timeout (124 when it ran out)
wait "$host1" || rc1=$?
[ "$rc0 $rc1" = "0 0" ] || {
  for log in "$work"/host*.log; do echo "---- $log"; cat "$log"; done
  echo "FAIL: torchrun exited $rc0 on host 0, $rc1 on the rejoined host 1"
  exit 1
}
grep -E "a world of|resumed from|stopped at step" "$work/host0.log" || true
# Each world resumed from a step checkpoint, not from the start; the join saved its step.
grep -q "resumed from .*epoch-0000.step-.*written by 2 ranks, now 1" "$work/host0.log" ||
  { echo "FAIL: the world of 1 did not resume from a step checkpoint"; exit 1; }
grep -q "stopped at step [0-9]* by SIGTERM" "$work/host0.log" ||
  { echo "FAIL: torchrun did not stop the world of 1 with SIGTERM for the join"; exit 1; }
# Three starts: the loss counts as torchrun's one restart, the join as none. A join that
# failed first (say, ranks of one world disagreeing on the run token) would count more.
starts=$(grep -o "a world of .*" "$work/host0.log" | tr '\n' ';')
expected="a world of 2 ranks, started by torchrun (restart 0);"
expected+="a world of 1 rank, started by torchrun (restart 1);"
expected+="a world of 2 ranks, started by torchrun (restart 1);"
[ "$starts" = "$expected" ] ||
  { echo "FAIL: rank 0 started as '$starts', not '$expected'"; exit 1; }
compare_losses "$work/ref" "$work/out" --epochs 1 --any-world
echo "PASS: torchrun elastic, 2 -> 1 -> 2 hosts, resumed each time, the uninterrupted losses"
