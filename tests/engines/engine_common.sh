# Sourced by the engine tests: a scratch directory removed at exit, a tiny config, the
# reference run under `partrain run`, and the loss comparison.
#   engine_common.sh is sourced as: . engine_common.sh PARTRAIN_EXE
# shellcheck shell=bash
set -euo pipefail

exe=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/partrain-engines.XXXXXX")
cleanups=()
run_cleanups() {
  local i
  for ((i = ${#cleanups[@]} - 1; i >= 0; i--)); do eval "${cleanups[i]}" || true; done
  rm -rf "$work"
}
trap run_cleanups EXIT

skip() {
  echo "SKIP: $*"
  exit 77
}

python=python3
[ -x /usr/bin/python3 ] && python=/usr/bin/python3

# Two ranks, a few steps of a small DigitalNet on synthetic data: seconds per run.
cat > "$work/tiny.yaml" <<'YAML'
name: engines
seed: 3
device: cpu
strategy: ddp
launch: {nproc_per_node: 2}
comm: {backend: asio-ring, timeout_s: 30}
data: {dataset: synthetic, synthetic_train: 256, synthetic_test: 64, batch_size: 16, num_workers: 1}
model: {name: digitalnet, width: 8, norm: batch}
train: {epochs: 1, threads: 1, log_every: 1}
checkpoint: {every_epochs: 1, keep: 2, resume: auto}
output: {dir: unused}
YAML

# reference_run DIR [--set ...]: the same config under partrain run.
reference_run() {
  local dir=$1
  shift
  timeout -k 5 120 "$exe" run "$work/tiny.yaml" --output "$dir" "$@" > "$dir.log" 2>&1 ||
    { cat "$dir.log"; echo "FAIL: partrain run (the reference) failed"; exit 1; }
}

compare_losses() {
  "$python" "$here/compare_losses.py" "$@"
}

# wait_for WHAT SECONDS COMMAND...: polls COMMAND every 0.2 s until it succeeds; else runs the
# test's show_state (what to print for a person, if it defines one) and fails naming WHAT.
wait_for() {
  local what=$1 seconds=$2
  shift 2
  for _ in $(seq 1 $((seconds * 5))); do
    "$@" && return 0
    sleep 0.2
  done
  if declare -F show_state > /dev/null; then show_state; fi
  echo "FAIL: $what within $seconds s"
  exit 1
}

# A TCP port on 127.0.0.1 that was free a moment ago, and the one above it too. Drawn below the
# kernel's ephemeral range, where no outgoing connection or port-0 listener of a test running
# beside this one can take it before the run binds it; at most 200 draws, then the kernel's pick.
free_port_pair() {
  "$python" - <<'PY'
import random, socket
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
def pair_free(port):
    held = []
    try:
        for p in (port, port + 1):
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", p))
        return held[0].getsockname()[1]
    except OSError:
        return 0
    finally:
        for s in held:
            s.close()
candidates = [random.randint(max(1024, low - 20000), low - 2) for _ in range(200)] if low > 3000 else []
for port in candidates:
    if pair_free(port):
        print(port)
        break
else:
    for _ in range(100):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if pair_free(port):
            print(port)
            break
PY
}
