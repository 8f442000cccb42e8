#!/usr/bin/env bash
# partrain's own network path (asio-ring: the peer transport, the algorithm chosen per call)
# against Open MPI's MPI_Allreduce over its TCP transport on loopback (its tuned decision rules;
# bench/peers/collectives/mpi_bench.cc built with Debian's mpicxx) and partrain's Gloo backend,
# one after the other in the same run, per world size; then every algorithm forced in turn
# (--algorithm ring | recursive_doubling | rabenseifner), whose times fit a latency/bandwidth
# model: t = s * (alpha * messages + (beta_1 * f_1 + beta_2 * f_2 + beta_mem * f_mem) * bytes
# through the busiest rank's link) + (s - 1) * kappa * messages (the counts are cost_terms() of
# comm_backends/algorithms/algorithm_choice.cpp, in each JSON row's "terms"; s = max(1, W /
# cores) on one host, whose W ranks share its cores; kappa: the wait, for each message, behind
# another rank on the core of the rank it wakes; f_1, f_2, f_mem: the shares of the ranks'
# buffers that the host's first and second cache level hold and that come from memory, Note
# [The cache term] in cost_model.py). The fit uses the world sizes in FIT_WORLDS; every run is
# then predicted by it, which gives how far off the model is on runs it was fitted to and on the
# ones it was not (a larger W), and on another run (CHECK_OUT), with each point more than 25 %
# off listed. Last, the model projects each algorithm to W = 64 ... 1024, one rank per host.
#
# Usage: bench/allreduce/model.sh [BUILD_DIR] [SIZES] [WORLDS]
#   SIZES      default 4K,64K,1M,16M,64M
#   WORLDS     default "2 4 8 16"
# Env: OUT (default BUILD_DIR/bench-model), ROUNDS (default 2, best median kept),
#      FIT_WORLDS (default "2 4 8"), LARGE_W_SIZES (default 4K,64K,1M,16M: the sizes for W >= 16,
#      where 64 MiB by every algorithm takes minutes on a 2-core machine), REPORT_ONLY=1 (prints
#      the tables and the fit again from the results already in OUT), CACHE_LEVELS (default 2;
#      1 is the one-level form), CACHE_BYTES (the effective cache sizes, ascending, comma-
#      separated, one per level; default: the best fit), CHECK_OUT (another run's OUT, made with
#      the same WORLDS and ROUNDS: how far this run's fit is off on it)
set -euo pipefail
source "$(dirname "$0")/common.sh"
if [[ ${REPORT_ONLY:-0} != 1 ]]; then
  allreduce_setup bench-model "${1:-}" "${2:-}" "${3:-2 4 8 16}"
else
  ROOT=$(cd "$(dirname "$0")/../.." && pwd)
  OUT=${OUT:-$(cd "${1:-$ROOT/build}" && pwd)/bench-model}
  WORLDS=${3:-"2 4 8 16"}
  ROUNDS=${ROUNDS:-2}
fi
FIT_WORLDS=${FIT_WORLDS:-"2 4 8"}
LARGE_W_SIZES=${LARGE_W_SIZES:-4K,64K,1M,16M}
command -v mpicxx > /dev/null || { echo "model.sh: mpicxx is missing (scripts/setup.sh installs libopenmpi-dev)" >&2; exit 1; }
MPI_BENCH=$OUT/mpi_bench
[[ -x $MPI_BENCH ]] || mpicxx -O3 -march=native -std=c++17 -o "$MPI_BENCH" "$PEERS_DIR/mpi_bench.cc"

for ((R=1; R<=ROUNDS; R++)); do
  [[ ${REPORT_ONLY:-0} == 1 ]] && break
  for W in $WORLDS; do
    sizes=$SIZES
    ((W >= 16)) && sizes=$LARGE_W_SIZES
    echo "== round $R W=$W partrain (asio-ring auto, gloo)" >&2
    "$BUILD/partrain" bench allreduce --backend asio-ring,gloo --world "$W" --sizes "$sizes" \
      --json "$OUT/auto_w${W}_r$R.json" >&2
    for A in ring recursive_doubling rabenseifner; do
      echo "== round $R W=$W partrain asio-ring --algorithm $A" >&2
      "$BUILD/partrain" bench allreduce --backend asio-ring --algorithm "$A" --world "$W" \
        --sizes "$sizes" --json "$OUT/${A}_w${W}_r$R.json" >&2
    done
    echo "== round $R W=$W Open MPI over TCP (loopback)" >&2
    mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo -np "$W" \
      --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo \
      "$MPI_BENCH" "$(to_bytes "$sizes")" > "$OUT/mpi_w${W}_r$R.txt"
    cat "$OUT/mpi_w${W}_r$R.txt" >&2
  done
done
[[ ${REPORT_ONLY:-0} == 1 ]] || note_load_after

PYTHONPATH="$(cd "$(dirname "$0")" && pwd)${PYTHONPATH:+:$PYTHONPATH}" \
  python3 - "$OUT" "$WORLDS" "$ROUNDS" "$FIT_WORLDS" "$(nproc)" <<'PY'
import json, os, sys
import itertools
from cost_model import CACHE_SIZES, allreduce_terms, cache_levels, least_squares_nonnegative, size_name
out, worlds, rounds = sys.argv[1], [int(w) for w in sys.argv[2].split()], int(sys.argv[3])
fit_worlds = {int(w) for w in sys.argv[4].split()}
cores = int(sys.argv[5])
print(open(f"{out}/machine.txt").read().strip())

def load(out):
    """(world, contender, bytes) -> the row of the round with the least median (median_us,
    busbw, algorithm, terms) of one run's results."""
    best = {}
    def keep(w, name, row):
        assert row["wrong"] == 0, f"W={w} {name} {row['bytes']}: wrong results"
        key = (w, name, row["bytes"])
        row["_w"] = w
        if key not in best or row["median_us"] < best[key]["median_us"]:
            best[key] = row
    for w in worlds:
        for r in range(1, rounds + 1):
            for row in json.load(open(f"{out}/auto_w{w}_r{r}.json"))["results"]:
                keep(w, row["backend"], row)
            for a in ["ring", "recursive_doubling", "rabenseifner"]:
                for row in json.load(open(f"{out}/{a}_w{w}_r{r}.json"))["results"]:
                    keep(w, a, row)
            for line in open(f"{out}/mpi_w{w}_r{r}.txt"):
                f = line.split()
                if line.startswith("#") or len(f) < 8 or not f[0].isdigit():
                    continue
                keep(w, "mpi-tcp", {"bytes": int(f[0]), "median_us": float(f[3]),
                                    "busbw_gbps": float(f[6]), "wrong": 0 if f[7] == "OK" else 1})
    return best

best = load(out)

print("\n## partrain (asio-ring, algorithm chosen per call) against Open MPI over TCP and Gloo")
print(f"median us of one allreduce (best of {rounds} rounds); ratio = Open MPI's time / partrain's "
      "(>= 1: partrain at or below Open MPI), busbw ratio = partrain's / Gloo's")
for w in worlds:
    sizes = sorted({b for (ww, n, b) in best if ww == w and n == "asio-ring"})
    print(f"\nW={w}\n")
    print("| size | partrain (algorithm) | Open MPI tcp | Gloo | Open MPI / partrain | busbw partrain / Gloo |")
    print("|---|--:|--:|--:|--:|--:|")
    for b in sizes:
        p, m, g = (best.get((w, n, b)) for n in ["asio-ring", "mpi-tcp", "gloo"])
        print(f"| {size_name(b)} | {p['median_us']:.1f} ({p['algorithm']}) | "
              f"{m['median_us'] if m else float('nan'):.1f} | {g['median_us'] if g else float('nan'):.1f} | "
              f"{(m['median_us'] / p['median_us']) if m else float('nan'):.2f} | "
              f"{(p['busbw_gbps'] / g['busbw_gbps']) if g and g['busbw_gbps'] > 0 else float('nan'):.2f} |")

# The model, per algorithm, least squares of median seconds over the fit worlds, each point
# weighted by 1/t so that small and large messages count alike (the error that matters is
# relative):
#   t = s * (alpha * messages + (beta_1 * f_1 + ... + beta_mem * f_mem) * bytes)
#       + (s - 1) * kappa * messages
# On one host the W ranks share its cores: a rank runs s = max(1, W / cores) times slower than
# on a core of its own, and the counts are scaled by it. Past one rank a core, each message
# also waits for the core of the rank it wakes, behind the s - 1 others there (kappa); a rank
# with a core of its own never does, and the term grows from 0 at W = cores rather than
# jumping there. f_1 ... f_mem = cache_levels(W * n, caches): the W ranks' buffers against the
# host's effective cache sizes (Note [The cache term] in cost_model.py), the CACHE_LEVELS sizes
# of CACHE_SIZES whose fit is the least off on the fit worlds, or CACHE_BYTES. A negative
# coefficient is dropped.
def share(w):
    return max(1.0, w / cores)
def features(terms, w, n, caches):
    s = share(w)
    return ([s * terms["messages"]] + [s * terms["bytes_moved"] * f for f in cache_levels(w * n, caches)]
            + [(s - 1) * terms["messages"]])
algorithms = ["ring", "recursive_doubling", "rabenseifner"]

def fit_all(caches):
    fits = {}
    for a in algorithms:
        rows = [(features(r["terms"], r["_w"], b, caches), r["median_us"] * 1e-6, r["median_us"] * 1e-6)
                for (w, n, b), r in best.items() if n == a and w in fit_worlds]
        fits[a] = least_squares_nonnegative(rows, len(caches) + 3)
    return fits

def predict(fits, a, terms, w, n, caches):
    return sum(c * x for c, x in zip(fits[a], features(terms, w, n, caches)))

def rel_error(fits, a, r, w, b, caches):
    t = r["median_us"] * 1e-6
    return abs(predict(fits, a, r["terms"], w, b, caches) - t) / t

def mean_error_fitted(fits, caches):
    es = [rel_error(fits, n, r, w, b, caches) for (w, n, b), r in best.items()
          if n in algorithms and w in fit_worlds]
    return sum(es) / len(es)

if os.environ.get("CACHE_BYTES"):
    caches = sorted(float(c) for c in os.environ["CACHE_BYTES"].split(","))
    fits = fit_all(caches)
else:
    levels = int(os.environ.get("CACHE_LEVELS", "2"))
    caches, fits = min(((list(cs), fit_all(list(cs))) for cs in itertools.combinations(CACHE_SIZES, levels)),
                       key=lambda cf: mean_error_fitted(cf[1], cf[0]))
level_names = [f"C{i + 1}" for i in range(len(caches))]

print(f"\n## The model fitted on W = {sorted(fit_worlds)}, effective cache sizes "
      + ", ".join(f"{name} = {size_name(int(c))}" for name, c in zip(level_names, caches))
      + (" (CACHE_BYTES)" if os.environ.get("CACHE_BYTES") else " (the best fit of 1 MiB ... 256 MiB)") + "\n")
print("| algorithm | alpha (us per message) | "
      + " | ".join(f"beta in {name} (ns per byte)" for name in level_names)
      + " | beta from memory (ns per byte) | kappa (us per message, shared cores) | mean abs error, fitted W | max | mean abs error, other W | max |")
print("|---|" + "--:|" * (len(caches) + 8))
for a in algorithms:
    errs_in, errs_out = [], []
    for (w, n, b), r in best.items():
        if n == a:
            (errs_in if w in fit_worlds else errs_out).append(rel_error(fits, a, r, w, b, caches))
    fmt = lambda es: (f"{100 * sum(es) / len(es):.0f} % | {100 * max(es):.0f} %" if es else "- | -")
    alpha, *betas, kappa = fits[a]
    print(f"| {a} | {alpha * 1e6:.1f} | " + " | ".join(f"{beta * 1e9:.3f}" for beta in betas)
          + f" | {kappa * 1e6:.1f} | {fmt(errs_in)} | {fmt(errs_out)} |")

# What the cache levels are fitted to: the ring's time per byte moved, once its fitted message
# terms are taken off, by the footprint W x n (sizes of 1 MiB up, where the bytes dominate).
print("\nThe ring's time per byte moved, once the fitted alpha and kappa terms are taken off, "
      "by footprint (W x n; s = max(1, W / cores)):\n")
print("| W | size | footprint | ns per byte moved |")
print("|--:|---|---|--:|")
for (w, n, b), r in sorted(best.items(), key=lambda kv: (kv[0][0] * kv[0][2], kv[0][0])):
    if n == "ring" and b >= 1 << 20:
        alpha, *_, kappa = fits["ring"]
        m = r["terms"]["messages"]
        per_byte = (r["median_us"] * 1e-6 - share(w) * alpha * m - (share(w) - 1) * kappa * m) / (
            share(w) * r["terms"]["bytes_moved"])
        print(f"| {w} | {size_name(b)} | {size_name(w * b)} | {per_byte * 1e9:.3f} |")

print("\nMean abs error by world size (every size of each algorithm):\n")
print("| algorithm | " + " | ".join(f"W={w}" for w in worlds) + " |")
print("|---|" + "--:|" * len(worlds))
for a in algorithms:
    cells = []
    for w in worlds:
        es = [rel_error(fits, a, r, ww, b, caches) for (ww, n, b), r in best.items() if n == a and ww == w]
        cells.append(f"{100 * sum(es) / len(es):.0f} %" if es else "-")
    print(f"| {a} | " + " | ".join(cells) + " |")

# The points the model misses by more than a quarter, on this run and on CHECK_OUT's.
def far_off(run, label):
    cells = [(w, a, b, r["median_us"], 1e6 * predict(fits, a, r["terms"], w, b, caches))
             for (w, a, b), r in sorted(run.items()) if a in algorithms]
    misses = [c for c in cells if abs(c[4] - c[3]) > 0.25 * c[3]]
    print(f"\nMore than 25 % off, {label}: {len(misses)} of {len(cells)} points\n")
    if misses:
        print("| W | algorithm | size | measured us | model us | off |")
        print("|--:|---|---|--:|--:|--:|")
    for w, a, b, t, p in misses:
        print(f"| {w} | {a} | {size_name(b)} | {t:.1f} | {p:.1f} | {100 * (p - t) / t:+.0f} % |")

far_off(best, "this run")

# Another run (CHECK_OUT, made with the same WORLDS and ROUNDS) predicted by this run's fit.
if os.environ.get("CHECK_OUT"):
    other = load(os.environ["CHECK_OUT"])
    print(f"\nThis fit against the run in {os.environ['CHECK_OUT']}, mean abs error (max):\n")
    print("| algorithm | " + " | ".join(f"W={w}" for w in worlds) + " | all |")
    print("|---|" + "--:|" * (len(worlds) + 1))
    for a in algorithms:
        cells, every = [], []
        for w in worlds:
            es = [rel_error(fits, a, r, ww, b, caches) for (ww, n, b), r in other.items() if n == a and ww == w]
            every += es
            cells.append(f"{100 * sum(es) / len(es):.0f} % ({100 * max(es):.0f} %)" if es else "-")
        print(f"| {a} | " + " | ".join(cells) + f" | {100 * sum(every) / len(every):.0f} % |")
    far_off(other, f"the run in {os.environ['CHECK_OUT']}")

print("\n## Projection to many ranks (ms per allreduce; the fastest marked *)\n")
print("Assumes one rank per host, each with its own link of the fitted alpha and betas (no "
      "shared switch, no contention, no core shared; a host's working set is its one buffer, "
      "held by the cache levels up to their sizes), W a power of two, and the reductions hidden "
      "as on loopback.\n")
proj_sizes = [4 << 10, 1 << 20, 64 << 20]
print("| W | " + " | ".join(f"{size_name(n)} {a}" for n in proj_sizes for a in algorithms) + " |")
print("|--:|" + "--:|" * (len(proj_sizes) * len(algorithms)))
for w in [64, 128, 256, 512, 1024]:
    cells = []
    for n in proj_sizes:
        shares = cache_levels(n, caches)
        t = {}
        for a in algorithms:
            terms = allreduce_terms(a, n, w)
            alpha, *betas, _ = fits[a]
            t[a] = alpha * terms["messages"] + sum(b * f for b, f in zip(betas, shares)) * terms["bytes_moved"]
        fastest = min(t, key=t.get)
        cells += [f"{1e3 * t[a]:.2f}{'*' if a == fastest else ''}" for a in algorithms]
    print(f"| {w} | " + " | ".join(cells) + " |")
PY
