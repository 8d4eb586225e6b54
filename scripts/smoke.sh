#!/usr/bin/env bash
# The main job: set up, then fine-tune the tiny Llama 3.2-architecture model on the shipped
# Chinese sample on the CPU (recipes/cpu_smoke.yaml). Extra arguments go to `llama-npu train`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh"  # the base package: the smoke run needs no extra (no torch)
cd "$ROOT"
exec "$ROOT/.venv/bin/llama-npu" train recipes/cpu_smoke.yaml --output-dir runs/cpu_smoke --overwrite "$@"
