#!/usr/bin/env bash
# Launch `llama-npu train` on NUM_WORKERS processes with MindSpore's msrun.
#
#   scripts/launch.sh RECIPE NUM_WORKERS [llama-npu train args ...]
#
# NUM_WORKERS is the total over all nodes. The recipe's strategies.parallel.data: auto (the
# default) becomes NUM_WORKERS / (model x pipeline), printed by the check below; an explicit
# data must make data x model x pipeline equal NUM_WORKERS.
# Environment overrides (multi-node: run once per node):
#   LOCAL_WORKERS  workers on this node         (default: NUM_WORKERS)
#   MASTER_ADDR    address of node 0's scheduler (default: 127.0.0.1)
#   MASTER_PORT    its port                      (default: 8118)
#   NODE_RANK      this node's index             (default: 0)
#   LOG_DIR        per-worker logs               (default: runs/msrun_logs/<recipe name>)
#   JOIN           wait for the workers          (default: True)
#   CLUSTER_TIME_OUT  seconds the others wait when a process is missing (default: 600)
# A failing worker makes this script exit non-zero and print that worker's log tail.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ $# -lt 2 ]; then
    echo "usage: scripts/launch.sh RECIPE NUM_WORKERS [llama-npu train args ...]" >&2
    exit 2
fi
RECIPE="$1"; WORKERS="$2"; shift 2
case "$WORKERS" in ''|*[!0-9]*|0) echo "launch: NUM_WORKERS must be a positive integer, got '$WORKERS'" >&2; exit 2 ;; esac
[ -f "$RECIPE" ] || { echo "launch: recipe file not found: $RECIPE" >&2; exit 2; }
[ -x "$ROOT/.venv/bin/msrun" ] || { echo "launch: $ROOT/.venv has no msrun; run scripts/smoke.sh or scripts/setup_env.sh first" >&2; exit 2; }

# Refuse a recipe that cannot run on WORKERS processes before queueing anyone.
sets=()
prev=""
for arg in "$@"; do
    [ "$prev" = "--set" ] && sets+=(--set "$arg")
    prev="$arg"
done
"$ROOT/.venv/bin/llama-npu" validate "$RECIPE" --workers "$WORKERS" "${sets[@]}" || exit 2

LOG_DIR="${LOG_DIR:-runs/msrun_logs/$(basename "${RECIPE%.*}")}"
mkdir -p "$LOG_DIR"
# msrun starts workers with the `python` on PATH: make it the venv's.
export PATH="$ROOT/.venv/bin:$PATH"
msrun --worker_num="$WORKERS" --local_worker_num="${LOCAL_WORKERS:-$WORKERS}" \
      --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${MASTER_PORT:-8118}" \
      --node_rank="${NODE_RANK:-0}" --log_dir="$LOG_DIR" --join="${JOIN:-True}" \
      --cluster_time_out="${CLUSTER_TIME_OUT:-600}" \
      "$ROOT/.venv/bin/llama-npu" train "$RECIPE" "$@"
status=$?
if [ $status -ne 0 ]; then
    for log in "$LOG_DIR"/worker_*.log; do
        [ -f "$log" ] || continue
        if grep -qE "Traceback|llama-npu: error|Error:" "$log"; then
            rank="${log##*worker_}"; rank="${rank%.log}"
            echo "launch: rank $rank failed; last 25 lines of $log:" >&2
            tail -n 25 "$log" >&2
        fi
    done
    echo "launch: msrun exited with status $status (logs in $LOG_DIR)" >&2
fi
exit $status
