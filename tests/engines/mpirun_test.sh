#!/usr/bin/env bash
# partrain worker under Open MPI's mpirun, two ranks on this host, the rendezvous named by
# MASTER_ADDR/MASTER_PORT passed with -x: the same losses as partrain run. Then the same with a
# global batch split 3:1 (data.balance): the ranks read their shares from the engine's world.
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

weights=(--set data.batch_size=null --set data.global_batch_size=32 --set 'data.balance=[3, 1]')
reference_run "$work/ref-weights" "${weights[@]}"
port=$(free_port_pair)
echo "== mpirun -n 2, data.balance [3, 1]"
timeout -k 5 120 mpirun "${as_root[@]}" --oversubscribe -n 2 \
  -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" \
  "$exe" worker "$work/tiny.yaml" --set output.dir="$work/mpi-weights" "${weights[@]}" \
  > "$work/mpi-weights.log" 2>&1 ||
  { cat "$work/mpi-weights.log"; echo "FAIL: mpirun with data.balance exited non-zero"; exit 1; }
compare_losses "$work/ref-weights" "$work/mpi-weights" --epochs 1
"$python" - "$work/mpi-weights/report.json" <<'PY' || exit 1
import json, sys
balance = json.load(open(sys.argv[1]))["balance"]
if balance["shares"] != [24, 8]:
    sys.exit(f"FAIL: shares {balance['shares']}, expected [24, 8] (32 split 3:1)")
PY
echo "PASS: mpirun (2 ranks, even and 3:1) trained as partrain run did"
