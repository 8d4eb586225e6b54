#!/usr/bin/env bash
# Set up, then run the test suite (CPU only). Extra arguments go to pytest.
# --quick runs only the tests marked `quick` (each command driven once, under 3 minutes on
# 2 cores) for use while working; CI runs the whole suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
args=()
for arg in "$@"; do
    if [ "$arg" = "--quick" ]; then args+=(-m quick); else args+=("$arg"); fi
done
"$ROOT/scripts/setup_env.sh" test  # torch, trl, pytest and the offload extra's kernel
cd "$ROOT"
# Two pytest processes (TEST_WORKERS; 0 runs the tests in this one): the suite's time goes
# mostly to single-threaded start-up and graph compiles, so one process keeps about one core
# busy. --dist loadgroup keeps the tests that share a session fixture together, and
# --no-loadscope-reorder starts the groups in the order tests/conftest.py gives them (heaviest
# first) rather than by their number of tests.
exec "$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-2}" --dist loadgroup \
    --no-loadscope-reorder ${args[@]+"${args[@]}"}
