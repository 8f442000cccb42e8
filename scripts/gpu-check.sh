#!/usr/bin/env bash
# The GPU path, checked on a machine with an NVIDIA GPU and Python's torch wheel (CUDA).
#
#   scripts/gpu-check.sh prepare   on a Debian 12 machine with a package mirror: downloads into
#                                  .gpu-debs/ the .deb files of partrain's libraries (headers
#                                  and the shared libraries they need), for a GPU machine that
#                                  has no package mirror
#   scripts/gpu-check.sh           on the GPU machine (carry .gpu-debs/ along): unpacks those
#                                  into a prefix, configures partrain against the LibTorch
#                                  inside the torch wheel, builds, runs the GPU tests (stream
#                                  ordering, DataParallel's BatchNorm statistics, the reducer on
#                                  CUDA, whole runs), every collective over nccl, the overlap
#                                  check, a DataParallel run and the GPU benchmarks, and prints
#                                  a short table last.
#
# GPU_CHECK_BUDGET_S (default 540) bounds the whole script: each step gets what is left, so a
# slow build shortens the benchmarks instead of losing the test results. GPU_PREBUILT=FILE
# skips the build and unpacks the binaries an earlier run left in $OUT/partrain-gpu-bin.tgz.
# Logs go to build-gpu/out; where $OUT names another folder, the summary, the logs and the
# reports (logs.tgz) and the binaries (partrain-gpu-bin.tgz) are also left there at the end.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
DEBS="$ROOT/.gpu-debs"

# Headers, static and link-time files (-dev packages) and protoc.
dev_packages=(
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev libboost1.74-dev
  libgloo-dev libarchive-dev libcurl4-openssl-dev libssl-dev zlib1g-dev libjpeg62-turbo-dev
  libpng-dev libprotobuf-dev protobuf-compiler libgoogle-perftools-dev
)
# The shared libraries those need at run time: the closure of `ldd` over them on Debian 12,
# less libc, libgcc and libstdc++, which a newer system has. Only the ones the GPU machine
# lacks are put on its library path (below), so its own newer copies stay in use.
runtime_packages=(
  libacl1 libarchive13 libbrotli1 libbz2-1.0 libcom-err2 libcurl4 libffi8 libgloo0 libgmp10
  libgnutls30 libgssapi-krb5-2 libhiredis0.14 libhogweed6 libibverbs1 libicu72 libidn2-0
  libjpeg62-turbo libk5crypto3 libkeyutils1 libkrb5-3 libkrb5support0 libldap-2.5-0 liblz4-1
  liblzma5 libnettle8 libnghttp2-14 libnl-3-200 libnl-route-3-200 libp11-kit0 libpng16-16
  libprotobuf-lite32 libprotobuf32 libprotoc32 libpsl5 librtmp1 libsasl2-2 libssh2-1 libssl3
  libtasn1-6 libtcmalloc-minimal4 libunistring2 libxml2 libyaml-cpp0.7 libzstd1 zlib1g
)

if [ "${1:-run}" = prepare ]; then
  mkdir -p "$DEBS"
  (cd "$DEBS" && apt-get download "${dev_packages[@]}" "${runtime_packages[@]}") || exit 1
  du -sh "$DEBS"
  exit 0
fi

RESULTS="${OUT:-}"
OUT="$ROOT/build-gpu/out"
mkdir -p "$OUT"
: > "$OUT/summary.txt"
# shellcheck disable=SC2317  # run by the EXIT trap
leave_results() {
  if [ -n "$RESULTS" ] && [ "$RESULTS" != "$OUT" ]; then
    if [ -f "$OUT/partrain-gpu-bin.tgz" ]; then mv "$OUT/partrain-gpu-bin.tgz" "$RESULTS/"; fi
    cp "$OUT/summary.txt" "$RESULTS/"
    (cd "$ROOT/build-gpu" && shopt -s nullglob && tar czf "$RESULTS/logs.tgz" out runs/*/report.json runs/*.json)
  fi
}
trap leave_results EXIT
started=$(date +%s)
deadline=$((started + ${GPU_CHECK_BUDGET_S:-540}))
failed=0
log() { echo "gpu-check: $*" | tee -a "$OUT/summary.txt"; }
left() { echo $((deadline - $(date +%s))); }
# step NAME SECONDS CMD...: runs CMD with its output in $OUT/NAME.log, bounded by SECONDS and
# by what is left of the budget; a failure is logged and counted, and the script goes on.
step() {
  local name=$1 want=$2
  shift 2
  local bound
  bound=$(left)
  [ "$want" -lt "$bound" ] && bound=$want
  if [ "$bound" -lt 15 ]; then
    log "$name: skipped, the budget is spent"
    failed=1
    return 1
  fi
  local t0 rc
  t0=$(date +%s)
  timeout -k 5 "$bound" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  if [ "$rc" -ne 0 ]; then
    failed=1
    log "$name: FAILED (exit $rc after $(($(date +%s) - t0)) s; bound $bound s); its last lines:"
    tail -8 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$OUT/summary.txt"
    return 1
  fi
  log "$name: ok in $(($(date +%s) - t0)) s"
}

# 0. What the machine has.
PY=${PYTHON:-python3}
{
  grep PRETTY_NAME /etc/os-release
  echo "nproc $(nproc)"
  g++ --version | head -1
  cmake --version | head -1
  echo "ninja $(ninja --version 2>&1)"
  nvcc --version 2>&1 | tail -1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"available", torch.cuda.is_available(), "nccl", torch.cuda.nccl.version())'
} > "$OUT/machine.txt" 2>&1
sed 's/^/gpu-check: machine: /' "$OUT/machine.txt" | tee -a "$OUT/summary.txt"
TORCH_CMAKE=$($PY -c 'import torch; print(torch.utils.cmake_prefix_path)')
SITE=$($PY -c 'import site; print(site.getsitepackages()[0])')

# 1. Dependencies from the carried .deb files, unpacked (not installed) into a prefix. A
# library the system lacks is linked into $PREFIX/missing, the only folder of the prefix on
# the library path; the -dev packages' headers and link names are found through CMake's
# prefix path. The wheels' CUDA libraries (nvidia/*/lib) go on the library path too: the
# linker needs them to resolve libtorch_cuda's own dependencies.
PREFIX="$ROOT/build-gpu/prefix"
if [ -d "$DEBS" ]; then
  mkdir -p "$PREFIX/missing"
  for deb in "$DEBS"/*.deb; do dpkg -x "$deb" "$PREFIX"; done
  ldconfig -p | awk 'NR > 1 {print $1}' | sort -u > "$OUT/system-libraries.txt"
  for lib in "$PREFIX"/usr/lib/x86_64-linux-gnu/*.so.* "$PREFIX"/lib/x86_64-linux-gnu/*.so.* \
    "$PREFIX"/usr/lib/*.so.*; do
    if [ ! -f "$lib" ] || [ -L "$lib" ]; then continue; fi
    soname=$(objdump -p "$lib" 2> /dev/null | awk '$1 == "SONAME" {print $2}')
    [ -n "$soname" ] || continue
    grep -qxF "$soname" "$OUT/system-libraries.txt" || ln -sf "$lib" "$PREFIX/missing/$soname"
  done
  log "libraries the system lacks, taken from the .deb files: $(find "$PREFIX/missing" -mindepth 1 | wc -l)"
  export PATH="$PATH:$PREFIX/usr/bin"
fi
wheel_libs=$(find "$SITE/nvidia" "$SITE/torch/lib" -maxdepth 3 -type d -name lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH="$PREFIX/missing:${wheel_libs}${LD_LIBRARY_PATH:-}"

# NCCL: the CUDA toolkit's, else the one the torch wheel loads (nvidia-nccl), so that one
# copy serves both.
nccl_args=()
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ]; then
  nccl_h=$(find "$SITE/nvidia" -name nccl.h 2>/dev/null | head -1)
  nccl_so=$(find "$SITE/nvidia" -name 'libnccl.so*' 2>/dev/null | head -1)
  if [ -n "$nccl_h" ] && [ -n "$nccl_so" ]; then
    nccl_args=(-DNCCL_INCLUDE_DIR="$(dirname "$nccl_h")" -DNCCL_LIBRARY="$nccl_so")
  fi
fi

# 2. Configure and build against the wheel's LibTorch (or unpack an earlier run's binaries).
BIN="$ROOT/build-gpu"
if [ -n "${GPU_PREBUILT:-}" ]; then
  tar xzf "$GPU_PREBUILT" -C "$ROOT" && log "binaries from $GPU_PREBUILT" || exit 1
else
  # Keep going past errors (ninja -k 0, make -k): every compile error in one log.
  generator=()
  keep_going=(-- -k)
  if command -v ninja > /dev/null; then generator=(-G Ninja) && keep_going=(-- -k 0); fi
  step configure 120 cmake -S . -B build-gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_CMAKE;$PREFIX/usr;$PREFIX/usr/lib/x86_64-linux-gnu/cmake;$PREFIX/usr/share/cmake" \
    -DCMAKE_INCLUDE_PATH="$PREFIX/usr/include" \
    -DCMAKE_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu;$PREFIX/usr/lib" \
    -DCMAKE_CXX_FLAGS="-isystem $PREFIX/usr/include -isystem $PREFIX/usr/include/x86_64-linux-gnu" \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "${nccl_args[@]}" || exit 1
  grep "partrain:" "$OUT/configure.log" | tee -a "$OUT/summary.txt"
  if ! step build 420 cmake --build build-gpu -j"$(nproc)" \
    --target partrain gpu_tests gpu_torch_tests gpu_comm_tests "${keep_going[@]}"; then
    grep -E "error|undefined reference" "$OUT/build.log" | sort -u | head -40 > "$OUT/build-errors.txt"
    cat "$OUT/build-errors.txt"
    exit 1
  fi
  (cd "$ROOT" && tar czf "$OUT/partrain-gpu-bin.tgz" build-gpu/partrain \
    build-gpu/tests/gpu/gpu_tests build-gpu/tests/gpu/gpu_torch_tests build-gpu/tests/gpu/gpu_comm_tests)
fi
"$BIN/partrain" version | tee "$OUT/version.txt"
ldd "$BIN/partrain" | grep "not found" | sed 's/^/gpu-check: MISSING /' | tee -a "$OUT/summary.txt"
log "ready after $(($(date +%s) - started)) s"
export PARTRAIN_EXE="$BIN/partrain"

# 3. GPU tests: comm_backends on CUDA buffers, DataParallel and the reducer with CUDA tensors,
# then whole runs of the executable.
for t in gpu_comm_tests gpu_torch_tests gpu_tests; do
  step "$t" 240 "$BIN/tests/gpu/$t" --gtest_brief=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/$t.log" | sed "s/^/gpu-check: $t /" | tee -a "$OUT/summary.txt"
done

# 4. Every collective over nccl on CUDA memory, checked bit for bit by the bench. One rank:
# NCCL refuses two ranks of one communicator on one GPU.
for c in allreduce reduce_scatter allgather broadcast; do
  step "nccl-$c" 60 "$BIN/partrain" bench allreduce --backend nccl --world 1 --collective "$c" \
    --sizes 4K,1M,64M --json "$OUT/nccl-$c.json"
done

DATA="$ROOT/build-gpu/c100"
[ -f "$DATA/train.bin" ] || step synth 60 "$BIN/partrain" data synth --format cifar100-bin \
  --out "$DATA" --train "${GPU_TRAIN:-50000}" --test 10000 --seed 0
EPOCHS=${GPU_EPOCHS:-3}
RUNS="$ROOT/build-gpu/runs"
common=(--set data.root="$DATA" --set checkpoint.every_epochs=0 --set reference=)

# 5. Overlap: the time each step waits after backward, against the bare allreduce of the
# whole gradient (DigitalNet width 64: 7,076,096 bytes), two ranks sharing the GPU over each
# host backend (the staged path: pinned memory, copies on a side stream), seven buckets
# (bucket_mb 1). With overlap the wait is well under the bare allreduce: only the last
# bucket is left when backward ends. Timing, so it is reported, not asserted.
GRAD_BYTES=7076096
step bare-allreduce 60 "$BIN/partrain" bench allreduce --backend gloo,asio-ring --world 2 \
  --sizes "$GRAD_BYTES" --iters 50 --json "$OUT/bare-allreduce.json"
for backend in gloo asio-ring; do
  step "overlap-$backend" 90 "$BIN/partrain" run configs/cifar100_2gpu.yaml \
    --output "$RUNS/overlap-$backend" "${common[@]}" --set comm.backend="$backend" \
    --set comm.bucket_mb=1 --set train.epochs=1 --set train.max_steps=30
done
$PY - "$OUT/bare-allreduce.json" "$RUNS" <<'PYEOF' | tee -a "$OUT/summary.txt" || failed=1
import json, sys
from pathlib import Path
bare_path = Path(sys.argv[1])
bare = {r["backend"]: r["median_us"] / 1000 for r in json.loads(bare_path.read_text())["results"]} if bare_path.exists() else {}
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

# 6. Benchmarks: partrain against PyTorch's own Python loop, same model, data, GPU, batch.
for batch in 500 1000; do
  step "partrain-b$batch" 120 "$BIN/partrain" run configs/cifar100_1gpu.yaml \
    --output "$RUNS/partrain-b$batch" "${common[@]}" --set data.batch_size=$batch \
    --set data.num_workers=2 --set train.epochs="$EPOCHS"
  step "torch-b$batch" 120 "$PY" bench/gpu/torch_loop.py --data "$DATA" --batch-size $batch \
    --epochs "$EPOCHS" --json "$RUNS/torch-b$batch.json"
done
step partrain-2rank 150 "$BIN/partrain" run configs/cifar100_2gpu.yaml \
  --output "$RUNS/partrain-2rank" "${common[@]}" --set train.epochs="$EPOCHS"

# 7. DataParallel, norm: batch, over every visible GPU, against the one-GPU run of the same
# total batch (partrain-b1000): with its BatchNorm statistics lost, its evaluation would sit
# near chance (1 %). On a one-GPU machine dp is the plain forward; the replicated path on
# one GPU is what GpuDataParallel.* in step 3 checks (two replicas on cuda:0).
if step partrain-dp 120 "$BIN/partrain" run configs/cifar100_dp.yaml --output "$RUNS/partrain-dp" \
  "${common[@]}" --set train.epochs="$EPOCHS"; then
  $PY - "$RUNS" <<'PYEOF' | tee -a "$OUT/summary.txt" || failed=1
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
fi

$PY bench/gpu/summarize.py "$RUNS" | tee -a "$OUT/summary.txt"
log "total $(($(date +%s) - started)) s; $([ "$failed" = 0 ] && echo "every step passed" || echo "SOME STEPS FAILED")"
exit "$failed"
