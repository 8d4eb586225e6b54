#!/usr/bin/env bash
# Shared set-up for smoke.sh and test.sh: create .venv if missing and install the pinned
# stack (pyproject.toml) plus this package in editable mode. Re-running is cheap: the
# install is skipped while pyproject.toml is unchanged since the last successful one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    case "$version" in
        3.9|3.10|3.11) ;;
        *) echo "setup: mindspore 2.9.0 needs Python 3.9-3.11; $PYTHON is $version (set PYTHON=...)" >&2; exit 2 ;;
    esac
    echo "setup: creating $VENV with $PYTHON ($version)"
    "$PYTHON" -m venv "$VENV"
fi

stamp="$VENV/.llama-npu-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setup: installing pinned dependencies (mindspore, mindformers, torch for the tests: ~4.5 GB the first time)"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip 2>&1 | grep -v "is ignored" || true
    # setuptools ends every editable build with an "Editable installation." warning block
    # (InformationOnly, setuptools/command/editable_wheel.py), which pip >= 25 prints as a
    # BuildBackendWarning (pip/_internal/utils/deprecation.py); this filter, inherited by the
    # build backend's process, drops that one message and changes nothing of the install.
    PYTHONWARNINGS="ignore:Editable installation${PYTHONWARNINGS:+,$PYTHONWARNINGS}" \
        "$VENV/bin/python" -m pip install --quiet -e "$ROOT[test]" 2>&1 | grep -v "is ignored" || true
    # MindFormers writes ./output/log on import unless told where: not into the checkout.
    LOG_MF_PATH="${TMPDIR:-/tmp}/llama-npu-setup-logs" \
        "$VENV/bin/python" -c "import mindspore, mindformers, llama_npu" >/dev/null 2>&1 || {
        echo "setup: installation failed; run: $VENV/bin/python -m pip install -e '$ROOT[test]'" >&2; exit 1; }
    echo "$want" > "$stamp"
fi
