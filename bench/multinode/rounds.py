"""Tables from several rounds of bench/multinode/link.sh (its allreduce table, saved one file a
run), for BENCHMARKS.md:

  rounds.py compare FILE...   per layout, link, size and partrain backend (asio-ring, hierarchical:
                              each one the files hold): its median of every round, the median of
                              those, Open MPI's over it, and in how many rounds (run side by side)
                              it was at or below Open MPI
  rounds.py model FILE...     with one rank per host and each algorithm forced (ALGORITHM=...):
                              t = alpha x messages + beta x bytes that leave a host, per link,
                              alpha and beta shared by the three algorithms (least squares on
                              the relative error); alpha alone with beta the line rate; and
                              alpha with a beta for bytes in cache and one for bytes from memory
                              (Note [The cache term] in bench/allreduce/cost_model.py; the
                              namespace hosts share one machine, so the footprint is W x n);
                              how far each is off at every point

Rounds of one run are told apart by their file; a round that lacks a contender (mpirun failed)
counts for the other alone.
"""
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "allreduce"))
from cost_model import (CACHE_SIZES, allreduce_terms, cache_levels, least_squares,  # noqa: E402
                        least_squares_nonnegative, size_name)

SIZES = {"KiB": 1 << 10, "MiB": 1 << 20}
LINE_BYTES_PER_S = {"10gbit": 1.25e9, "1gbit": 0.125e9, "100mbit": 12.5e6}


def rows(path):
    """(link, layout, backend, algorithm, bytes, seconds) of each allreduce row of one run."""
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 9 or not cells[4].endswith("iB"):
            continue
        value, unit = cells[4].split()
        backend, _, algorithm = cells[2].partition(" (")
        yield (cells[0], cells[1], backend, algorithm.rstrip(")"), int(value) * SIZES[unit],
               float(cells[5]) / 1e3)


def compare(paths):
    times = defaultdict(dict)  # (layout, link, bytes) -> {(backend, file): seconds}
    for path in paths:
        for link, layout, backend, _, n, s in rows(path):
            times[(layout, link, n)][(backend, path)] = s
    ours_backends = sorted({b for t in times.values() for (b, _) in t if b != "mpi"})
    fmt = lambda xs: ", ".join(f"{x * 1e3:.2f}" for x in xs)
    print("| hosts x ranks | link | size | partrain backend | ms, rounds | median | Open MPI ms, rounds | "
          "median | Open MPI / partrain | rounds partrain at or below |")
    print("|---|---|---|---|---|--:|---|--:|--:|--:|")
    for (layout, link, n) in sorted(times, key=lambda k: (k[0], -LINE_BYTES_PER_S[k[1]], k[2])):
        t = times[(layout, link, n)]
        peer = [t[("mpi", p)] for p in paths if ("mpi", p) in t]
        for backend in ours_backends:
            ours = [t[(backend, p)] for p in paths if (backend, p) in t]
            if not ours or not peer:
                continue
            both = [p for p in paths if (backend, p) in t and ("mpi", p) in t]
            wins = sum(t[(backend, p)] <= t[("mpi", p)] for p in both)
            print(f"| {layout} | {link} | {size_name(n)} | {backend} | {fmt(ours)} | "
                  f"{statistics.median(ours) * 1e3:.2f} | {fmt(peer)} | {statistics.median(peer) * 1e3:.2f} | "
                  f"{statistics.median(peer) / statistics.median(ours):.2f} | {wins}/{len(both)} |")


def model(paths):
    # One rank per host: every byte through a rank's link leaves its host, so cost_terms()'s
    # bytes moved are the bytes that leave a host per direction (host_traffic() agrees).
    runs = defaultdict(list)
    world = None
    for path in paths:
        for link, layout, backend, algorithm, n, s in rows(path):
            hosts, per_host = (int(x) for x in layout.split(" x "))
            if backend != "asio-ring" or per_host != 1:
                continue
            world = hosts
            runs[(link, algorithm, n)].append(s)
    if world is None:
        sys.exit("rounds.py model: no asio-ring rows with one rank per host")
    def counts(algorithm, n):  # (messages, bytes that leave a host)
        c = allreduce_terms(algorithm, n, world)
        return c["messages"], c["bytes_moved"]

    for link in sorted({k[0] for k in runs}, key=lambda r: -LINE_BYTES_PER_S[r]):
        points = sorted((a, n, statistics.mean(v)) for (r, a, n), v in runs.items() if r == link)
        alpha, beta = least_squares([(counts(a, n), t, t) for a, n, t in points], 2)
        line_beta = 1 / LINE_BYTES_PER_S[link]
        (alpha_line,) = least_squares(
            [(counts(a, n)[:1], t - counts(a, n)[1] * line_beta, t) for a, n, t in points], 1)
        def cached(a, n, cache):  # (messages, bytes leaving in cache, from memory)
            messages, leaving = counts(a, n)
            return (messages, *(leaving * f for f in cache_levels(world * n, [cache])))
        def cache_fit(cache):
            c = least_squares_nonnegative([(cached(a, n, cache), t, t) for a, n, t in points], 3)
            predict = lambda a, n: sum(x * y for x, y in zip(c, cached(a, n, cache)))
            return statistics.mean(abs(predict(a, n) - t) / t for a, n, t in points), c, predict
        cache = min(CACHE_SIZES, key=lambda size: cache_fit(size)[0])
        _, (alpha_c, beta_in, beta_out), predict_cached = cache_fit(cache)
        print(f"\n{link}, {world} hosts x 1 rank: shared alpha {alpha * 1e6:.1f} us, beta "
              f"{beta * 1e9:.3f} ns/B ({1 / beta / 1e9:.3f} GB/s); with beta the line rate "
              f"({line_beta * 1e9:.2f} ns/B) alpha {alpha_line * 1e6:.1f} us; with the cache term "
              f"(C = {size_name(int(cache))}) alpha {alpha_c * 1e6:.1f} us, beta in cache "
              f"{beta_in * 1e9:.3f} ns/B, from memory {beta_out * 1e9:.3f} ns/B\n")
        print("| algorithm | size | measured ms | shared alpha, beta: ms | off | line rate: ms | off | "
              "cache term: ms | off |")
        print("|---|---|--:|--:|--:|--:|--:|--:|--:|")
        errors, errors_line, errors_cached = [], [], []
        for a, n, t in points:
            messages, leaving = counts(a, n)
            fit = alpha * messages + beta * leaving
            line = alpha_line * messages + line_beta * leaving
            with_cache = predict_cached(a, n)
            errors.append(abs(fit - t) / t)
            errors_line.append(abs(line - t) / t)
            errors_cached.append(abs(with_cache - t) / t)
            print(f"| {a} | {size_name(n)} | {t * 1e3:.3f} | {fit * 1e3:.3f} | {(fit - t) / t:+.0%} | "
                  f"{line * 1e3:.3f} | {(line - t) / t:+.0%} | {with_cache * 1e3:.3f} | "
                  f"{(with_cache - t) / t:+.0%} |")
        print(f"\nmean abs error: shared {statistics.mean(errors):.0%} (max {max(errors):.0%}); "
              f"line rate {statistics.mean(errors_line):.0%} (max {max(errors_line):.0%}); "
              f"cache term {statistics.mean(errors_cached):.0%} (max {max(errors_cached):.0%})")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("compare", "model"):
        sys.exit("usage: rounds.py compare|model FILE...")
    (compare if sys.argv[1] == "compare" else model)(sys.argv[2:])
