#!/usr/bin/env bash
# Builds partrain's LibTorch-free core for Windows with MinGW-w64 and runs its tests under
# Wine (stores, asio-ring, shm, config, and the launcher of `partrain run` with its fake
# workers), then checks that a Linux rank and a Windows rank interoperate (asio-ring allreduce
# over 127.0.0.1, rendezvous through one file store that each side names in its own OS's
# spelling).
#
#   scripts/windows-check.sh          install (apt), build the Windows dependencies, build, test
#   SKIP_APT=1 scripts/windows-check.sh   packages already there
#   QUICK=1 scripts/windows-check.sh      skipped (exit 0), for quick local test runs; CI
#                                         (CI=true) always runs it
#
# Everything goes under build-windows/: deps/ (GoogleTest, yaml-cpp and Boost.Filesystem built
# for Windows from Debian's sources, the header-only libraries linked in), win/ (the cross build), linux/ (the
# Linux rank of the interop test), wine/ (the Wine prefix). Safe to run again: finished
# dependency builds leave a stamp, ccache and Ninja skip what is built.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if [ "${QUICK:-0}" = 1 ] && [ "${CI:-}" != true ]; then
  echo "windows-check: skipped (QUICK=1)"
  exit 0
fi

jobs=${JOBS:-2}
out=$root/build-windows
deps=$out/deps
src=$out/deps-src
toolchain=$root/cmake/toolchain-mingw64.cmake
mkdir -p "$out" "$deps/include" "$src"
started=$(date +%s)
step() { echo "windows-check: [$(( $(date +%s) - started ))s] $*"; }
# shellcheck source=scripts/apt-sources.sh
. scripts/apt-sources.sh

# --- packages -------------------------------------------------------------------------------
# yaml-cpp has no Windows build in Debian, so its source package is built here; apt-get source
# needs a deb-src line for the same mirror.
if [ "${SKIP_APT:-0}" != 1 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  packages=(g++-mingw-w64-x86-64-posix gcc-mingw-w64-x86-64-posix wine wine64 dpkg-dev
            cmake ninja-build ccache libgtest-dev libboost-dev nlohmann-json3-dev)
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  src_list=/etc/apt/sources.list.d/partrain-deb-src.sources
  need_update=0
  if ! grep -rqs '^Types:.*deb-src\|^deb-src ' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    mirror=$(apt_bookworm_mirror)
    [ -n "$mirror" ] || { echo "windows-check: apt knows no bookworm mirror to take sources from" >&2; exit 1; }
    step "adding a deb-src entry for $mirror ($src_list)"
    printf '%s\n' 'Types: deb-src' "URIs: $mirror" 'Suites: bookworm' \
      'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
      $SUDO tee "$src_list" >/dev/null
    need_update=1
  fi
  if [ "${#missing[@]}" -gt 0 ] || [ "$need_update" = 1 ]; then
    step "apt-get install ${missing[*]:-(sources only)}"
    $SUDO apt-get update -qq -o DPkg::Lock::Timeout=600
    [ "${#missing[@]}" -eq 0 ] || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
      -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}"
  fi
fi

export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
cross=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE="$toolchain"
       -DPARTRAIN_WINDOWS_DEPS="$deps" -DCMAKE_INSTALL_PREFIX="$deps"
       -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

# --- Windows dependencies ---------------------------------------------------------------------
# Header-only libraries come from Linux's /usr/include by links to their own folders: adding
# /usr/include itself would put glibc's headers in front of MinGW's.
ln -sfn /usr/include/boost "$deps/include/boost"
ln -sfn /usr/include/nlohmann "$deps/include/nlohmann"
mkdir -p "$deps/share/cmake"
# nlohmann_json's CMake files locate the headers relative to themselves: a copy under deps/
# points at deps/include.
cp -r /usr/share/cmake/nlohmann_json "$deps/share/cmake/"

gtest_version=$(dpkg-query -W -f='${Version}' libgtest-dev)
if [ "$(cat "$deps/.gtest" 2>/dev/null)" != "$gtest_version" ]; then
  step "building GoogleTest $gtest_version for Windows"
  cmake -S /usr/src/googletest -B "$src/googletest-build" "${cross[@]}" -DBUILD_GMOCK=OFF \
    -DINSTALL_GTEST=ON -Wno-dev >/dev/null
  cmake --build "$src/googletest-build" -j"$jobs" >/dev/null
  cmake --install "$src/googletest-build" >/dev/null
  echo "$gtest_version" >"$deps/.gtest"
fi

yaml_version=$(apt-cache show --no-all-versions libyaml-cpp-dev 2>/dev/null | sed -n 's/^Version: //p')
if [ "$(cat "$deps/.yaml-cpp" 2>/dev/null)" != "$yaml_version" ]; then
  step "building yaml-cpp $yaml_version for Windows from Debian's source package"
  rm -rf "$src/yaml-cpp" && mkdir -p "$src/yaml-cpp"
  # shellcheck disable=SC2015 # the fallback is meant to run whenever the pinned source fails
  (cd "$src/yaml-cpp" && apt-get source -qq "yaml-cpp=$yaml_version" >/dev/null 2>&1 ||
     apt-get source -qq yaml-cpp >/dev/null)
  yaml_src=$(find "$src/yaml-cpp" -mindepth 1 -maxdepth 1 -type d -name 'yaml-cpp*' | head -1)
  [ -n "$yaml_src" ] || { echo "windows-check: apt-get source yaml-cpp gave no tree" >&2; exit 1; }
  cmake -S "$yaml_src" -B "$src/yaml-cpp-build" "${cross[@]}" -DYAML_CPP_BUILD_TESTS=OFF \
    -DYAML_CPP_BUILD_TOOLS=OFF -DYAML_CPP_BUILD_CONTRIB=OFF -DYAML_BUILD_SHARED_LIBS=OFF \
    -Wno-dev >/dev/null
  cmake --build "$src/yaml-cpp-build" -j"$jobs" >/dev/null
  cmake --install "$src/yaml-cpp-build" >/dev/null
  echo "$yaml_version" >"$deps/.yaml-cpp"
fi

# Boost.Process, which the launcher spawns its workers with, is header-only on Linux, but on
# Windows it converts every char string (program, arguments, environment) to the wide strings
# of the Windows API through Boost.Filesystem's path, and that part is compiled. Debian ships
# Boost for Linux only, so libboost_filesystem.a is built here from the source package of the
# very headers in /usr/include/boost (only libs/filesystem/src is unpacked: the whole of Boost
# is not needed).
boost_source=$(dpkg-query -W -f='${source:Package}=${source:Version}' libboost1.74-dev)
if [ "$(cat "$deps/.boost-filesystem" 2>/dev/null)" != "$boost_source" ]; then
  step "building Boost.Filesystem ($boost_source) for Windows from Debian's source package"
  rm -rf "$src/boost" && mkdir -p "$src/boost/obj"
  (cd "$src/boost" && apt-get source --download-only -qq "$boost_source" >/dev/null 2>&1)
  boost_tar=$(find "$src/boost" -maxdepth 1 -name '*.orig.tar.xz' | head -1)
  [ -n "$boost_tar" ] || { echo "windows-check: apt-get source $boost_source gave no tarball" >&2; exit 1; }
  tar -xJf "$boost_tar" -C "$src/boost" --wildcards '*/libs/filesystem/src/*'
  fs_src=$(find "$src/boost" -type d -path '*/libs/filesystem/src' | head -1)
  for f in "$fs_src"/*.cpp; do
    ccache x86_64-w64-mingw32-g++-posix -std=c++20 -O2 -D_WIN32_WINNT=0x0A00 \
      -DBOOST_FILESYSTEM_STATIC_LINK=1 -DBOOST_ALL_NO_LIB -isystem "$deps/include" \
      -c "$f" -o "$src/boost/obj/$(basename "$f" .cpp).o"
  done
  mkdir -p "$deps/lib"
  rm -f "$deps/lib/libboost_filesystem.a"
  x86_64-w64-mingw32-ar rcs "$deps/lib/libboost_filesystem.a" "$src/boost/obj"/*.o
  rm -rf "$src/boost"
  echo "$boost_source" >"$deps/.boost-filesystem"
fi

# --- the Linux rank of the interop test -----------------------------------------------------
step "building the Linux interop rank"
cmake -S tests/windows -B "$out/linux" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
cmake --build "$out/linux" -j"$jobs" --target interop_rank

# --- the Windows build --------------------------------------------------------------------------
step "cross-compiling for Windows (MinGW-w64)"
# Warnings are errors here: the Windows build must be as warning-clean as the Linux one.
cmake -S tests/windows -B "$out/win" "${cross[@]}" -DCMAKE_COMPILE_WARNING_AS_ERROR=ON \
  -DPARTRAIN_INTEROP_LINUX_RANK="$out/linux/interop_rank" >/dev/null
cmake --build "$out/win" -j"$jobs"

# --- tests under Wine -----------------------------------------------------------------------
# Wine's server and services outlive the programs they run and keep every inherited pipe open
# (ctest would wait on them for ever), so they are started first with nothing inherited, and
# stopped at the end whatever happens.
export WINEPREFIX=$out/wine WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
WINE=$(command -v wine || true)
export WINE
wineserver=$(command -v wineserver || command -v wineserver-stable || echo /usr/lib/wine/wineserver)
mkdir -p "$WINEPREFIX"
trap '"$wineserver" -k >/dev/null 2>&1 || true' EXIT
step "starting Wine ($WINEPREFIX)"
"$wineserver" -k >/dev/null 2>&1 || true  # one left from an interrupted run of this prefix
"$wineserver" -p </dev/null >/dev/null 2>&1
timeout 300 wine cmd /c exit </dev/null >/dev/null 2>&1

# One test at a time: the store and ring tests bound every wait by a timeout of a few seconds,
# and Wine's file and socket calls are slower than Linux's; a busy machine would make them
# fail for want of CPU. A Wine that hangs is stopped by the outer bound.
bound=${WINDOWS_CHECK_TIMEOUT:-600}
# A test that fails gets one more try, and the check names it: Wine has ended a freshly started
# test program at once, with no output at all ("Failed 0.02 sec" for a test that otherwise
# takes 0.09 s; seen once in CI, never in 55 runs of the launcher tests here, loaded or not).
# A test that fails twice fails the check.
wine_tests() {  # ctest arguments...
  local log
  log=$(mktemp)
  local status=0
  timeout "$bound" ctest --test-dir "$out/win" --output-on-failure --timeout 180 \
    --repeat until-pass:2 "$@" </dev/null | tee "$log" || status=$?
  local retried
  retried=$(sed -n '/\*\*\*Skipped/d; s/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) .*\*\*\*.*/\1/p' "$log" |
    sort -u | paste -sd " ")
  rm -f "$log"
  if [ -n "$retried" ] && [ "$status" = 0 ]; then
    echo "windows-check: WARNING: passed only on a second try under Wine: $retried"
  fi
  return "$status"
}
step "running the Windows tests under Wine"
wine_tests -LE interop
# The launcher's Ctrl-C test needs a console to send CTRL_C_EVENT through, and Wine gives a
# program one only when it runs on a terminal, which ctest's pipes are not (there the test
# skips, saying so). script(1) lends it a pseudo-terminal; gtest's XML report tells whether
# the test really ran (a skip exits 0 too).
step "running the launcher's Ctrl-C test on a terminal (script)"
console_xml=$out/win/launcher-console.xml
rm -f "$console_xml"
# (The report's name is relative: gtest on Windows takes /work/x for a relative path.)
console_cmd=$(printf 'cd %q && wine tests/cli/launcher_test.exe --gtest_color=no --gtest_filter=%q --gtest_output=xml:%q </dev/null' \
  "$out/win" LauncherProcessTest.ConsoleCtrlCStopsEveryWorker "$(basename "$console_xml")")
timeout 120 script -qec "$console_cmd" /dev/null </dev/null >/dev/null 2>&1 || true
if ! grep -q 'name="ConsoleCtrlCStopsEveryWorker"[^>]*result="completed"' "$console_xml" 2>/dev/null ||
   grep -q '<failure' "$console_xml"; then
  echo "windows-check: LauncherProcessTest.ConsoleCtrlCStopsEveryWorker did not pass on a terminal:" >&2
  cat "$console_xml" >&2 2>/dev/null || true
  exit 1
fi
echo "windows-check: LauncherProcessTest.ConsoleCtrlCStopsEveryWorker passed on a terminal"
step "running the Linux <-> Windows interop tests"
wine_tests -L interop
step "done"
