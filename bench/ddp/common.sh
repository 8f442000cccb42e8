# shellcheck shell=bash
# Sourced by the bench/ddp scripts: where things are, a private copy of the executable, the
# synthetic CIFAR-100 files, a note of the machine, and one function per contender.
# Env: PARTRAIN (executable to copy; default build/partrain), OUT (results folder),
#      PEER_DIR (default bench/peers/python_ddp), PY (default /usr/bin/python3: the
#      Debian python with torch 1.13 and torchvision).
set -euo pipefail
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/../.." && pwd)
PEER_DIR=${PEER_DIR:-$ROOT/bench/peers/python_ddp}
PY=${PY:-/usr/bin/python3}
CONFIG=$BENCH_DIR/cifar100_synth_w16.yaml

# prepare OUT_NAME: makes $OUT, copies the executable there (the build folder may be rebuilt
# while a benchmark runs) and writes the synthetic data set both contenders read.
prepare() {
  OUT=${OUT:-/tmp/bench-ddp/$1}
  mkdir -p "$OUT"
  local src=${PARTRAIN:-$ROOT/build/partrain}
  local tries=0
  while [[ ! -x $src ]]; do
    (( ++tries > 10 )) && { echo "no executable at $src" >&2; exit 1; }
    echo "waiting for $src" >&2; sleep 30
  done
  cp "$src" "$OUT/partrain"
  EXE=$OUT/partrain
  DATA=$OUT/c100
  if [[ ! -f $DATA/train.bin ]]; then
    "$EXE" data synth --format cifar100-bin --out "$DATA" --train 5000 --test 1000 --seed 0 >&2
  fi
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -srm), $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
    echo "memory: $(free -g | awk '/Mem:/ {print $2}') GiB"
    echo "partrain: $("$EXE" version | tr '\n' ' ')(md5 $(md5sum < "$EXE" | cut -c1-12), built $(date -u -r "$src" +%Y-%m-%dT%H:%M:%SZ))"
    echo "peer: torch $("$PY" -c 'import torch; print(torch.__version__)'), $("$PY" --version)"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  } > "$OUT/machine.txt"
}

# run_partrain TAG NPROC [--set k=v]...: trains $CONFIG into $OUT/TAG (report.json there).
# Each run's wall time and the CPU seconds of it and all its processes (user, system) go to
# $OUT/TAG.time: a figure the load of other users of the machine disturbs less than img/s.
run_partrain() {
  local tag=$1 nproc=$2
  shift 2
  rm -rf "${OUT:?}/$tag"
  echo "== $tag: partrain, $nproc rank(s) $*" >&2
  OMP_NUM_THREADS=1 /usr/bin/time -o "$OUT/$tag.time" -f '%e %U %S %M' "$EXE" run "$CONFIG" --nproc-per-node "$nproc" --output "$OUT/$tag" \
    --set "data.root=$DATA" "$@" > "$OUT/$tag.log" 2>&1 || { tail -20 "$OUT/$tag.log" >&2; return 1; }
  tail -1 "$OUT/$tag.log" >&2
}

# run_peer TAG NPROC ddp_peer.py-args...: the Python DDP peer under torch's launcher, same data.
run_peer() {
  local tag=$1 nproc=$2
  shift 2
  echo "== $tag: python ddp, $nproc rank(s) $*" >&2
  # torch 1.13's launcher on Python 3.11 crashes unless --redirects/--tee are given
  OMP_NUM_THREADS=1 /usr/bin/time -o "$OUT/$tag.time" -f '%e %U %S %M' \
    "$PY" -m torch.distributed.launch --redirects 2 --tee 2 --nnodes=1 \
    --nproc_per_node="$nproc" --master_port "$(free_port)" "$PEER_DIR/ddp_peer.py" \
    --dataset cifar100-bin --data-dir "$DATA" --width 16 --threads 1 --seed 0 "$@" \
    > "$OUT/$tag.log" 2>&1 || { tail -20 "$OUT/$tag.log" >&2; return 1; }
  grep '# summary' "$OUT/$tag.log" >&2
}

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

finish() {
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
}
