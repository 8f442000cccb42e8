#!/usr/bin/env bash
# The reference pair on this CPU machine (configs/cpu_pair.yaml: 2 ranks x batch 64 against one
# process x batch 128, one thread each), once per backend, each with its single-device twin
# (--with-baseline), then what `partrain explain` says of each pair: the speed-up over the
# twin and the parts of the gap to the ideal. gloo over a file store is the reference's
# Windows run (Gloo, FileStore); shm is what `auto` takes on one host.
#
#   OUT=/tmp/pair flock /tmp/partrain-cpu.lock bench/parity/pair_explain.sh
#   BACKENDS="gloo shm asio-ring" EPOCHS=5 bench/parity/pair_explain.sh
# Env: PARTRAIN (default build/partrain), OUT (default /tmp/bench-pair), BACKENDS (default
# "gloo shm"), EPOCHS (default the config's 3), REPS (runs of each backend, default 1).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/bench-pair}
BACKENDS=${BACKENDS:-gloo shm}
REPS=${REPS:-1}
mkdir -p "$OUT"
cp "${PARTRAIN:-$ROOT/build/partrain}" "$OUT/partrain"
EXE=$OUT/partrain
extra=()
[[ -z ${EPOCHS:-} ]] || extra+=(--set "train.epochs=$EPOCHS")
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm), $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"
read -ra backends <<< "$BACKENDS"
for rep in $(seq 1 "$REPS"); do
  for backend in "${backends[@]}"; do
    run=$OUT/$backend-$rep
    rm -rf "$run"
    echo "== $backend (run $rep)" >&2
    (cd "$ROOT" && "$EXE" run configs/cpu_pair.yaml --with-baseline --output "$run" \
      --set comm.backend="$backend" "${extra[@]}") > "$run.log" 2>&1 ||
      { tail -20 "$run.log" >&2; exit 1; }
    "$EXE" explain "$run/report.json" > "$run.explain.txt"
    "$EXE" explain "$run/report.json" --json > "$run.explain.json"
  done
done
cat "$OUT/machine.txt"
python3 - "$OUT" "$REPS" "${backends[@]}" <<'PY'
import json, sys
out, reps, backends = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
runs = [(b, r) for r in range(1, reps + 1) for b in backends]
parts = None
rows = []
for b, r in runs:
    e = json.load(open(f"{out}/{b}-{r}.explain.json"))
    sc = e["scaling"]
    parts = parts or list(sc["parts"])
    rows.append((f"{b} #{r}", sc, e["verdict"]["cause"]))
print()
print("| run | speed-up | ideal | gap | " + " | ".join(parts) + " | verdict |")
print("|---|--:|--:|--:|" + "--:|" * len(parts) + "---|")
for name, sc, cause in rows:
    cells = " | ".join(f"{sc['parts'][p]:+.3f}" for p in parts)
    print(f"| {name} | {sc['speedup']:.3f}x | {sc['ideal']:.2f}x | {sc['gap']:.3f} | {cells} | {cause} |")
PY
