#!/usr/bin/env bash
# Test hosts joined by rate-limited links: HOSTS network namespaces (default 2); two are joined
# by one veth pair, more each by a veth pair to a bridge in a switch namespace of their own; a
# token bucket (tc tbf) on both ends' egress, so each host's link carries RATE each way. For
# each link rate and backend/wire format:
#   * `partrain bench allreduce` across the hosts (RANKS_PER_HOST ranks each, default 1), the
#     algorithm it took, busbw against the line rate (ALLREDUCE_SIZES; ALLREDUCE=0 skips it),
#     and the bytes that leave the busiest host per direction against the line rate;
#   * DDP training of MODEL (default digitalnet; resnet18 too) width WIDTH (default 64) on
#     synthetic CIFAR-shaped data (TRAIN_SAMPLES, default 1280) with RANKS_PER_HOST ranks per
#     host, the images/s rank 0 reports and the wait for gradients after backward (TRAIN=0
#     skips it). A variant BACKEND:WIRE:powersgdR trains with PowerSGD gradient compression at
#     rank R from step POWERSGD_START (default 10) on (training only), and the table gives the
#     gradient bytes a rank sends per step, from report.json. With EXPLAIN_DIR set, what
#     `partrain explain` says of each training run goes to EXPLAIN_DIR/RATE-VARIANT.txt (and
#     --json to .json); with BASELINE=1 too, host 0 first trains the single-device twin
#     (--with-baseline, while host 1 waits at the rendezvous), so explain decomposes the
#     speed-up over it.
# Needs root and iproute2.
#
#   bench/multinode/link.sh [RATES] [BACKENDS]   e.g. "1gbit 200mbit" "asio-ring:f32 gloo:f32"
#   RANKS_PER_HOST=2 TRAIN=0 bench/multinode/link.sh 1gbit "hierarchical:f32 asio-ring:f32"
#   ALLREDUCE=0 bench/multinode/link.sh 100mbit "asio-ring:f32 asio-ring:f32:powersgd2"
#   HOSTS=4 TRAIN=0 bench/multinode/link.sh 1gbit "asio-ring:f32 gloo:f32 mpi:f32"
# The variant mpi:f32 (allreduce only) is Open MPI's MPI_Allreduce over its TCP transport
# (bench/peers/collectives/mpi_bench.cc, its tuned decision rules), started by mpirun in host 0
# with a launch agent that enters each host's namespace; unbound, since every namespace host
# would bind its first rank to the same core, and yielding while it waits, as mpirun does when
# it knows it oversubscribes (the namespace hosts share this machine's cores). Its daemons
# report straight to mpirun (routed direct): through its default tree, whose hosts here all
# share one hostname, about one run in eight failed with an ORTE routing error.
# Env: PARTRAIN (the executable; default build/partrain), ITERS (timed allreduces a size; default
# by size, 200 up to 64 KiB down to 8 at 64 MiB, after 3 untimed: the count and warm-up Open
# MPI's bench takes, so that both medians come from as many runs), ALGORITHM (comm.algorithm for the
# asio-ring and hierarchical allreduce runs: ring, recursive_doubling, rabenseifner; default auto),
# TCP_CONGESTION (comm.tcp_congestion for asio-ring and hierarchical, runs and training: auto,
# system, a name; default system, what separate machines keep under auto: auto would take
# cubic here, the hosts being namespaces of one kernel),
# BIND (launch.bind for runs, --bind for the bench: auto, the default, gives each rank of a host
# cores of its own, or shares the CPUs evenly where its ranks outnumber them; none),
# MPI_ARGS (more mpirun arguments, e.g. "--mca coll_tuned_use_dynamic_rules 1 --mca
# coll_tuned_allreduce_algorithm 3" to force Open MPI's recursive doubling), BURST (the token
# bucket's size, default 256kb: 2 ms of a 1 Gbit/s line, which refills between the timed
# allreduces of a bench; BENCHMARKS.md, "eight rounds side by side"), TIMING (each, the default:
# every allreduce timed alone between a barrier and its check; loop: back to back, for partrain's
# bench and Open MPI's alike; Note [Timing each collective or a loop] in cli/bench_command.cpp),
# HOST_CPUS (all, the default: every host's processes may run on every CPU of this machine, as
# the figures before 2026-12-06 were measured; split: host i gets its own share of the CPUs,
# i*C/H to (i+1)*C/H - 1 of the C this script may use, or CPU i*C/H alone where the hosts
# outnumber them, as separate machines would have CPUs of their own: each host's launcher and
# Open MPI's ranks on it run under taskset, and a launcher binds its ranks within its share).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/allreduce/common.sh  # to_bytes
rates=${1:-"1gbit 200mbit"}
variants=${2:-"asio-ring:f32 asio-ring:bf16 gloo:f32"}
exe=${PARTRAIN:-$(pwd)/build/partrain}
per_host=${RANKS_PER_HOST:-1}
nhosts=${HOSTS:-2}
[[ $nhosts =~ ^[0-9]+$ && $nhosts -ge 2 && $nhosts -le 16 ]] || {
  echo "link.sh: HOSTS must be 2..16, got '$nhosts'" >&2; exit 2; }
world=$((nhosts * per_host))
[ "$(id -u)" -eq 0 ] || { echo "link.sh: needs root (network namespaces)" >&2; exit 2; }
id=$$
sw=ptb${id}s
hosts=()
for ((i = 0; i < nhosts; i++)); do hosts+=("ptb${id}h$i"); done
# on_cpus[i]: the command prefix that keeps host i's processes on its CPUs (HOST_CPUS).
read -ra all_cpus <<< "$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
on_cpus=()
for ((i = 0; i < nhosts; i++)); do
  case ${HOST_CPUS:-all} in
    all) on_cpus+=("") ;;
    split)
      first=$((i * ${#all_cpus[@]} / nhosts)) last=$(((i + 1) * ${#all_cpus[@]} / nhosts - 1))
      [ "$last" -ge "$first" ] || last=$first
      list=$(IFS=,; echo "${all_cpus[*]:first:last-first+1}")
      on_cpus+=("taskset -c $list") ;;
    *) echo "link.sh: HOST_CPUS must be all or split, got '$HOST_CPUS'" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d /tmp/partrain-link-XXXXXX)
cleanup() {
  for ns in "${hosts[@]}" "$sw"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
# Host i is 10.78.0.(i+1), its end of the link "${ns}v"; with a switch, the switch's end is
# "p$i" on bridge br0. A bridge costs the kernel forwarding work on the same two cores, so two
# hosts keep the plain pair the earlier figures were measured over.
for ns in "${hosts[@]}"; do ip netns add "$ns"; done
if [ "$nhosts" -eq 2 ]; then
  ip link add "${hosts[0]}v" type veth peer name "${hosts[1]}v"
  for ns in "${hosts[@]}"; do ip link set "${ns}v" netns "$ns"; done
else
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 0; i < nhosts; i++)); do
    ip link add "${hosts[$i]}v" type veth peer name "ptb${id}p$i"
    ip link set "${hosts[$i]}v" netns "${hosts[$i]}"
    ip link set "ptb${id}p$i" netns "$sw"
    ip -n "$sw" link set "ptb${id}p$i" name "p$i"
    ip -n "$sw" link set "p$i" master br0
    ip -n "$sw" link set "p$i" up
  done
fi
for ((i = 0; i < nhosts; i++)); do
  ns=${hosts[$i]}
  ip -n "$ns" addr add "10.78.0.$((i + 1))/24" dev "${ns}v"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "${ns}v" up
done

cat > "$work/cfg.yaml" <<YAML
name: link
seed: 0
device: cpu
strategy: ddp
launch: {nproc_per_node: 1}
comm: {timeout_s: 120, bucket_mb: 25}
data: {dataset: synthetic, synthetic_train: ${TRAIN_SAMPLES:-1280}, synthetic_test: 64, batch_size: 64, num_workers: 1}
model: {name: ${MODEL:-digitalnet}, width: ${WIDTH:-64}, norm: batch}
train: {epochs: 2, threads: 1, log_every: 10}
checkpoint: {every_epochs: 0, resume: never}
YAML

# set_rate RATE: the token bucket on both ends of every host's link.
set_rate() {
  for ((i = 0; i < nhosts; i++)); do
    tc -n "${hosts[$i]}" qdisc replace dev "${hosts[$i]}v" root tbf rate "$1" burst "${BURST:-256kb}" latency 50ms
    [ "$nhosts" -eq 2 ] || tc -n "$sw" qdisc replace dev "p$i" root tbf rate "$1" burst "${BURST:-256kb}" latency 50ms
  done
}

# parse_variant BACKEND:WIRE[:powersgdR]: sets backend, wire and compress (none or powersgdR).
parse_variant() {
  local rest=${1#*:}
  backend=${1%%:*}; wire=${rest%%:*}; compress=none
  [ "$rest" = "$wire" ] || compress=${rest#*:}
}

# on_all WHAT BOUND_S: runs "${args[@]}" on every host, node 0 with "${extra0[@]}" and node i
# with --host 10.78.0.(i+1) and "${extra1[@]}" (%i in them: i), logs in $work/WHATi.log; stops
# the script if any fails.
on_all() {
  local what=$1 bound=$2 i failed=0 pids=()
  for ((i = 0; i < nhosts; i++)); do
    local extra=("${extra1[@]//%i/$i}")
    [ "$i" -eq 0 ] && extra=("${extra0[@]}")
    # shellcheck disable=SC2086  # on_cpus: a command prefix, or nothing
    ip netns exec "${hosts[$i]}" ${on_cpus[$i]} timeout "$bound" "$exe" "${args[@]}" --node-rank "$i" \
      --host "10.78.0.$((i + 1))" "${extra[@]}" > "$work/${what}$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || failed=1; done
  if [ "$failed" = 1 ]; then
    echo "link.sh: $what failed ($rate $variant):" >&2; tail -n 5 "$work/${what}"*.log >&2; exit 1
  fi
}

# mpi_allreduce SIZES RATE: Open MPI's allreduce over TCP across the hosts, one table row a size.
mpi_allreduce() {
  local mpi_args=()
  read -ra mpi_args <<< "${MPI_ARGS:-}"
  if [ ! -x "$work/mpi_bench" ]; then
    mpicxx -O3 -std=c++17 -o "$work/mpi_bench" bench/peers/collectives/mpi_bench.cc
    # Open MPI's rsh launcher runs `AGENT HOST COMMAND...` as it would run ssh.
    # Each host's prefix (HOST_CPUS) in a file of its name, for the agent.
    for ((i = 0; i < nhosts; i++)); do echo "${on_cpus[$i]}" > "$work/cpus-${hosts[$i]}"; done
    cat > "$work/agent" <<AGENT
#!/bin/sh
host=\$1; shift
exec ip netns exec "\$host" \$(cat "$work/cpus-\$host") /bin/sh -c "\$*"
AGENT
    chmod +x "$work/agent"
    for ns in "${hosts[@]}"; do echo "$ns slots=$per_host"; done > "$work/hostfile"
  fi
  # Its daemons now and then fail to start here (an ORTE routing error, or "unable to reliably
  # start"; with HOST_CPUS=split in three runs of six): a run that timed no size is tried
  # again, three times in all; one that failed after its first result is not.
  local try
  for try in 1 2 3; do
    ip netns exec "${hosts[0]}" timeout 600 mpirun --allow-run-as-root --hostfile "$work/hostfile" \
      -np "$world" --map-by slot --bind-to none --mca mpi_yield_when_idle 1 \
      --mca plm_rsh_agent "$work/agent" --mca routed direct \
      --mca oob_tcp_if_include 10.78.0.0/24 --mca pml ob1 --mca btl self,tcp \
      --mca btl_tcp_if_include 10.78.0.0/24 "${mpi_args[@]}" "$work/mpi_bench" "$(to_bytes "$1")" mpi allreduce "${TIMING:-each}" > "$work/mpi.txt" 2>&1 && break
    if [ "$try" = 3 ] || grep -qE '^[0-9]+ ' "$work/mpi.txt"; then
      echo "link.sh: mpirun failed ($2):" >&2; tail -n 20 "$work/mpi.txt" >&2; exit 1
    fi
    echo "link.sh: mpirun's daemons did not start ($2, try $try of 3); again" >&2
  done
  # Its table as the rows `partrain bench allreduce --json` writes, for allreduce_rows.
  python3 - "$work/mpi.txt" > "$work/mpi.json" <<'PY'
import json, sys
results = []
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 8 and f[0].isdigit():
        results.append({"bytes": int(f[0]), "median_us": float(f[3]), "busbw_gbps": float(f[6]),
                        "wrong": 0 if f[7] == "OK" else 1, "algorithm": "tuned"})
json.dump({"results": results}, sys.stdout)
PY
  allreduce_rows "$work/mpi.json" "$2" mpi f32
}

# allreduce_rows JSON RATE BACKEND WIRE: a table row for each size of an allreduce bench's JSON.
allreduce_rows() {
  python3 - "$1" "$2" "$3" "$4" "$per_host" "$nhosts" <<'PY'
import json, math, re, sys
report, rate, backend, wire = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4]
per_host, hosts = int(sys.argv[5]), int(sys.argv[6])
world = hosts * per_host
value, unit = re.fullmatch(r"(\d+)([kmg])bit", rate).groups()
line_gbps = int(value) * {"k": 1e3, "m": 1e6, "g": 1e9}[unit] / 8 / 1e9  # GB/s
# Buffers of an allreduce that leave the busiest host in each direction, ranks placed host by
# host, powers of two: the flat ring crosses each host boundary once each way with 2(W-1)/W;
# Rabenseifner, nearest partner first, 2(H-1)/H; recursive doubling the whole buffer from
# each rank of a host at each of its log2 H steps between hosts; the hierarchical backend's
# leaders 2(H-1)/H. A 16-bit wire halves them. Gloo and Open MPI: not modelled.
def share(algorithm):
    if backend == "hierarchical":
        return 2 * (hosts - 1) / hosts
    if backend != "asio-ring":
        return None
    return {"ring": 2 * (world - 1) / world, "rabenseifner": 2 * (hosts - 1) / hosts,
            "recursive_doubling": per_host * math.log2(hosts)}.get(algorithm)
wire_factor = 0.5 if wire in ("bf16", "f16") else 1.0
for r in report["results"]:
    assert r["wrong"] == 0, r
    seconds = r["median_us"] / 1e6
    s = share(r.get("algorithm", ""))
    link = "–" if s is None else f"{s * wire_factor * r['bytes'] / seconds / 1e9 / line_gbps:.2f}"
    size = f"{r['bytes'] >> 20} MiB" if r["bytes"] >= 1 << 20 else f"{r['bytes'] >> 10} KiB"
    print(f"| {rate} | {hosts} x {per_host} | {backend} ({r.get('algorithm', '?')}) | {wire} | {size} | "
          f"{seconds * 1e3:.2f} | {r['busbw_gbps']:.3f} | {r['busbw_gbps'] / line_gbps:.2f} | {link} |")
PY
}

port=29700
if [ "${ALLREDUCE:-1}" = 1 ]; then
  sizes=${ALLREDUCE_SIZES:-1M,4M,16M}
  echo "| link | ranks | backend (algorithm) | wire | size | median ms | busbw GB/s | busbw / line rate | link bytes per direction / line rate |"
  echo "|---|---|---|---|---|--:|--:|--:|--:|"
  for rate in $rates; do
    set_rate "$rate"
    for variant in $variants; do
      parse_variant "$variant"
      [ "$compress" = none ] || continue  # compression is a training setting
      port=$((port + 1))
      if [ "$backend" = mpi ]; then
        mpi_allreduce "$sizes" "$rate"
        continue
      fi
      args=(bench allreduce --backend "$backend" --wire-dtype "$wire" --world "$world" --sizes "$sizes"
            --iters "${ITERS:-0}" --warmup 3 --nnodes "$nhosts" --master-addr 10.78.0.1 --master-port "$port")
      [[ $backend == gloo || -z ${ALGORITHM:-} ]] || args+=(--algorithm "$ALGORITHM")
      [[ $backend == gloo ]] || args+=(--tcp-congestion "${TCP_CONGESTION:-system}")
      args+=(--bind "${BIND:-auto}" --timing "${TIMING:-each}")
      extra0=(--json "$work/bench.json"); extra1=()
      on_all bench 600
      allreduce_rows "$work/bench.json" "$rate" "$backend" "$wire"
    done
  done
  echo
fi
[ "${TRAIN:-1}" = 1 ] || exit 0
echo "| link | ranks | backend | wire | compression | gradient MB sent per step | images/s (epoch 2) | epoch 2 s | comm wait per step, ms (max over ranks) |"
echo "|---|---|---|---|---|--:|---:|---:|---:|"
for rate in $rates; do
  set_rate "$rate"
  for variant in $variants; do
    parse_variant "$variant"
    port=$((port + 1))
    compression=()
    if [ "$compress" != none ]; then
      compression=(--set comm.compression=powersgd --set "comm.powersgd_rank=${compress#powersgd}"
                   --set "comm.powersgd_start_step=${POWERSGD_START:-10}")
    fi
    args=(run "$work/cfg.yaml" --set "comm.backend=$backend" --set "comm.wire_dtype=$wire"
          "${compression[@]}" --nnodes "$nhosts" --nproc-per-node "$per_host" --master-addr 10.78.0.1 --master-port "$port")
    args+=(--set "comm.tcp_congestion=${TCP_CONGESTION:-system}" --set "launch.bind=${BIND:-auto}")
    extra0=(--output "$work/out0"); extra1=(--output "$work/out%i")
    [ "${BASELINE:-0}" = 1 ] && extra0+=(--with-baseline)
    on_all run 900
    python3 - "$work/out0/report.json" "$rate" "$backend" "$wire" "$per_host" "$compress" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
last = report["epochs"][-1]
used = report["env"]["backend"]
steps = sum(e["steps"] for e in report["epochs"])
wait = max(r["comm_wait_seconds"] for r in report["ranks"]) / steps * 1e3
# With compression, report.json gives the bytes a rank hands to the allreduces per step, and
# the plain allreduce's; the bf16 wire halves both. Without it the report has no such field.
c = report.get("compression")
wire_factor = 0.5 if sys.argv[4] in ("bf16", "f16") else 1.0
sent = "–" if not c else (f"{c['bytes_per_step'] * wire_factor / 1e6:.2f} of "
                          f"{c['uncompressed_bytes_per_step'] * wire_factor / 1e6:.2f}")
print(f"| {sys.argv[2]} | {len(report['ranks']) // int(sys.argv[5])} x {sys.argv[5]} | {sys.argv[3]}{'' if used == sys.argv[3] else ' (' + used + ')'} | "
      f"{sys.argv[4]} | {sys.argv[6]} | {sent} | "
      f"{last['train_images_per_s']:.0f} | {last['train_seconds']:.1f} | {wait:.0f} |")
PY
    if [ -n "${EXPLAIN_DIR:-}" ]; then
      mkdir -p "$EXPLAIN_DIR"
      "$exe" explain "$work/out0/report.json" > "$EXPLAIN_DIR/$rate-${variant//:/-}.txt"
      "$exe" explain "$work/out0/report.json" --json > "$EXPLAIN_DIR/$rate-${variant//:/-}.json"
    fi
  done
done
