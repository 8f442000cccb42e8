#!/usr/bin/env bash
# Installs every Debian package partrain's build and tests need, then configures and builds
# into build/ (the executable is build/partrain). Safe to run again: apt-get skips what is
# installed, ccache and Ninja skip what is built.
#
#   scripts/setup.sh              install + build
#   SKIP_APT=1 scripts/setup.sh   build only (packages already there)
#   SKIP_BUILD=1 scripts/setup.sh install only (for builds of another kind: scripts/sanitize.sh,
#                                 scripts/fuzz.sh)
#   Build: BUILD_TYPE (default Release), JOBS (default 2), CMAKE_ARGS (more -D options)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config
  clang-format                      # scripts/lint.sh checks the C++ formatting
  libgoogle-perftools-dev           # tcmalloc, partrain's malloc (cli/CMakeLists.txt)
  libjemalloc2                      # bench/ddp/allocators.sh compares it with tcmalloc
  libopenmpi-dev                    # bench/allreduce/shm.sh builds the Open MPI peer
  libtorch-dev                      # LibTorch 1.13 (CPU)
  libboost-dev                      # Boost.Asio, Boost.Process (header-only)
  libgloo-dev                       # the gloo backend
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev
  zlib1g-dev libcurl4-openssl-dev libarchive-dev libssl-dev
  libjpeg-dev libpng-dev            # image-folder: JPEG and PNG decoding
  libopencv-imgcodecs-dev libopencv-imgproc-dev  # image-folder: other formats, resizing
  libgtest-dev libgmock-dev
  libprotobuf-dev protobuf-compiler  # TensorBoard's event file (trainer/observe/tfevents.proto)
  python3 python3-torch python3-torchvision  # torch.load of checkpoints; the Python DDP peer
  dataset-fashion-mnist             # real data for the Fashion-MNIST reader and runs
  librsvg2-bin                      # renders the parity chart in tests
  openmpi-bin                       # mpirun: the engines tests start ranks with it
  slurmctld slurmd slurm-client munge  # a one-node Slurm cluster the srun test starts itself
  iproute2                          # ip netns / veth / tc: the multi-host tests and benchmarks
)

# shellcheck source=scripts/apt-sources.sh
. scripts/apt-sources.sh
[ "${SKIP_APT:-0}" = 1 ] || apt_install_missing "${packages[@]}"

[ "${SKIP_BUILD:-0}" = 1 ] && { echo "setup: packages installed, build skipped (SKIP_BUILD=1)"; exit 0; }

# ccache keeps LibTorch-heavy objects across clean checkouts; 5 GB is plenty.
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
# Paths below the checkout are hashed relative to it, so a fresh clone elsewhere (as CI
# makes) reuses what an earlier checkout compiled.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"
# The image build (docker/Dockerfile.cpu) runs this script too, on the host's cache when
# scripts/docker-check.sh lends it. The locale (LANG, LC_*) changes only the language of the
# compiler's messages, so it stays out of ccache's hash: otherwise the image (LANG=C.UTF-8)
# misses every object a host with another locale compiled. The compiler check stays ccache's
# default (the compiler's size and mtime), which agrees wherever the same Debian package
# installed the compiler.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:+$CCACHE_SLOPPINESS,}locale"
ccache --max-size=5G >/dev/null 2>&1 || true

# shellcheck disable=SC2086 # CMAKE_ARGS may hold several -D options
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" ${CMAKE_ARGS:-}
cmake --build build -j"${JOBS:-2}"
echo "setup: built $(pwd)/build/partrain"
