#!/usr/bin/env bash
# docs/partrain.sbatch preempted and requeued on a one-node Slurm cluster started here: the
# job gets SIGUSR1 mid-epoch as its --signal asks (sent with scancel, as slurmctld does before
# the time limit), its ranks save that step and exit 75, the script requeues the job, and the
# second start resumes from the mid-epoch checkpoint and ends with exactly the losses of an
# uninterrupted partrain run.
#   slurm_requeue_test.sh PARTRAIN_EXE
# shellcheck source=tests/engines/engine_common.sh
. "$(dirname "$0")/engine_common.sh" "$1"
# shellcheck source=tests/engines/slurm_cluster.sh
. "$here/slurm_cluster.sh"

# A requeued job waits cred_expire seconds before it starts again (the credential of its
# first start must have expired on the node): 10 s here, not the default 120.
start_slurm_cluster "$work/slurm" "$(first_job_id_with_free_port)" 10

# 500 steps an epoch: long enough to be signalled mid-epoch, a few seconds in all.
sets=(--set data.synthetic_train=16000 --set train.log_every=5)
reference_run "$work/ref" "${sets[@]}"

# show FIELD: FIELD=value of the job, from scontrol.
show() {
  scontrol -o show job "$job" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$1=//p"
}

# show_state: what wait_for (engine_common.sh) prints when a wait runs out.
show_state() {
  cat "$work/job.log" 2> /dev/null || true
  scontrol show job "$job" || true
}

echo "== sbatch docs/partrain.sbatch (1 node, 2 ranks) at ${SECONDS} s"
sbatch_script=$here/../../docs/partrain.sbatch
# Rank 0 waits 10 ms before each batch (no number changes): the signal, sent once the log shows
# step 20, lands mid-epoch on a fast machine too.
job=$(env PARTRAIN="$exe" PARTRAIN_TEST_STEP_DELAY=0:0.01 sbatch --parsable --nodes=1 --ntasks=2 --ntasks-per-node=2 \
  --cpus-per-task=1 --overcommit --output="$work/job.log" "$sbatch_script" "$work/tiny.yaml" \
  --set output.dir="$work/job" "${sets[@]}")
cleanups+=("scancel '$job' 2> /dev/null")
running_mid_epoch() { grep -q "step 20/" "$work/job.log" 2> /dev/null; }
wait_for "the job reached step 20" 60 running_mid_epoch

echo "== SIGUSR1 to the job's steps (what --signal=USR1@120 sends before the time limit)"
scancel --signal=USR1 "$job"
requeued() { [ "$(show Restarts)" = 1 ] && [ "$(show JobState)" = PENDING ]; }
wait_for "the job was requeued" 60 requeued
echo "== requeued at ${SECONDS} s; pending for cred_expire"
ended() { case "$(show JobState)" in COMPLETED | FAILED | CANCELLED | TIMEOUT) true ;; *) false ;; esac; }
wait_for "the requeued job ended" 90 ended
echo "== ended at ${SECONDS} s"

log=$(cat "$work/job.log")
printf '%s\n' "$log" | grep -E "stopped at step|resumed from|srun:" || true
[ "$(show JobState) $(show ExitCode)" = "COMPLETED 0:0" ] ||
  { echo "$log"; echo "FAIL: the job ended $(show JobState), exit code $(show ExitCode)"; exit 1; }
[ "$(show Restarts)" = 1 ] || { echo "FAIL: $(show Restarts) restarts, not 1"; exit 1; }
grep -q "stopped at step [0-9]* by SIGUSR1; saved .*epoch-0000.step-" <<< "$log" ||
  { echo "$log"; echo "FAIL: the first start did not save a mid-epoch step at SIGUSR1"; exit 1; }
grep -q "resumed from .*epoch-0000.step-.*batches into epoch 1" <<< "$log" ||
  { echo "$log"; echo "FAIL: the requeued start did not resume mid-epoch"; exit 1; }
compare_losses "$work/ref" "$work/job" --epochs 1 --exact
echo "PASS: stopped at SIGUSR1, requeued by the script, resumed mid-epoch, same losses to the bit"
