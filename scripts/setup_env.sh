#!/usr/bin/env bash
# Shared set-up for smoke.sh and test.sh: create .venv if missing and install the pinned
# stack (pyproject.toml) plus this package in editable mode, with the extras named as
# arguments (none: the base package, which the smoke run needs; `test`: the suite's reference
# implementations, torch included; `offload`: the host optimizer's kernel). Re-running is
# cheap: the install is skipped while pyproject.toml is unchanged since the last successful
# one and every extra asked for is among those it installed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"

for extra in "$@"; do
    case "$extra" in
        test|offload) ;;
        *) echo "setup: unknown extra '$extra' (expected test or offload: pyproject.toml's optional dependencies)" >&2; exit 2 ;;
    esac
done

if [ ! -x "$VENV/bin/python" ]; then
    version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    case "$version" in
        3.11) ;;
        *) echo "setup: the pinned stack installs on Python 3.11 (pyproject.toml requires-python); $PYTHON is $version (set PYTHON=...)" >&2; exit 2 ;;
    esac
    echo "setup: creating $VENV with $PYTHON ($version)"
    "$PYTHON" -m venv "$VENV"
fi

# The stamp: pyproject.toml's hash, then the extras installed with it, one line.
stamp="$VENV/.llama-npu-installed"
hash="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
read -r stamped_hash stamped_extras 2>/dev/null < "$stamp" || { stamped_hash=""; stamped_extras=""; }
extras="$*"
# Extras installed under the same pins stay installed: the smoke run after the tests keeps torch.
if [ "$stamped_hash" = "$hash" ]; then extras="$stamped_extras $*"; fi
extras="$(printf '%s\n' $extras | sort -u | paste -sd' ' -)"
missing=""
for extra in "$@"; do
    case " $stamped_extras " in *" $extra "*) ;; *) missing="$missing $extra" ;; esac
done
if [ "$stamped_hash" != "$hash" ] || [ -n "$missing" ]; then
    target="$ROOT${extras:+[$(echo "$extras" | tr ' ' ',')]}"
    echo "setup: installing the pinned stack${extras:+ with the extras: $extras} (mindspore, mindformers: about 3.7 GB the first time)"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip 2>&1 | grep -v "is ignored" || true
    # setuptools ends every editable build with an "Editable installation." warning block
    # (InformationOnly, setuptools/command/editable_wheel.py), which pip >= 25 prints as a
    # BuildBackendWarning (pip/_internal/utils/deprecation.py); this filter, inherited by the
    # build backend's process, drops that one message and changes nothing of the install.
    PYTHONWARNINGS="ignore:Editable installation${PYTHONWARNINGS:+,$PYTHONWARNINGS}" \
        "$VENV/bin/python" -m pip install --quiet -e "$target" 2>&1 | grep -v "is ignored" || true
    imports="mindspore, mindformers, llama_npu"
    case " $extras " in *" offload "*|*" test "*) imports="$imports, numba" ;; esac
    case " $extras " in *" test "*) imports="$imports, torch, pytest" ;; esac
    # MindFormers writes ./output/log on import unless told where: not into the checkout.
    LOG_MF_PATH="${TMPDIR:-/tmp}/llama-npu-setup-logs" \
        "$VENV/bin/python" -c "import $imports" >/dev/null 2>&1 || {
        echo "setup: installation failed; run: $VENV/bin/python -m pip install -e '$target'" >&2; exit 1; }
    echo "$hash $extras" > "$stamp"
fi
