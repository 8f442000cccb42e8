#!/usr/bin/env bash
# TCP congestion control on one machine: partrain's asio-ring with comm.tcp_congestion auto
# (its default: cubic, else reno, between ranks of one machine) and system (the kernel's
# default), and Open MPI's MPI_Allreduce over its TCP transport
# (bench/peers/collectives/mpi_bench.cc), which always has the kernel's default, in a network
# namespace of this script's own whose default is bbr, then cubic (a namespace has its own
# net.ipv4.tcp_congestion_control, so the machine's stays as it was). Then partrain alone
# between two more namespaces joined by a veth pair (two hosts to partrain, as containers of
# one machine are; --nnodes 2, W/2 ranks each). Each contender runs ROUNDS times in turn; the
# tables give every round's median, to show how steady each one is, the best of them, Open
# MPI's best over partrain's, and the segments TCP sent again during each contender's runs
# (nstat in the namespace of rank 0). Note [Congestion control on one machine] in
# comm_backends/net/timed_io.cpp says why.
#
#   bench/allreduce/congestion.sh [BUILD_DIR] [SIZES] [WORLDS]   (defaults: build 1M,4M,16M,64M "2 4")
# Env: OUT (default BUILD_DIR/bench-congestion), ROUNDS (default 3), PEERS_DIR,
#      ALGORITHM (default ring: the algorithm partrain is held to, so that every round takes
#      the same path; auto lets it choose)
# Needs root (ip netns); exits 0 with a line saying so otherwise.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-3}
allreduce_setup bench-congestion "${1:-}" "${2:-1M,4M,16M,64M}" "${3:-2 4}"
ALGORITHM=${ALGORITHM:-ring}
command -v mpicxx > /dev/null || { echo "congestion.sh: mpicxx is missing (scripts/setup.sh installs libopenmpi-dev)" >&2; exit 1; }
MPI_BENCH=$OUT/mpi_bench
[[ -x $MPI_BENCH ]] || mpicxx -O3 -march=native -std=c++17 -o "$MPI_BENCH" "$PEERS_DIR/mpi_bench.cc"

NS=ptcc$$
if ! ip netns add "$NS" 2> /dev/null; then
  echo "congestion.sh: cannot make a network namespace (needs root): skipped"
  exit 0
fi
trap 'for n in "$NS" "${NS}a" "${NS}b"; do ip netns del "$n" 2> /dev/null || true; done' EXIT
in_ns() { ip netns exec "$NS" "$@"; }
in_ns ip link set lo up
# Two hosts of one machine: namespaces a (10.98.0.1) and b (10.98.0.2) on a veth pair.
ip netns add "${NS}a"
ip netns add "${NS}b"
ip link add va netns "${NS}a" type veth peer name vb netns "${NS}b"
ip -n "${NS}a" addr add 10.98.0.1/24 dev va
ip -n "${NS}b" addr add 10.98.0.2/24 dev vb
for n in a b; do
  ip -n "$NS$n" link set lo up
  ip -n "$NS$n" link set "v$n" up
done
echo "tcp congestion control available: $(cat /proc/sys/net/ipv4/tcp_available_congestion_control)" >> "$OUT/machine.txt"

# retransmitted NAME: adds the segments sent again since the last call to $OUT/NAME.retrans.
retransmitted() {
  in_ns nstat 2> /dev/null | awk -v f="$OUT/$1.retrans" \
    '$1 == "TcpRetransSegs" { n = $2 } END { print n + 0 >> f }'
}

for ((R=1; R<=ROUNDS; R++)); do
  for DEFAULT in bbr cubic; do
    in_ns sysctl -q -w net.ipv4.tcp_congestion_control="$DEFAULT"
    for W in $WORLDS; do
      modes=(system)
      [[ $DEFAULT == bbr ]] && modes=(auto system)
      for MODE in "${modes[@]}"; do
        name=partrain-$MODE-$DEFAULT
        echo "== round $R W=$W default $DEFAULT: partrain --tcp-congestion $MODE" >&2
        in_ns nstat -n
        in_ns "$BUILD/partrain" bench allreduce --backend asio-ring --algorithm "$ALGORITHM" \
          --tcp-congestion "$MODE" --world "$W" --sizes "$SIZES" \
          --json "$OUT/${name}_w${W}_r$R.json" >&2
        retransmitted "${name}_w$W"
      done
      echo "== round $R W=$W default $DEFAULT: Open MPI over TCP" >&2
      in_ns nstat -n
      in_ns mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo -np "$W" \
        --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo \
        "$MPI_BENCH" "$BYTES" > "$OUT/mpi-$DEFAULT-system_w${W}_r$R.txt"
      retransmitted "mpi-$DEFAULT-system_w$W"
    done
  done
  # Between the two namespace hosts: partrain only (Open MPI across namespaces is
  # bench/multinode/link.sh's).
  port=$((29700 + R * 10))
  for DEFAULT in bbr cubic; do
    for n in a b; do ip netns exec "$NS$n" sysctl -q -w net.ipv4.tcp_congestion_control="$DEFAULT"; done
    modes=(system)
    [[ $DEFAULT == bbr ]] && modes=(auto system)
    for W in $WORLDS; do
      for MODE in "${modes[@]}"; do
        name=veth-$MODE-$DEFAULT
        port=$((port + 1))
        echo "== round $R W=$W two namespace hosts, default $DEFAULT: partrain --tcp-congestion $MODE" >&2
        args=(bench allreduce --backend asio-ring --algorithm "$ALGORITHM" --tcp-congestion "$MODE"
              --world "$W" --sizes "$SIZES" --nnodes 2 --master-addr 10.98.0.1 --master-port "$port")
        ip netns exec "${NS}a" nstat -n
        ip netns exec "${NS}b" "$BUILD/partrain" "${args[@]}" --node-rank 1 --host 10.98.0.2 > /dev/null 2>&1 &
        other=$!
        ip netns exec "${NS}a" "$BUILD/partrain" "${args[@]}" --node-rank 0 --host 10.98.0.1 \
          --json "$OUT/${name}_w${W}_r$R.json" >&2
        wait "$other"
        ip netns exec "${NS}a" nstat 2> /dev/null | awk -v f="$OUT/${name}_w$W.retrans" \
          '$1 == "TcpRetransSegs" { n = $2 } END { print n + 0 >> f }'
      done
    done
  done
done
note_load_after

python3 - "$OUT" "$WORLDS" "$ROUNDS" "$ALGORITHM" <<'PY'
import json, os, sys
out, worlds, rounds, algorithm = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4]
print(open(f"{out}/machine.txt").read().strip())

def size_name(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"

def medians(name, w, r):
    """bytes -> median us of one contender's round."""
    got = {}
    if name.startswith("mpi"):
        for line in open(f"{out}/{name}_w{w}_r{r}.txt"):
            f = line.split()
            if line.startswith("#") or len(f) < 8 or not f[0].isdigit():
                continue
            assert f[7] == "OK", f"{name} W={w}: wrong results"
            got[int(f[0])] = float(f[3])
    else:
        for row in json.load(open(f"{out}/{name}_w{w}_r{r}.json"))["results"]:
            assert row["wrong"] == 0, f"{name} W={w}: wrong results"
            got[row["bytes"]] = row["median_us"]
    return got

def table(title, contenders, peers):
    print(f"\n### {title}")
    for w in worlds:
        rows = {label: [medians(name, w, r) for r in range(1, rounds + 1)] for label, name in contenders}
        sizes = sorted(rows["partrain auto"][0])
        print(f"\nW={w}\n")
        print("| contender | again | " + " | ".join(size_name(b) for b in sizes) + " |")
        print("|---|--:|" + "---|" * len(sizes))
        for label, name in contenders:
            again = sum(int(x) for x in open(f"{out}/{name}_w{w}.retrans").read().split())
            cells = []
            for b in sizes:
                each = [m[b] for m in rows[label]]
                cells.append(", ".join(f"{t:.0f}" for t in each) + f" (**{min(each):.0f}**)")
            print(f"| {label} | {again} | " + " | ".join(cells) + " |")
        auto = {b: min(m[b] for m in rows["partrain auto"]) for b in sizes}
        for peer in peers:
            ratios = [min(m[b] for m in rows[peer]) / auto[b] for b in sizes]
            print(f"\n{peer} best / partrain auto best: " +
                  ", ".join(f"{size_name(b)} {x:.2f}" for b, x in zip(sizes, ratios)))

print(f"\npartrain's algorithm: {algorithm}; us per allreduce, each round's median in run order, "
      "then the best; 'again': segments TCP sent again over all rounds")
table("One network namespace, over loopback",
      [("partrain auto", "partrain-auto-bbr"), ("partrain system (bbr)", "partrain-system-bbr"),
       ("Open MPI (bbr)", "mpi-bbr-system"), ("partrain system (cubic)", "partrain-system-cubic"),
       ("Open MPI (cubic)", "mpi-cubic-system")],
      ["Open MPI (bbr)", "Open MPI (cubic)"])
table("Two namespace hosts of one machine, over a veth pair",
      [("partrain auto", "veth-auto-bbr"), ("partrain system (bbr)", "veth-system-bbr"),
       ("partrain system (cubic)", "veth-system-cubic")],
      ["partrain system (bbr)"])
PY
