#!/usr/bin/env bash
# The GPU path, checked on a machine with an NVIDIA GPU and Python's torch wheel (CUDA).
#
#   scripts/gpu-check.sh prepare   on a Debian machine with a package mirror: downloads into
#                                  .gpu-debs/ the .deb files of the libraries a GPU machine
#                                  without one may lack (yaml-cpp, Boost, CLI11, GoogleTest,
#                                  libgloo, curl, libarchive, cmake, ninja, ...)
#   scripts/gpu-check.sh           on the GPU machine (carry .gpu-debs/ along): unpacks those
#                                  into a prefix, configures partrain against the LibTorch
#                                  inside the torch wheel, builds, runs the GPU tests (ctest -L
#                                  gpu: stream ordering, DataParallel's BatchNorm statistics,
#                                  the reducer on CUDA, whole runs), the overlap check, a
#                                  DataParallel run and the GPU benchmarks, prints a short
#                                  table last.
#
# Full logs go to $OUT (default: build-gpu/out). Budget: well under 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DEBS="$ROOT/.gpu-debs"

packages=(
  libyaml-cpp-dev libyaml-cpp0.7 libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev
  libboost1.74-dev libgloo-dev libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200
  libarchive-dev libarchive13 libcurl4-openssl-dev libcurl4 libssl-dev zlib1g-dev
  ninja-build cmake cmake-data libjsoncpp25 librhash0 libuv1
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 protobuf-compiler libprotoc32
)

if [ "${1:-run}" = prepare ]; then
  mkdir -p "$DEBS"
  (cd "$DEBS" && apt-get download "${packages[@]}")
  du -sh "$DEBS"
  exit 0
fi

OUT="${OUT:-$ROOT/build-gpu/out}"
mkdir -p "$OUT"
log() { echo "gpu-check: $*" | tee -a "$OUT/summary.txt"; }
started=$(date +%s)

# 1. Dependencies from the carried .deb files, unpacked (not installed) into a prefix.
PREFIX="$ROOT/build-gpu/prefix"
if [ -d "$DEBS" ]; then
  mkdir -p "$PREFIX"
  for deb in "$DEBS"/*.deb; do dpkg -x "$deb" "$PREFIX"; done
  export PATH="$PREFIX/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu:$PREFIX/usr/lib:$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  export CMAKE_ROOT="$PREFIX/usr/share/cmake-3.25"
fi
PY=${PYTHON:-python3}
TORCH_CMAKE=$($PY -c 'import torch; print(torch.utils.cmake_prefix_path)')
TORCH_VERSION=$($PY -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1 || true
log "torch $TORCH_VERSION; GPU: $(cat "$OUT/gpu.txt")"

# 2. Configure and build against the wheel's LibTorch.
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S . -B build-gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_CMAKE;$PREFIX/usr;$PREFIX/usr/lib/x86_64-linux-gnu/cmake;$PREFIX/usr/share/cmake" \
  -DCMAKE_INCLUDE_PATH="$PREFIX/usr/include" -DCMAKE_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu;$PREFIX/usr/lib" \
  -DCMAKE_CXX_FLAGS="-isystem $PREFIX/usr/include" > "$OUT/configure.log" 2>&1 \
  || { tail -30 "$OUT/configure.log"; exit 1; }
grep "partrain:" "$OUT/configure.log" | tee -a "$OUT/summary.txt"
cmake --build build-gpu -j"$(nproc)" --target partrain gpu_tests gpu_torch_tests gpu_comm_tests \
  > "$OUT/build.log" 2>&1 \
  || { grep -E "error|Error" "$OUT/build.log" | head -30; exit 1; }
build-gpu/partrain version | tee "$OUT/version.txt"
log "built in $(( $(date +%s) - started )) s"

# 3. GPU tests.
test_rc=0
ctest --test-dir build-gpu -L gpu --output-on-failure --timeout 300 > "$OUT/gpu-tests.log" 2>&1 || test_rc=$?
grep -E "tests passed|Test +#" "$OUT/gpu-tests.log" | tee -a "$OUT/summary.txt"

DATA="$ROOT/build-gpu/c100"
[ -f "$DATA/train.bin" ] || build-gpu/partrain data synth --format cifar100-bin --out "$DATA" \
  --train "${GPU_TRAIN:-50000}" --test 10000 --seed 0 > "$OUT/synth.log"
EPOCHS=${GPU_EPOCHS:-3}
RUNS="$ROOT/build-gpu/runs"
common=(--set data.root="$DATA" --set checkpoint.every_epochs=0 --set reference=)

# 4. Overlap: the time each step waits after backward, against the bare allreduce of the
# whole gradient (DigitalNet width 64: 7,076,096 bytes), two ranks sharing the GPU over each
# host backend (the staged path: pinned memory, copies on a side stream), seven buckets
# (bucket_mb 1). With overlap the wait is well under the bare allreduce: only the last
# bucket is left when backward ends. Timing, so it is reported, not asserted.
GRAD_BYTES=7076096
build-gpu/partrain bench allreduce --backend gloo,asio-ring --world 2 --sizes "$GRAD_BYTES" \
  --iters 50 --json "$OUT/bare-allreduce.json" > "$OUT/bare-allreduce.log" 2>&1 \
  || { tail -5 "$OUT/bare-allreduce.log"; test_rc=1; }
for backend in gloo asio-ring; do
  build-gpu/partrain run configs/cifar100_2gpu.yaml --output "$RUNS/overlap-$backend" "${common[@]}" \
    --set comm.backend="$backend" --set comm.bucket_mb=1 --set train.epochs=1 \
    --set train.max_steps=30 > "$OUT/overlap-$backend.log" 2>&1 \
    || { tail -5 "$OUT/overlap-$backend.log"; test_rc=1; }
done
$PY - "$OUT/bare-allreduce.json" "$RUNS" <<'PYEOF' | tee -a "$OUT/summary.txt" || test_rc=1
import json, sys
from pathlib import Path
bare = {r["backend"]: r["median_us"] / 1000 for r in json.loads(Path(sys.argv[1]).read_text())["results"]}
print("| backend | bare allreduce ms | wait after backward ms/step, per rank | in allreduce ms/step | overlap |")
print("|--|--:|--|--|--|")
for backend in ("gloo", "asio-ring"):
    path = Path(sys.argv[2]) / f"overlap-{backend}" / "report.json"
    if not path.exists() or backend not in bare:
        print(f"| {backend} | missing | | | |")
        continue
    r = json.loads(path.read_text())
    steps = max(1, r["epochs"][-1]["steps"])
    wait = [1000 * k["comm_wait_seconds"] / steps for k in r["ranks"]]
    busy = [1000 * k["comm_busy_seconds"] / steps for k in r["ranks"]]
    verdict = "yes" if max(wait) < bare[backend] else "NO: the wait is the whole allreduce or more"
    print(f"| {backend} | {bare[backend]:.2f} | {', '.join(f'{w:.2f}' for w in wait)} | "
          f"{', '.join(f'{b:.2f}' for b in busy)} | {verdict} |")
PYEOF

# 5. Benchmarks: partrain against PyTorch's own Python loop, same model, data, GPU, batch.
for batch in 500 1000; do
  build-gpu/partrain run configs/cifar100_1gpu.yaml --output "$ROOT/build-gpu/runs/partrain-b$batch" \
    --set data.root="$DATA" --set data.batch_size=$batch --set data.num_workers=2 \
    --set train.epochs="$EPOCHS" --set checkpoint.every_epochs=0 --set reference= \
    > "$OUT/partrain-b$batch.log" 2>&1 || { tail -5 "$OUT/partrain-b$batch.log"; test_rc=1; }
  $PY bench/gpu/torch_loop.py --data "$DATA" --batch-size $batch --epochs "$EPOCHS" \
    --json "$ROOT/build-gpu/runs/torch-b$batch.json" > "$OUT/torch-b$batch.log" 2>&1 \
    || { tail -5 "$OUT/torch-b$batch.log"; test_rc=1; }
done
build-gpu/partrain run configs/cifar100_2gpu.yaml --output "$ROOT/build-gpu/runs/partrain-2rank" \
  --set data.root="$DATA" --set train.epochs="$EPOCHS" --set checkpoint.every_epochs=0 \
  --set reference= > "$OUT/partrain-2rank.log" 2>&1 || { tail -5 "$OUT/partrain-2rank.log"; test_rc=1; }

# 6. DataParallel, norm: batch, over every visible GPU, against the one-GPU run of the same
# total batch (partrain-b1000): with its BatchNorm statistics lost, its evaluation would sit
# near chance (1 %). On a one-GPU machine dp is the plain forward; the replicated path on
# one GPU is what GpuDataParallel.* in step 3 checks (two replicas on cuda:0).
build-gpu/partrain run configs/cifar100_dp.yaml --output "$RUNS/partrain-dp" "${common[@]}" \
  --set train.epochs="$EPOCHS" > "$OUT/partrain-dp.log" 2>&1 \
  || { tail -5 "$OUT/partrain-dp.log"; test_rc=1; }
$PY - "$RUNS" <<'PYEOF' | tee -a "$OUT/summary.txt" || test_rc=1
import json, sys
from pathlib import Path
runs = Path(sys.argv[1])
dp = json.loads((runs / "partrain-dp" / "report.json").read_text())
one = json.loads((runs / "partrain-b1000" / "report.json").read_text())
a, b = dp["final"]["test_accuracy"], one["final"]["test_accuracy"]
print(f"dp over {', '.join(dp['env']['devices'])}: test accuracy {a:.3f}; one GPU at batch 1000: {b:.3f}")
if a < 0.5 * b:
    print("dp: FAILED: evaluation far below the one-GPU run (BatchNorm statistics lost?)")
    sys.exit(1)
PYEOF

$PY bench/gpu/summarize.py "$ROOT/build-gpu/runs" | tee -a "$OUT/summary.txt"
log "total $(( $(date +%s) - started )) s; tests and benchmarks exit $test_rc"
exit "$test_rc"
