#!/usr/bin/env bash
# The malloc under DDP training: partrain as built (tcmalloc linked in, cli/CMakeLists.txt)
# against the same code linked with the C library's malloc (-DPARTRAIN_MALLOC=system, built
# here into build-malloc-system; ccache makes that a link), and that build with jemalloc
# preloaded (Debian's libjemalloc2). Same config, data and seed for all; the contenders
# alternate within each repetition. Prints per contender: training images/s (median over runs
# of the median of epochs 2..N), peak RSS per rank (max over ranks, median over runs), the
# ratios to the default build, and whether the losses are the same bits.
#
#   OUT=/tmp/bench-alloc REPS=3 bench/ddp/allocators.sh
set -euo pipefail
# shellcheck source=bench/ddp/common.sh
. "$(dirname "$0")/common.sh"
prepare allocators
REPS=${REPS:-3}
JEMALLOC=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
[[ -f $JEMALLOC ]] || { echo "missing $JEMALLOC (scripts/setup.sh installs it)" >&2; exit 1; }
"$EXE" version | grep -q '^malloc: tcmalloc' || { echo "$EXE is not linked with tcmalloc" >&2; exit 1; }

echo "== building the system-malloc twin in $ROOT/build-malloc-system" >&2
cmake -S "$ROOT" -B "$ROOT/build-malloc-system" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPARTRAIN_BUILD_TESTS=OFF -DPARTRAIN_MALLOC=system > "$OUT/twin-build.log"
cmake --build "$ROOT/build-malloc-system" -j"${JOBS:-2}" --target partrain >> "$OUT/twin-build.log"
DEFAULT_EXE=$EXE
SYSTEM_EXE=$OUT/partrain-system
cp "$ROOT/build-malloc-system/partrain" "$SYSTEM_EXE"

for rep in $(seq 1 "$REPS"); do
  EXE=$DEFAULT_EXE run_partrain "tcmalloc-$rep" 2
  EXE=$SYSTEM_EXE run_partrain "glibc-$rep" 2
  EXE=$SYSTEM_EXE LD_PRELOAD=$JEMALLOC run_partrain "jemalloc-$rep" 2
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"

"$PY" - "$OUT" "$REPS" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
rows = {}
for name in ["tcmalloc", "glibc", "jemalloc"]:
    rates, rss, losses = [], [], []
    for rep in range(1, reps + 1):
        report = json.load(open(f"{out}/{name}-{rep}/report.json"))
        epochs = report["epochs"]
        rates.append(statistics.median(e["train_images_per_s"] for e in epochs[1:] or epochs))
        rss.append(max(r["peak_rss_mb"] for r in report["ranks"]))
        losses.append(tuple(e["train_loss"] for e in epochs))
    rows[name] = (statistics.median(rates), rates, statistics.median(rss), rss, losses[0])
base = rows["tcmalloc"]
print(open(f"{out}/machine.txt").read().strip())
print()
print("| malloc | train img/s | per run | peak RSS per rank (MiB) | per run | img/s vs tcmalloc | RSS vs tcmalloc | same losses |")
print("|---|--:|---|--:|---|--:|--:|---|")
for name, (rate, rates, rss, rss_runs, loss) in rows.items():
    print(f"| {name} | {rate:.0f} | {', '.join(f'{r:.0f}' for r in rates)} | {rss:.0f} | "
          f"{', '.join(f'{r:.0f}' for r in rss_runs)} | {rate / base[0]:.2f}x | {rss / base[2]:.2f} | "
          f"{'yes' if loss == base[4] else 'no'} |")
PY
