#!/usr/bin/env bash
# Runs the test suite against build/ (made by scripts/setup.sh), then the slow checks that
# are asked for:
#   scripts/test.sh                   unit, integration and end-to-end tests (ctest)
#   QUICK=1 scripts/test.sh           the same; slow extra checks are skipped (default
#                                     outside CI)
#   CI=true scripts/test.sh           also every extra check script that exists
set -euo pipefail
cd "$(dirname "$0")/.."

[ -x build/partrain ] || { echo "test: build/partrain is missing; run scripts/setup.sh first" >&2; exit 2; }
cmake --build build -j"${JOBS:-2}"
ctest --test-dir build --output-on-failure -j"${JOBS:-2}" --timeout 600 "$@"
