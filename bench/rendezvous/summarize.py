#!/usr/bin/env python3
"""Prints the Markdown table of a bench/rendezvous/run.sh output folder.

Usage: summarize.py OUT_DIR "W1 W2 ..."
"""
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def last_line(path):
    try:
        with open(path) as f:
            lines = [ln.strip() for ln in f if ln.strip()]
        return lines[-1] if lines else ""
    except OSError:
        return ""


def main():
    out, worlds = sys.argv[1], [int(w) for w in sys.argv[2].split()]
    with open(os.path.join(out, "machine.txt")) as f:
        for line in f:
            print("    " + line.rstrip())
    print()
    print("| W | partrain s | store ops | ops/rank | server CPU s | --remote-clock s | its ops/rank "
          "| its clock error ms, median / max | torch TCPStore s | torch / partrain |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for w in worlds:
        p = load(os.path.join(out, f"partrain_w{w}.json"))
        t = load(os.path.join(out, f"torch_w{w}.json"))
        if p:
            ps = f"{p['seconds']:.2f}"
            ops = f"{p['store_ops']}"
            per = f"{p['store_ops_per_rank']:.2f}"
            cpu = f"{p['server_cpu_s']:.2f}" if p.get("server_cpu_s") is not None else "-"
        else:
            why = last_line(os.path.join(out, f"partrain_w{w}.txt"))
            ps, ops, per, cpu = f"not run: {why}" if why else "no result", "-", "-", "-"
        r = load(os.path.join(out, f"partrain_remote_w{w}.json"))
        if r:
            rs, rper = f"{r['seconds']:.2f}", f"{r['store_ops_per_rank']:.2f}"
            c = r.get("clock_estimate") or {}
            rerr = (f"{c['error_us_median'] / 1e3:.1f} / {c['error_us_max'] / 1e3:.1f}"
                    if c else "-")
        else:
            rs, rper, rerr = "-", "-", "-"
        if t is None:
            why = last_line(os.path.join(out, f"torch_w{w}.txt"))
            ts = "not run" + (f": {why}" if why and "torch_store.py" in why else "")
            ratio = "-"
        elif t["finished"]:
            ts = f"{t['seconds']:.2f}"
            ratio = f"{t['seconds'] / p['seconds']:.1f}x" if p else "-"
        else:
            ts = f"not done in {t['seconds']:.0f} ({t['ranks_through']} through)"
            ratio = f"> {t['seconds'] / p['seconds']:.0f}x" if p else "-"
        print(f"| {w} | {ps} | {ops} | {per} | {cpu} | {rs} | {rper} | {rerr} | {ts} | {ratio} |")


if __name__ == "__main__":
    main()
