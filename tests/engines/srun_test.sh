#!/usr/bin/env bash
# partrain worker under Slurm: a one-node cluster started here, `srun -n 2` with nothing but
# Slurm's own variables (the rendezvous comes from the step's node list and the job id), then
# docs/partrain.sbatch through sbatch: both give the same losses as partrain run. A rank whose
# config is missing on its host is named by the other at once.
#   srun_test.sh PARTRAIN_EXE
# shellcheck source=tests/engines/engine_common.sh
. "$(dirname "$0")/engine_common.sh" "$1"
# shellcheck source=tests/engines/slurm_cluster.sh
. "$here/slurm_cluster.sh"

# The port partrain derives from the job id must be free.
start_slurm_cluster "$work/slurm" "$(first_job_id_with_free_port)"

reference_run "$work/ref"

echo "== srun -n 2 (rendezvous from SLURM_STEP_NODELIST and SLURM_JOB_ID)"
timeout -k 5 120 srun -n 2 --overcommit --kill-on-bad-exit=1 \
  "$exe" worker "$work/tiny.yaml" --set output.dir="$work/srun" > "$work/srun.log" 2>&1 ||
  { cat "$work/srun.log"; echo "FAIL: srun exited non-zero"; exit 1; }
compare_losses "$work/ref" "$work/srun" --epochs 1

echo "== sbatch docs/partrain.sbatch"
sbatch_script=$here/../../docs/partrain.sbatch
timeout -k 5 120 env PARTRAIN="$exe" sbatch --wait --nodes=1 --ntasks=2 --ntasks-per-node=2 --cpus-per-task=1 --overcommit \
  --output="$work/sbatch.log" "$sbatch_script" "$work/tiny.yaml" --set output.dir="$work/sbatch" \
  > "$work/sbatch.submit" 2>&1 ||
  { cat "$work/sbatch.submit" "$work/sbatch.log" 2> /dev/null || true; echo "FAIL: sbatch job failed"; exit 1; }
compare_losses "$work/ref" "$work/sbatch" --epochs 1
echo "== srun -n 2, the config missing on rank 1's host, no --kill-on-bad-exit"
# Rank 1 stops before it meets rank 0; it tells rank 0 why through the store, so both end at
# once (exit 2) instead of rank 0 waiting out comm.timeout_s (60 s here).
start=$(date +%s)
code=0
# shellcheck disable=SC2016  # expanded by each task's own shell
timeout -k 5 120 srun -n 2 --overcommit --kill-on-bad-exit=0 --label bash -c \
  'cfg=$1; [ "$SLURM_PROCID" = 1 ] && cfg=$2; exec "$0" worker "$cfg" --set comm.timeout_s=60 \
     --set output.dir="$3"' "$exe" "$work/tiny.yaml" "$work/missing.yaml" "$work/missing" \
  > "$work/missing.log" 2>&1 || code=$?
took=$(($(date +%s) - start))
[ "$code" -eq 2 ] || { cat "$work/missing.log"; echo "FAIL: srun exited $code, not 2"; exit 1; }
grep -q "^0: partrain: rank 1 (.*) stopped before meeting the others: $work/missing.yaml: cannot open config file" "$work/missing.log" ||
  { cat "$work/missing.log"; echo "FAIL: rank 0 did not name rank 1 and why it stopped"; exit 1; }
[ "$took" -lt 30 ] || { cat "$work/missing.log"; echo "FAIL: took ${took}s, as if waiting out the timeout"; exit 1; }
echo "rank 0 named rank 1's missing config after ${took}s"

echo "== srun -n 2 partrain bench allreduce"
timeout -k 5 120 srun -n 2 --overcommit --kill-on-bad-exit=1 \
  "$exe" bench allreduce --backend asio-ring --sizes 4K,1M --iters 3 --json "$work/bench.json" \
  > "$work/bench.log" 2>&1 || { cat "$work/bench.log"; echo "FAIL: srun bench exited non-zero"; exit 1; }
"$python" "$here/check_bench.py" "$work/bench.json" 2 asio-ring 2
echo "PASS: srun and sbatch (2 ranks) trained as partrain run did; bench under srun: wrong = 0"
