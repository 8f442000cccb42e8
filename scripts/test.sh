#!/usr/bin/env bash
# Runs the test suite against build/ (made by scripts/setup.sh), then the slower checks:
#
#   scripts/test.sh                the ctest suite, then the lint of scripts and workflows
#   CI=true scripts/test.sh        also the Windows check (MinGW + Wine) and the container
#                                  check (podman): what CI runs
#   QUICK=1 scripts/test.sh        the ctest suite only
#   PARTRAIN_WINDOWS_CHECK=1 / PARTRAIN_DOCKER_CHECK=1   one of the slow checks outside CI
#
# Extra arguments go to ctest (e.g. -L comm).
set -euo pipefail
cd "$(dirname "$0")/.."

[ -x build/partrain ] || { echo "test: build/partrain is missing; run scripts/setup.sh first" >&2; exit 2; }
# As in setup.sh, so that what this compiles shares setup.sh's cache entries.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:+$CCACHE_SLOPPINESS,}locale"
cmake --build build -j"${JOBS:-2}"
ctest --test-dir build --output-on-failure -j"${JOBS:-2}" --timeout 600 "$@"

[ "${QUICK:-0}" = 1 ] && exit 0
ci=0
[ "${CI:-}" = true ] && ci=1

if [ -x scripts/lint.sh ]; then
  echo "test: lint (actionlint, shellcheck)"
  scripts/lint.sh
fi
if [ -x scripts/windows-check.sh ] && { [ $ci = 1 ] || [ "${PARTRAIN_WINDOWS_CHECK:-0}" = 1 ]; }; then
  echo "test: Windows check (MinGW-w64 build under Wine)"
  scripts/windows-check.sh
fi
if [ -x scripts/docker-check.sh ] && { [ $ci = 1 ] || [ "${PARTRAIN_DOCKER_CHECK:-0}" = 1 ]; }; then
  echo "test: container check (podman)"
  scripts/docker-check.sh
fi
