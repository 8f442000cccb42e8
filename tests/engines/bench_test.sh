#!/usr/bin/env bash
# partrain bench allreduce across "hosts": under mpirun (each process one rank, the
# rendezvous from MASTER_ADDR/MASTER_PORT, then from --rendezvous) and with the launcher's
# node flags (two bench processes as node 0 and node 1 on loopback). Each report must hold
# every backend and size with wrong = 0.
#   bench_test.sh PARTRAIN_EXE
# shellcheck source=tests/engines/engine_common.sh
. "$(dirname "$0")/engine_common.sh" "$1"

check() { "$python" "$here/check_bench.py" "$@"; }
backends=asio-ring
"$exe" version | grep -q "^  gloo: usable" && backends=asio-ring,gloo

if command -v mpirun > /dev/null; then
  as_root=()
  [ "$(id -u)" -eq 0 ] && as_root=(--allow-run-as-root)
  port=$(free_port_pair)
  echo "== mpirun -n 2 partrain bench allreduce (MASTER_ADDR/MASTER_PORT)"
  timeout -k 5 120 mpirun "${as_root[@]}" --oversubscribe -n 2 \
    -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" \
    "$exe" bench allreduce --backend "$backends" --sizes 4K,1M --iters 3 --json "$work/mpi.json" \
    > "$work/mpi.log" 2>&1 || { cat "$work/mpi.log"; echo "FAIL: mpirun bench exited non-zero"; exit 1; }
  grep -q "started by mpirun" "$work/mpi.log" || { cat "$work/mpi.log"; echo "FAIL: no table"; exit 1; }
  check "$work/mpi.json" 2 "$backends" 2

  echo "== mpirun -n 3 partrain bench allreduce --rendezvous file://..."
  timeout -k 5 120 mpirun "${as_root[@]}" --oversubscribe -n 3 \
    "$exe" bench allreduce --backend asio-ring --sizes 100K --dtype bf16 --iters 3 \
    --rendezvous "file://$work/rdzv" --json "$work/mpi3.json" > "$work/mpi3.log" 2>&1 ||
    { cat "$work/mpi3.log"; echo "FAIL: mpirun bench (file rendezvous) exited non-zero"; exit 1; }
  check "$work/mpi3.json" 3 asio-ring 1
else
  echo "no mpirun (Debian: openmpi-bin): the mpirun part is skipped"
fi

port=$(free_port_pair)
echo "== two nodes on loopback: --world 4 --nnodes 2 --node-rank 0|1"
node() {
  timeout -k 5 120 "$exe" bench allreduce --backend "$backends" --world 4 --nnodes 2 \
    --node-rank "$1" --master-addr 127.0.0.1 --master-port "$port" --sizes 64K --iters 3 "${@:2}"
}
node 1 > "$work/node1.log" 2>&1 &
node1=$!
cleanups+=("kill $node1 2> /dev/null")
rc=0
node 0 --json "$work/nodes.json" > "$work/node0.log" 2>&1 || rc=$?
rc1=0
wait "$node1" || rc1=$?  # bounded by its timeout
if [ "$rc" != 0 ] || [ "$rc1" != 0 ]; then
  cat "$work/node0.log" "$work/node1.log"
  echo "FAIL: node 0 exited $rc, node 1 $rc1"
  exit 1
fi
check "$work/nodes.json" 4 "$backends" 1
grep -q "node 0 prints the results" "$work/node1.log" || { cat "$work/node1.log"; exit 1; }
echo "PASS: bench allreduce under mpirun and across two launcher nodes: wrong = 0"
