#!/usr/bin/env bash
# The shm backend against its peers in one run: `partrain bench allreduce` with shm,
# asio-ring (loopback TCP) and gloo, and Open MPI's MPI_Allreduce over its shared-memory
# transport (btl vader; bench/peers/collectives/mpi_bench.cc built with Debian's mpicxx), for
# W=2 and W=4; prints busbw per size and the ratios of shm to each. Each contender keeps its
# best median over ROUNDS rounds, as the peer figures do. COLLECTIVE=reduce_scatter, allgather
# or broadcast times that collective instead (Open MPI's MPI_Reduce_scatter_block,
# MPI_Allgather and MPI_Bcast); a size is then the reduce-scatter's input or the allgather's
# output (a broadcast's is its buffer, from rank 0). A second table per world gives each
# round's ratio of Open MPI's median to shm's, the two timed back to back.
# SHM_SINGLE_COPY=off keeps partrain's allgathers in shared memory (--shm-single-copy).
#
#   bench/allreduce/shm.sh [BUILD_DIR] [SIZES] [WORLDS]      (defaults: build 4K,64K,1M,16M,64M "2 4")
# Env: PEERS_DIR (default bench/peers/collectives), OUT (default BUILD_DIR/bench-shm),
#      ROUNDS (default 2), COLLECTIVE (default allreduce), SHM_SINGLE_COPY (default on)
set -euo pipefail
source "$(dirname "$0")/common.sh"
allreduce_setup bench-shm "$@"
COLLECTIVE=${COLLECTIVE:-allreduce}
command -v mpicxx > /dev/null || { echo "shm.sh: mpicxx is missing (scripts/setup.sh installs libopenmpi-dev)" >&2; exit 1; }
MPI_BENCH=$OUT/mpi_bench
[[ $MPI_BENCH -nt $PEERS_DIR/mpi_bench.cc ]] || mpicxx -O3 -march=native -std=c++17 -o "$MPI_BENCH" "$PEERS_DIR/mpi_bench.cc"

for ((R=1; R<=ROUNDS; R++)); do
  for W in $WORLDS; do
    echo "== round $R W=$W partrain (shm, asio-ring, gloo)" >&2
    "$BUILD/partrain" bench allreduce --backend shm,asio-ring,gloo --collective "$COLLECTIVE" \
      --shm-single-copy "${SHM_SINGLE_COPY:-on}" --world "$W" --sizes "$SIZES" \
      --json "$OUT/partrain_w${W}_r$R.json" >&2
    echo "== round $R W=$W Open MPI, shared memory (vader)" >&2
    mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo -np "$W" \
      --mca pml ob1 --mca btl self,vader "$MPI_BENCH" "$BYTES" shm "$COLLECTIVE" > "$OUT/mpi_w${W}_r$R.txt"
    cat "$OUT/mpi_w${W}_r$R.txt" >&2
  done
done
note_load_after

python3 - "$OUT" "$WORLDS" "$ROUNDS" "$COLLECTIVE" <<'PY'
import glob, json, sys
out, worlds, rounds, collective = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4]
print(open(f"{out}/machine.txt").read().strip())
def size_name(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
for w in worlds:
    best = {}  # (contender, bytes) -> (median_us, busbw)
    each = {}  # (contender, bytes, round) -> median_us
    def keep(name, b, r, us, bw, wrong):
        assert wrong == 0, f"{name} {b}: wrong results"
        each[(name, b, r)] = us
        if (name, b) not in best or us < best[(name, b)][0]:
            best[(name, b)] = (us, bw)
    for r in range(1, rounds + 1):
        for row in json.load(open(f"{out}/partrain_w{w}_r{r}.json"))["results"]:
            keep(row["backend"], row["bytes"], r, row["median_us"], row["busbw_gbps"], row["wrong"])
        for line in open(f"{out}/mpi_w{w}_r{r}.txt"):
            f = line.split()
            if line.startswith("#") or len(f) < 8:
                continue
            keep("mpi-shm", int(f[0]), r, float(f[3]), float(f[6]), 0 if f[7] == "OK" else 1)
    sizes = sorted({b for (_, b) in best})
    print(f"\nW={w}, {collective}: median us / busbw GB/s (best of {rounds}); ratios are shm's busbw over the other's")
    print("| size | shm | asio-ring | gloo | Open MPI shm | shm / asio-ring | shm / gloo | shm / Open MPI |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for b in sizes:
        cell = lambda n: f"{best[(n, b)][0]:.1f} us / {best[(n, b)][1]:.2f}" if (n, b) in best else "-"
        ratio = lambda n: f"{best[('shm', b)][1] / best[(n, b)][1]:.2f}x" if (n, b) in best and best[(n, b)][1] > 0 else "-"
        print(f"| {size_name(b)} | {cell('shm')} | {cell('asio-ring')} | {cell('gloo')} | {cell('mpi-shm')} | "
              f"{ratio('asio-ring')} | {ratio('gloo')} | {ratio('mpi-shm')} |")
    # This machine changes speed now and then for a while; a round's two runs, back to back,
    # more likely share one speed than the best of each over all rounds do.
    print(f"\nW={w}, {collective}, round by round: Open MPI's median over shm's (us), the two run back to back")
    print("| size | " + " | ".join(f"round {r}" for r in range(1, rounds + 1)) + " |")
    print("|---|" + "--:|" * rounds)
    for b in sizes:
        pair = lambda r: (f"{each[('mpi-shm', b, r)]:.1f} / {each[('shm', b, r)]:.1f} = "
                          f"{each[('mpi-shm', b, r)] / each[('shm', b, r)]:.2f}x"
                          if ('mpi-shm', b, r) in each and ('shm', b, r) in each else "-")
        print(f"| {size_name(b)} | " + " | ".join(pair(r) for r in range(1, rounds + 1)) + " |")
PY
