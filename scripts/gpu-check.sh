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
#                                  gpu) and the GPU benchmarks, prints a short table last.
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
cmake --build build-gpu -j"$(nproc)" --target partrain gpu_tests > "$OUT/build.log" 2>&1 \
  || { grep -E "error|Error" "$OUT/build.log" | head -30; exit 1; }
build-gpu/partrain version | tee "$OUT/version.txt"
log "built in $(( $(date +%s) - started )) s"

# 3. GPU tests.
test_rc=0
ctest --test-dir build-gpu -L gpu --output-on-failure --timeout 300 > "$OUT/gpu-tests.log" 2>&1 || test_rc=$?
grep -E "tests passed|Test +#" "$OUT/gpu-tests.log" | tee -a "$OUT/summary.txt"

# 4. Benchmarks: partrain against PyTorch's own Python loop, same model, data, GPU, batch.
DATA="$ROOT/build-gpu/c100"
[ -f "$DATA/train.bin" ] || build-gpu/partrain data synth --format cifar100-bin --out "$DATA" \
  --train "${GPU_TRAIN:-50000}" --test 10000 --seed 0 > "$OUT/synth.log"
EPOCHS=${GPU_EPOCHS:-3}
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

$PY bench/gpu/summarize.py "$ROOT/build-gpu/runs" | tee -a "$OUT/summary.txt"
log "total $(( $(date +%s) - started )) s; tests and benchmarks exit $test_rc"
exit "$test_rc"
