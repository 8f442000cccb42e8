#!/usr/bin/env python3
"""Markdown table from one bench/allreduce/run.sh run: busbw of each contender per size and
the ratios asio-ring / best Gloo (peer algorithms and our gloo backend), plus the 4 KiB
latency. Usage: compare.py OUT_DIR "2 4"."""
import json
import pathlib
import sys


def human(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def keep_best(out, key, value):
    # value = (median_us, busbw): the best round is the one with the shortest median.
    if key not in out or value[0] < out[key][0]:
        out[key] = value


def read_partrain(out_dir, stem):
    out = {}
    for path in sorted(out_dir.glob(stem + "_r*.json")):
        for r in json.loads(path.read_text())["results"]:
            assert r["wrong"] == 0, f"{path}: wrong results"
            keep_best(out, (r["backend"], r["bytes"]), (r["median_us"], r["busbw_gbps"]))
    return out


def read_gloo(out_dir, stem):
    out = {}
    for path in sorted(out_dir.glob(stem + "_r*.txt")):
        for line in path.read_text().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            f = line.split()
            assert f[7] == "OK", f"{path}: {line}"
            keep_best(out, int(f[0]), (float(f[3]), float(f[6])))
    return out


def main():
    out = pathlib.Path(sys.argv[1])
    worlds = [int(w) for w in sys.argv[2].split()]
    print((out / "machine.txt").read_text().strip().replace("\n", "  \n"))
    print()
    for w in worlds:
        ours = read_partrain(out, f"partrain_w{w}")
        bf16 = read_partrain(out, f"partrain_bf16_w{w}")
        peers = {a: read_gloo(out, f"gloo_{a}_w{w}")
                 for a in ("ring_chunked", "halving_doubling", "bcube")}
        sizes = sorted({b for (_, b) in ours})
        print(f"### W={w}, f32 sum, busbw GB/s (median time in µs for 4 KiB)\n")
        print("| size | asio-ring | asio-ring bf16 wire | gloo backend | Gloo peer ring_chunked "
              "| halving_doubling | bcube | Gloo best | asio-ring / Gloo best | bf16 / f32 wire |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for b in sizes:
            ring_us, ring = ours[("asio-ring", b)]
            gloo_us, gloo = ours.get(("gloo", b), (float("nan"), float("nan")))
            wire_us, wire = bf16[("asio-ring", b)]
            peer = {a: peers[a].get(b, (float("nan"), float("nan"))) for a in peers}
            best_name, (best_us, best) = max(
                [("gloo backend", (gloo_us, gloo))] + list(peer.items()),
                key=lambda kv: kv[1][1] if kv[1][1] == kv[1][1] else -1)
            cells = [human(b), f"{ring:.3f}", f"{wire:.3f}", f"{gloo:.3f}"]
            cells += [f"{peer[a][1]:.3f}" for a in ("ring_chunked", "halving_doubling", "bcube")]
            cells += [f"{best:.3f} ({best_name})", f"**{ring / best:.2f}x**", f"{wire / ring:.2f}x"]
            if b == 4096:
                cells[1] += f" ({ring_us:.0f} µs)"
                cells[7] += f" ({best_us:.0f} µs)"
            print("| " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main()
