#!/usr/bin/env python3
"""The peer of `partrain bench rendezvous`: N ranks joining through torch's TCPStore.

The master store runs in this process; the ranks are threads of child processes (this script
with --join), each rank with its own client connection (torch.distributed.TCPStore, which
registers itself with the master as it connects). Children, as partrain's bench does: a
torch 1.13 client holds two sockets (its own and its watch-key connection) and the master
two a client, so one process could hold only a quarter of what the master can serve. Each
rank does what a rank of a ring-connected run does to join: publishes its address, reads its
two ring neighbours' addresses and passes a barrier made of the store's add and wait (the
last rank to arrive sets the key the others wait for). A child's threads are all started
before any connects (a file gate), so process and thread start-up are not timed.

Prints and writes (--json) `world`, `seconds` (first connection to the last rank past the
barrier) and `finished`; a run that is not done within --limit-s is reported as not
finished, with how many ranks got through, and its children are killed.

Usage: torch_store.py --world N [--limit-s 300] [--json FILE]
"""
import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist

RANKS_PER_CHILD = 1024
SOCKETS_PER_RANK = 2  # a torch 1.13 client: its connection and its watch-key connection
FDS_SPARE = 64


def write_json(path, result):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def raise_open_files(need, who):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and need > hard:
        print(f"torch_store.py: {who} need about {need} open files; the hard limit here is "
              f"{hard}", file=sys.stderr)
        sys.exit(2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def child(args):
    """Plays ranks first .. first+count-1 and writes when each passed the barrier."""
    raise_open_files(SOCKETS_PER_RANK * args.count + FDS_SPARE, f"{args.count} client ranks")
    threading.stack_size(256 * 1024)
    limit = datetime.timedelta(seconds=args.limit_s)
    world = args.world
    passed = [0.0] * args.count
    errors = []
    deadline = time.monotonic() + args.limit_s

    def rank(i):
        r = args.first + i
        while not os.path.exists(args.gate):  # bounded by the deadline
            if time.monotonic() > deadline:
                errors.append("the gate never opened")
                return
            time.sleep(0.001)
        try:
            store = dist.TCPStore("127.0.0.1", args.join, world, False, limit)
            store.set(f"addr/{r}", f"127.0.0.1:{20000 + r % 40000}")
            store.get(f"addr/{(r + 1) % world}")
            store.get(f"addr/{(r - 1) % world}")
            if store.add("barrier", 1) == world:
                store.set("barrier/done", "1")
            store.wait(["barrier/done"])
            passed[i] = time.monotonic()
        except Exception as e:  # counted and reported; the other ranks go on
            errors.append(str(e).splitlines()[0] if str(e) else type(e).__name__)

    threads = [threading.Thread(target=rank, args=(i,), daemon=True) for i in range(args.count)]
    for t in threads:
        t.start()
    for t in threads:  # bounded: each rank's store calls time out at the limit
        t.join(max(0.0, deadline + 5 - time.monotonic()))
    through = [p for p in passed if p > 0.0]
    write_json(args.out, {"through": len(through), "last": max(through, default=0.0),
                          "errors": len(errors), "first_error": errors[0] if errors else None})
    sys.stdout.flush()
    os._exit(0)  # threads still blocked in the store's C++ calls cannot be joined


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--limit-s", type=float, default=300.0)
    ap.add_argument("--json")
    for hidden in ("--join", "--first", "--count"):
        ap.add_argument(hidden, type=int, help=argparse.SUPPRESS)
    for hidden in ("--gate", "--out"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.join is not None:
        return child(args)
    world = args.world
    if world < 2 or args.limit_s <= 0:
        print("torch_store.py: --world must be at least 2 and --limit-s positive", file=sys.stderr)
        return 2
    raise_open_files(SOCKETS_PER_RANK * world + FDS_SPARE, f"{world} ranks' master")

    master = dist.TCPStore("127.0.0.1", 0, world, True, datetime.timedelta(seconds=args.limit_s),
                           wait_for_workers=False)
    work = tempfile.mkdtemp(prefix="torch-store-bench-")
    gate = os.path.join(work, "gate")
    children = []
    for first in range(0, world, RANKS_PER_CHILD):
        count = min(RANKS_PER_CHILD, world - first)
        out = os.path.join(work, f"child{first}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--world", str(world), "--limit-s",
               str(args.limit_s), "--join", str(master.port), "--first", str(first), "--count",
               str(count), "--gate", gate, "--out", out]
        children.append((subprocess.Popen(cmd), out))
    # Let every child start its threads (they then poll the gate): a bounded pause.
    time.sleep(min(30.0, 1.0 + 0.002 * world))
    start = time.monotonic()
    open(gate, "w").close()
    deadline = start + args.limit_s + 10
    for proc, _ in children:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    results = []
    for _, out in children:
        try:
            with open(out) as f:
                results.append(json.load(f))
        except (OSError, ValueError):
            results.append({"through": 0, "last": 0.0, "errors": 1,
                            "first_error": "a child process wrote no result"})
    through = sum(r["through"] for r in results)
    errors = [r["first_error"] for r in results if r["first_error"]]
    finished = through == world
    seconds = (max(r["last"] for r in results) - start) if finished else time.monotonic() - start
    result = {
        "schema": "partrain.bench.rendezvous.torch/1",
        "store": f"torch {torch.__version__} TCPStore",
        "world": world,
        "finished": finished,
        "seconds": round(seconds, 3),
        "ranks_through": through,
        "errors": sum(r["errors"] for r in results),
        "first_error": errors[0] if errors else None,
        "limit_s": args.limit_s,
        "processes": len(children),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if finished:
        processes = f"{len(children)} process" + ("es" if len(children) > 1 else "")
        print(f"torch TCPStore: {world} ranks through the barrier in {seconds:.3f} s "
              f"({processes})")
    else:
        why = f"; {result['errors']} failed, first: {result['first_error']}" if errors else ""
        print(f"torch TCPStore: {world} ranks not done in {seconds:.0f} s "
              f"({through} through the barrier{why})")
    if args.json:
        write_json(args.json, result)
    for _, out in children:
        if os.path.exists(out):
            os.remove(out)
    if os.path.exists(gate):
        os.remove(gate)
    os.rmdir(work)
    return 0 if finished else 1


if __name__ == "__main__":
    sys.exit(main())
