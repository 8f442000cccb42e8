"""Asserts that a run started by a cluster engine trained exactly as `partrain run` did.

compare_losses.py REFERENCE_DIR ENGINE_DIR [--epochs N] [--exact] [--any-world]

Every step and epoch line of ENGINE_DIR/metrics.jsonl must match the line of REFERENCE_DIR
with the same (type, epoch, step) in loss, train_loss, test_loss and test_accuracy; both
report.json files must name the same world size and backend, and their epochs the same
losses. With --epochs N, the engine's report must hold N epochs. With --exact, every value
must be equal to the bit and ENGINE_DIR must hold every line of REFERENCE_DIR, each once (a
run stopped and continued must neither skip nor repeat a step). With --any-world, the run
trained part of the way at another world size (resumed in global-batch mode): a step line's
loss is rank 0's share of the batch alone, which depends on the world size, so only the
epoch lines and the report's epochs are compared (its float sums over the ranks round
differently at each world size: still within the tolerance for a few hundred steps at a
small learning rate). Exits 1 naming the first difference.
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
    any_world = "--any-world" in args
    if any_world:
        args.remove("--any-world")
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
    widest = 0.0  # the largest relative difference seen, for the summary

    def check(what, field, mine, theirs):
        nonlocal widest
        if not close(mine, theirs, exact):
            sys.exit(f"compare: {what} {field}: {mine!r} here, {theirs!r} under partrain run")
        widest = max(widest, abs(mine - theirs) / max(1.0, abs(mine), abs(theirs)))
    for line in run:
        other = ref.get(key(line))
        if other is None:
            sys.exit(f"compare: the reference has no line {key(line)}")
        for field in ("loss", "train_loss", "test_loss", "test_accuracy"):
            if any_world and field == "loss":
                continue
            if field in line:
                check(key(line), field, line[field], other[field])
                compared += 1
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
            check(f"report epoch {mine['epoch']}", field, mine[field], theirs[field])
    print(f"compare: {compared} losses of {len(run)} lines equal to partrain run's "
          f"(world {run_report['env']['world_size']}, {run_report['env']['backend']}; "
          f"largest relative difference {widest:.1e})")


main()
