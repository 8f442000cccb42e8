"""The pieces of the latency/bandwidth model that the benchmark scripts share (model.sh's fit
on one host, bench/multinode/rounds.py's on namespace hosts): the counts of cost_terms()
(comm_backends/algorithms/algorithm_choice.cpp) for an allreduce, the share of a working set
that fits in a cache, and a weighted least-squares solver (no numpy on every machine these run
on).

Note [The cache term]
The time a byte costs is not one constant: measured on one host, a ring allreduce at W=2 took
0.19 ns a byte moved at 1 MiB and 0.57 at 64 MiB, and over namespace hosts at 10 Gbit/s the
same growth showed. Buffers that the machine's caches hold are copied and reduced at cache
speed, larger ones at memory speed. So the model splits the bytes by where they come from:
with effective cache sizes C1 < C2 < ... (one per level), the share min(1, C1 / footprint)
costs beta_1, the share that the next level holds beyond that, min(1, C2 / footprint) minus
the first, costs beta_2, and so on; the rest costs beta_mem. The footprint is every buffer the
machine holds at once (W x n for W ranks on one machine; n for one rank per host), and the
sizes are found by the fit (CACHE_SIZES, the sizes whose fit is least off) since what a guest
sees of its host's caches (lscpu) says little about its share. One level was the first form;
on a 2-core machine with 2 MiB of L2 a core and a shared L3, the ring's time per byte had two
steps, not one (model.sh prints it by footprint; three runs: 0.17-0.18 ns at 2 MiB, 0.29-0.40
from 4 to 32 MiB, 0.53-0.61 from 64 MiB), and model.sh fits two levels by default. Over
namespace hosts rounds.py keeps one: its four sizes cannot carry two sizes and a beta each."""
import math


def size_name(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def allreduce_terms(algorithm, n, w):
    """Messages in a row and bytes through the busiest rank's link of an allreduce of n bytes
    over w ranks (a world that is not a power of two folds first, as MPICH does)."""
    l = int(math.floor(math.log2(w)))
    p, fold = 2 ** l, 0 if w == 2 ** l else 1
    if algorithm == "ring":
        return {"messages": 2 * (w - 1), "bytes_moved": 2 * (w - 1) / w * n}
    if algorithm == "recursive_doubling":
        return {"messages": l + 2 * fold, "bytes_moved": (l + 2 * fold) * n}
    return {"messages": 2 * l + 2 * fold, "bytes_moved": 2 * (p - 1) / p * n + 2 * fold * n}


# The effective cache sizes a fit tries: 1 MiB ... 256 MiB.
CACHE_SIZES = [float(1 << k) * (1 << 20) for k in range(9)]


def in_cache(footprint, cache):
    """The share of a working set of footprint bytes that a cache of cache bytes holds."""
    return min(1.0, cache / footprint) if footprint > 0 else 1.0


def cache_levels(footprint, caches):
    """The shares of a working set of footprint bytes that each cache of caches (ascending
    sizes) holds beyond the ones before it, then the share that none holds (from memory);
    they sum to 1."""
    shares, held = [], 0.0
    for cache in caches:
        now = in_cache(footprint, cache)
        shares.append(now - held)
        held = now
    return shares + [1.0 - held]


def least_squares(rows, k):
    """The k coefficients c that minimise the sum of ((x . c - target) / scale)^2 over rows of
    (x, target, scale), by Gaussian elimination on the normal equations. A feature that is 0 in
    every row gets the coefficient 0."""
    m = [[0.0] * (k + 1) for _ in range(k)]
    for x, target, scale in rows:
        xr = [v / scale for v in x]
        for i in range(k):
            m[i][k] += xr[i] * target / scale
            for j in range(k):
                m[i][j] += xr[i] * xr[j]
    for j in range(k):
        if all(m[i][j] == 0 for i in range(k)):
            m[j][j] = 1.0
    for i in range(k):
        p = max(range(i, k), key=lambda r: abs(m[r][i]))
        m[i], m[p] = m[p], m[i]
        for r in range(k):
            if r != i:
                f = m[r][i] / m[i][i]
                m[r] = [a - f * b for a, b in zip(m[r], m[i])]
    return [m[i][k] / m[i][i] for i in range(k)]


def least_squares_nonnegative(rows, k):
    """least_squares(), but a coefficient that comes out negative (no cost is) is dropped and the
    rest fitted again; dropped ones are 0."""
    active = list(range(k))
    for _ in range(k):  # each pass drops one coefficient or ends
        c = least_squares([([x[i] for i in active], t, s) for x, t, s in rows], len(active))
        worst = min(range(len(active)), key=lambda i: c[i])
        if c[worst] >= 0:
            break
        del active[worst]
    full = [0.0] * k
    for i, v in zip(active, c):
        full[i] = max(v, 0.0)
    return full
