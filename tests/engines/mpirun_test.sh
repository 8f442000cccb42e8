#!/usr/bin/env bash
# partrain worker under Open MPI's mpirun, two ranks on this host, the rendezvous named by
# MASTER_ADDR/MASTER_PORT passed with -x: the same losses as partrain run.
#   mpirun_test.sh PARTRAIN_EXE
# shellcheck source=tests/engines/engine_common.sh
. "$(dirname "$0")/engine_common.sh" "$1"

command -v mpirun > /dev/null || skip "no mpirun (Debian: openmpi-bin)"
as_root=()
[ "$(id -u)" -eq 0 ] && as_root=(--allow-run-as-root)

reference_run "$work/ref"

port=$(free_port_pair)
echo "== mpirun -n 2, MASTER_ADDR=127.0.0.1 MASTER_PORT=$port"
timeout -k 5 120 mpirun "${as_root[@]}" --oversubscribe -n 2 \
  -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" \
  "$exe" worker "$work/tiny.yaml" --set output.dir="$work/mpi" > "$work/mpi.log" 2>&1 ||
  { cat "$work/mpi.log"; echo "FAIL: mpirun exited non-zero"; exit 1; }
compare_losses "$work/ref" "$work/mpi" --epochs 1
echo "PASS: mpirun (2 ranks) trained as partrain run did"
