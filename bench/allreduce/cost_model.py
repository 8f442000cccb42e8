"""The pieces of the latency/bandwidth model that the benchmark scripts share (model.sh's fit
on one host, bench/multinode/rounds.py's on namespace hosts): the counts of cost_terms()
(comm_backends/algorithms/algorithm_choice.cpp) for an allreduce, and a weighted least-squares
solver (no numpy on every machine these run on)."""
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
