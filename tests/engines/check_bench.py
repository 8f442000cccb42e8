"""check_bench.py REPORT WORLD BACKENDS SIZES: a partrain.bench/1 report of WORLD ranks with one
result per backend and size, every one with wrong == 0 and a positive time."""
import json
import sys

path, world, backends, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), int(sys.argv[4])
with open(path, encoding="utf-8") as f:
    report = json.load(f)
problems = []
if report.get("schema") != "partrain.bench/1" or report.get("collective") != "allreduce":
    problems.append("not a partrain.bench/1 allreduce report")
if report.get("world") != world:
    problems.append(f"world {report.get('world')}, expected {world}")
results = report.get("results", [])
if sorted({r["backend"] for r in results}) != sorted(backends) or len(results) != len(backends) * sizes:
    problems.append(f"{len(results)} results for {sorted({r['backend'] for r in results})}")
for r in results:
    if r["wrong"] != 0:
        problems.append(f"{r['backend']} {r['bytes']} bytes: wrong = {r['wrong']}")
    if not r["median_us"] > 0:
        problems.append(f"{r['backend']} {r['bytes']} bytes: median_us {r['median_us']}")
if problems:
    sys.exit("check_bench: " + path + ": " + "; ".join(problems))
print(f"check_bench: {len(results)} results of {world} ranks, wrong = 0 everywhere")
