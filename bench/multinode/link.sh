#!/usr/bin/env bash
# Two test hosts joined by a rate-limited link: two network namespaces, a veth pair, a token
# bucket (tc tbf) on each end's egress. For each link rate and backend/wire format:
#   * `partrain bench allreduce` across the two hosts (RANKS_PER_HOST ranks each, default 1),
#     busbw against the line rate (ALLREDUCE_SIZES; ALLREDUCE=0 skips it), and the bytes that
#     cross the link per direction against the line rate;
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
# Env: PARTRAIN (the executable; default build/partrain), ALGORITHM (comm.algorithm for the
# asio-ring and hierarchical allreduce runs: ring, recursive_doubling, rabenseifner; default auto).
set -euo pipefail
cd "$(dirname "$0")/../.."
rates=${1:-"1gbit 200mbit"}
variants=${2:-"asio-ring:f32 asio-ring:bf16 gloo:f32"}
exe=${PARTRAIN:-$(pwd)/build/partrain}
per_host=${RANKS_PER_HOST:-1}
world=$((2 * per_host))
[ "$(id -u)" -eq 0 ] || { echo "link.sh: needs root (network namespaces)" >&2; exit 2; }
id=$$
a=ptb${id}a; b=ptb${id}b
work=$(mktemp -d /tmp/partrain-link-XXXXXX)
cleanup() {
  for ns in "$a" "$b"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$a"; ip netns add "$b"
ip link add "${a}v" type veth peer name "${b}v"
ip link set "${a}v" netns "$a"; ip link set "${b}v" netns "$b"
ip -n "$a" addr add 10.78.0.1/24 dev "${a}v"; ip -n "$b" addr add 10.78.0.2/24 dev "${b}v"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "${a}v" up; ip -n "$b" link set "${b}v" up

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

# set_rate RATE: the token bucket on both ends of the link.
set_rate() {
  for ns in "$a" "$b"; do
    ip netns exec "$ns" tc qdisc replace dev "${ns}v" root tbf rate "$1" burst 256kb latency 50ms
  done
}

# parse_variant BACKEND:WIRE[:powersgdR]: sets backend, wire and compress (none or powersgdR).
parse_variant() {
  local rest=${1#*:}
  backend=${1%%:*}; wire=${rest%%:*}; compress=none
  [ "$rest" = "$wire" ] || compress=${rest#*:}
}

# on_both WHAT BOUND_S: runs "${args[@]}" on both hosts, node 0 with "${extra0[@]}" and node 1
# with "${extra1[@]}", logs in $work/WHAT0.log and WHAT1.log; stops the script if either fails.
on_both() {
  local what=$1 bound=$2 p0 p1
  ip netns exec "$a" timeout "$bound" "$exe" "${args[@]}" --node-rank 0 "${extra0[@]}" > "$work/${what}0.log" 2>&1 &
  p0=$!
  ip netns exec "$b" timeout "$bound" "$exe" "${args[@]}" --node-rank 1 "${extra1[@]}" > "$work/${what}1.log" 2>&1 &
  p1=$!
  if ! wait "$p0" || ! wait "$p1"; then
    echo "link.sh: $what failed ($rate $variant):" >&2; tail -n 5 "$work/${what}0.log" "$work/${what}1.log" >&2; exit 1
  fi
}

port=29700
if [ "${ALLREDUCE:-1}" = 1 ]; then
  sizes=${ALLREDUCE_SIZES:-1M,4M,16M}
  echo "| link | ranks | backend | wire | size | median ms | busbw GB/s | busbw / line rate | link bytes per direction / line rate |"
  echo "|---|---|---|---|---|--:|--:|--:|--:|"
  for rate in $rates; do
    set_rate "$rate"
    for variant in $variants; do
      parse_variant "$variant"
      [ "$compress" = none ] || continue  # compression is a training setting
      port=$((port + 1))
      args=(bench allreduce --backend "$backend" --wire-dtype "$wire" --world "$world" --sizes "$sizes"
            --iters 5 --warmup 1 --nnodes 2 --master-addr 10.78.0.1 --master-port "$port")
      [[ $backend == gloo || -z ${ALGORITHM:-} ]] || args+=(--algorithm "$ALGORITHM")
      extra0=(--host 10.78.0.1 --json "$work/bench.json"); extra1=(--host 10.78.0.2)
      on_both bench 600
      python3 - "$work/bench.json" "$rate" "$backend" "$wire" "$per_host" <<'PY'
import json, re, sys
report, rate, backend, wire = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4]
per_host = int(sys.argv[5])
world, hosts = 2 * per_host, 2
value, unit = re.fullmatch(r"(\d+)([kmg])bit", rate).groups()
line_gbps = int(value) * {"k": 1e3, "m": 1e6, "g": 1e9}[unit] / 8 / 1e9  # GB/s
# Bytes of an allreduce of S bytes that cross the link in each direction: the flat ring over
# ranks placed host by host crosses it once each way, carrying 2(W-1)/W S; the hierarchical
# backend's ring of host leaders 2(H-1)/H S. A 16-bit wire halves them. Gloo: not modelled.
share = {"asio-ring": 2 * (world - 1) / world, "hierarchical": 2 * (hosts - 1) / hosts,
         "shm": None, "gloo": None}.get(backend)
wire_factor = 0.5 if wire in ("bf16", "f16") else 1.0
for r in report["results"]:
    assert r["wrong"] == 0, r
    seconds = r["median_us"] / 1e6
    link = "–" if share is None else f"{share * wire_factor * r['bytes'] / seconds / 1e9 / line_gbps:.2f}"
    print(f"| {rate} | {hosts} x {per_host} | {backend} | {wire} | {r['bytes'] >> 20} MiB | "
          f"{seconds * 1e3:.1f} | {r['busbw_gbps']:.3f} | {r['busbw_gbps'] / line_gbps:.2f} | {link} |")
PY
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
          "${compression[@]}" --nnodes 2 --nproc-per-node "$per_host" --master-addr 10.78.0.1 --master-port "$port")
    extra0=(--output "$work/out0"); extra1=(--output "$work/out1")
    [ "${BASELINE:-0}" = 1 ] && extra0+=(--with-baseline)
    on_both run 900
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
print(f"| {sys.argv[2]} | 2 x {sys.argv[5]} | {sys.argv[3]}{'' if used == sys.argv[3] else ' (' + used + ')'} | "
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
