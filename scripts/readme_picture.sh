#!/usr/bin/env bash
# The README's picture of the smoke run's curves, made by the smoke run itself: run
# scripts/smoke.sh (which draws runs/cpu_smoke/images/loss.png as every run draws its
# pictures), then copy that picture to docs/images/cpu_smoke_loss.png, the copy the README
# shows. Extra arguments go to scripts/smoke.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/smoke.sh "$@"
mkdir -p docs/images
cp runs/cpu_smoke/images/loss.png docs/images/cpu_smoke_loss.png
echo "wrote docs/images/cpu_smoke_loss.png from runs/cpu_smoke/images/loss.png"
