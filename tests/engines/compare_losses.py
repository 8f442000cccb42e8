"""Asserts that a run started by a cluster engine trained exactly as `partrain run` did.

compare_losses.py REFERENCE_DIR ENGINE_DIR [--epochs N] [--exact]

Every step and epoch line of ENGINE_DIR/metrics.jsonl must match the line of REFERENCE_DIR
with the same (type, epoch, step) in loss, train_loss, test_loss and test_accuracy; both
report.json files must name the same world size and backend, and their epochs the same
losses. With --epochs N, the engine's report must hold N epochs. With --exact, every value
must be equal to the bit and ENGINE_DIR must hold every line of REFERENCE_DIR, each once (a
run stopped and continued must neither skip nor repeat a step). Exits 1 naming the first
difference.
"""
import json
import sys

TOLERANCE = 1e-6  # relative; the same world and seed give the same float operations


def lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def key(line):
    return (line.get("type"), line.get("epoch"), line.get("step"))


def close(a, b, exact=False):
    if exact:
        return a == b
    return abs(a - b) <= TOLERANCE * max(1.0, abs(a), abs(b))


def main():
    args = sys.argv[1:]
    epochs = None
    if "--epochs" in args:
        at = args.index("--epochs")
        epochs = int(args[at + 1])
        del args[at:at + 2]
    exact = "--exact" in args
    if exact:
        args.remove("--exact")
    ref_dir, run_dir = args
    ref = {key(line): line for line in lines(ref_dir + "/metrics.jsonl")}
    run = lines(run_dir + "/metrics.jsonl")
    if not run:
        sys.exit("compare: " + run_dir + "/metrics.jsonl is empty")
    if exact:
        keys = [key(line) for line in run]
        repeated = sorted({k for k in keys if keys.count(k) > 1}, key=str)
        if repeated:
            sys.exit(f"compare: line {repeated[0]} appears more than once")
        missing = sorted(set(ref) - set(keys), key=str)
        if missing:
            sys.exit(f"compare: no line {missing[0]} here ({len(missing)} missing)")
    compared = 0
    for line in run:
        other = ref.get(key(line))
        if other is None:
            sys.exit(f"compare: the reference has no line {key(line)}")
        for field in ("loss", "train_loss", "test_loss", "test_accuracy"):
            if field in line and not close(line[field], other[field], exact):
                sys.exit(f"compare: {key(line)} {field}: {line[field]!r} here, "
                         f"{other[field]!r} under partrain run")
            compared += field in line
    with open(ref_dir + "/report.json", encoding="utf-8") as f:
        ref_report = json.load(f)
    with open(run_dir + "/report.json", encoding="utf-8") as f:
        run_report = json.load(f)
    for field in ("world_size", "backend"):
        if run_report["env"][field] != ref_report["env"][field]:
            sys.exit(f"compare: env.{field} {run_report['env'][field]!r} here, "
                     f"{ref_report['env'][field]!r} under partrain run")
    if epochs is not None and len(run_report["epochs"]) != epochs:
        sys.exit(f"compare: {len(run_report['epochs'])} epochs in the report, expected {epochs}")
    for mine, theirs in zip(run_report["epochs"], ref_report["epochs"]):
        for field in ("train_loss", "test_loss", "test_accuracy"):
            if not close(mine[field], theirs[field], exact):
                sys.exit(f"compare: report epoch {mine['epoch']} {field}: {mine[field]!r} here, "
                         f"{theirs[field]!r} under partrain run")
    print(f"compare: {compared} losses of {len(run)} lines equal to partrain run's "
          f"(world {run_report['env']['world_size']}, {run_report['env']['backend']})")


main()
