"""What the automatic choice would take with other constants, against every algorithm forced:
reads model.sh's results (each JSON row carries cost_terms()'s counts) and, for each candidate
alpha (beta and gamma as loopback_model() has them, or as given), predicts each algorithm's time
as choose_algorithm() does on one host (comm_backends/algorithms/algorithm_choice.cpp: messages x
alpha + bytes moved x beta + bytes reduced x gamma, ties to recursive doubling, then
Rabenseifner; below kSharedCoresRingFrom no ring where the ranks outnumber the cores) and names
every point where the algorithm it would take was more than 5 % slower than the fastest forced
one (each algorithm's best round).

  choice.py [--alpha-us 5,8,10,15] [--beta-ns 0.4] [--gamma-ns 0.2] [--cores N] OUT...
"""
import argparse
import json
import os
from pathlib import Path

from cost_model import size_name

ALGORITHMS = ["recursive_doubling", "rabenseifner", "ring"]  # the order ties go in
SHARED_CORES_RING_FROM = 8 << 20  # kSharedCoresRingFrom (algorithm_choice.h)


def forced_runs(out):
    """(world, bytes) -> {algorithm: the row of its best round} of one model.sh run."""
    best = {}
    for path in Path(out).glob("*_w*_r*.json"):
        algorithm = path.name.split("_w")[0]
        if algorithm not in ALGORITHMS:
            continue
        world = int(path.name.split("_w")[1].split("_r")[0])
        for row in json.load(open(path))["results"]:
            point = best.setdefault((world, row["bytes"]), {})
            if algorithm not in point or row["median_us"] < point[algorithm]["median_us"]:
                point[algorithm] = row
    return best


def choose(point, world, n, alpha, beta, gamma, cores):
    def seconds(a):
        t = point[a]["terms"]
        return alpha * t["messages"] + beta * t["bytes_moved"] + gamma * t["bytes_reduced"]
    candidates = [a for a in ALGORITHMS
                  if not (a == "ring" and world > cores and n < SHARED_CORES_RING_FROM)]
    return min(candidates, key=lambda a: (seconds(a), ALGORITHMS.index(a)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--alpha-us", default="5,8,10,15")
    p.add_argument("--beta-ns", type=float, default=0.4)
    p.add_argument("--gamma-ns", type=float, default=0.2)
    p.add_argument("--cores", type=int, default=os.cpu_count())
    p.add_argument("out", nargs="+")
    args = p.parse_args()
    runs = {out: forced_runs(out) for out in args.out}
    print(f"beta {args.beta_ns} ns, gamma {args.gamma_ns} ns, {args.cores} cores; points where the "
          "choice would be more than 5 % slower than the fastest forced algorithm:\n")
    print("| alpha (us) | points | more than 5 % slower |")
    print("|--:|--:|---|")
    for alpha_us in (float(a) for a in args.alpha_us.split(",")):
        misses, points = [], 0
        for out, best in runs.items():
            for (world, n), point in sorted(best.items()):
                if len(point) < len(ALGORITHMS):
                    continue
                points += 1
                took = choose(point, world, n, alpha_us * 1e-6, args.beta_ns * 1e-9,
                              args.gamma_ns * 1e-9, args.cores)
                fastest = min(point, key=lambda a: point[a]["median_us"])
                ratio = point[took]["median_us"] / point[fastest]["median_us"]
                if ratio > 1.05:
                    misses.append(f"{Path(out).name} W={world} {size_name(n)}: {took} {ratio:.2f}x "
                                  f"({fastest} fastest)")
        print(f"| {alpha_us:g} | {points} | {'; '.join(misses) or 'none'} |")


if __name__ == "__main__":
    main()
