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
"$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider ${args[@]+"${args[@]}"}
