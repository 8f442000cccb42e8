#!/usr/bin/env bash
# The CPU allocator under DDP training: partrain's caching allocator against glibc's malloc,
# jemalloc and tcmalloc (Debian's libjemalloc2 and libtcmalloc-minimal4, preloaded into the
# launcher and its ranks with PARTRAIN_CPU_ALLOCATOR=system, so LibTorch's default allocator
# calls them). Same config, data and seed for all; the contenders alternate within each
# repetition. Prints per contender: training images/s (median over runs of the median of
# epochs 2..N), peak RSS per rank (max over ranks, median over runs), and the ratios to the
# caching allocator.
#
#   OUT=/tmp/bench-alloc REPS=3 bench/ddp/allocators.sh
set -euo pipefail
# shellcheck source=bench/ddp/common.sh
. "$(dirname "$0")/common.sh"
prepare allocators
REPS=${REPS:-3}
LIB=/usr/lib/x86_64-linux-gnu
JEMALLOC=$LIB/libjemalloc.so.2
TCMALLOC=$LIB/libtcmalloc_minimal.so.4
for lib in "$JEMALLOC" "$TCMALLOC"; do
  [[ -f $lib ]] || { echo "missing $lib (scripts/setup.sh installs it)" >&2; exit 1; }
done

for rep in $(seq 1 "$REPS"); do
  PARTRAIN_CPU_ALLOCATOR=caching run_partrain "caching-$rep" 2
  PARTRAIN_CPU_ALLOCATOR=system run_partrain "glibc-$rep" 2
  PARTRAIN_CPU_ALLOCATOR=system LD_PRELOAD=$JEMALLOC run_partrain "jemalloc-$rep" 2
  PARTRAIN_CPU_ALLOCATOR=system LD_PRELOAD=$TCMALLOC run_partrain "tcmalloc-$rep" 2
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"

"$PY" - "$OUT" "$REPS" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
rows = {}
for name in ["caching", "glibc", "jemalloc", "tcmalloc"]:
    rates, rss, losses = [], [], []
    for rep in range(1, reps + 1):
        report = json.load(open(f"{out}/{name}-{rep}/report.json"))
        epochs = report["epochs"]
        rates.append(statistics.median(e["train_images_per_s"] for e in epochs[1:] or epochs))
        rss.append(max(r["peak_rss_mb"] for r in report["ranks"]))
        losses.append(tuple(e["train_loss"] for e in epochs))
    rows[name] = (statistics.median(rates), rates, statistics.median(rss), rss, len(set(losses)) == 1, losses[0])
base = rows["caching"]
print(open(f"{out}/machine.txt").read().strip())
print()
print("| allocator | train img/s | per run | peak RSS per rank (MiB) | per run | img/s vs caching | RSS vs caching | same losses as caching |")
print("|---|--:|---|--:|---|--:|--:|---|")
for name, (rate, rates, rss, rss_runs, stable, loss) in rows.items():
    print(f"| {name} | {rate:.0f} | {', '.join(f'{r:.0f}' for r in rates)} | {rss:.0f} | "
          f"{', '.join(f'{r:.0f}' for r in rss_runs)} | {rate / base[0]:.2f}x | {rss / base[2]:.2f} | "
          f"{'yes' if loss == base[5] else 'no'} |")
PY
