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
# Before msrun starts, `llama-npu validate` runs train's pre-flight checks (the output
# directory included). A worker that fails ends the launch within seconds, with the worker's
# exit status and its one-line error last on stderr.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# selftest's multi-card checks (data parallel N against one process) on N workers:
#   scripts/launch.sh --selftest N [llama-npu selftest args, e.g. --json FILE]
# Rank 0 prints the checks and writes the JSON; the exit status is the selftest's.
if [ "${1:-}" = "--selftest" ]; then
    N="${2:-}"
    case "$N" in ''|*[!0-9]*|0|1) echo "launch: --selftest N needs N >= 2 workers, got '$N'" >&2; exit 2 ;; esac
    shift 2
    SELFTEST_LOGS="${LOG_DIR:-runs/msrun_logs/selftest}"
    mkdir -p "$SELFTEST_LOGS" && rm -f "$SELFTEST_LOGS"/worker_*.log
    PATH="$ROOT/.venv/bin:$PATH" "$ROOT/.venv/bin/msrun" --worker_num="$N" --local_worker_num="${LOCAL_WORKERS:-$N}" \
        --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${MASTER_PORT:-8118}" \
        --node_rank="${NODE_RANK:-0}" --log_dir="$SELFTEST_LOGS" --join=True \
        "$ROOT/.venv/bin/llama-npu" selftest "$@" >"$SELFTEST_LOGS/msrun.log" 2>&1
    status=$?
    grep -E "^[a-z_]+[ (].* (pass|fail|skip) |^selftest on |llama-npu: error" "$SELFTEST_LOGS/worker_0.log"
    exit $status
fi
if [ $# -lt 2 ]; then
    echo "usage: scripts/launch.sh RECIPE NUM_WORKERS [llama-npu train args ...]" >&2
    exit 2
fi
RECIPE="$1"; WORKERS="$2"; shift 2
case "$WORKERS" in ''|*[!0-9]*|0) echo "launch: NUM_WORKERS must be a positive integer, got '$WORKERS'" >&2; exit 2 ;; esac
[ -f "$RECIPE" ] || { echo "launch: recipe file not found: $RECIPE" >&2; exit 2; }
[ -x "$ROOT/.venv/bin/msrun" ] || { echo "launch: $ROOT/.venv has no msrun; run scripts/smoke.sh or scripts/setup_env.sh first" >&2; exit 2; }

# Pre-flight before queueing anyone: train's own checks (recipe against WORKERS, device,
# data, model.checkpoint, and the output directory with --resume/--overwrite/--force as
# given), so a refused run never reaches msrun.
sets=(); flags=(); output_dir=""; resume=(); rehearsal=""
prev=""
for arg in "$@"; do
    case "$prev" in
        --set) sets+=(--set "$arg") ;;
        --output-dir) output_dir="$arg" ;;
        --resume) resume=(--resume "$arg") ;;
    esac
    case "$arg" in
        --overwrite|--force) flags+=("$arg") ;;
        --rehearse) flags+=("$arg"); rehearsal="-rehearsal" ;;  # data parallel over the CPU workers
        --set=*) sets+=(--set "${arg#--set=}") ;;
        --output-dir=*) output_dir="${arg#--output-dir=}" ;;
        --resume=*) resume=(--resume "${arg#--resume=}") ;;
    esac
    prev="$arg"
done
# Only node 0 holds rank 0, the one rank that writes the (shared) output directory: another
# node started later would find it already in use by this very launch, so it checks as rank 1.
output_args=(--output-dir "${output_dir:-runs/$(basename "${RECIPE%.*}")$rehearsal}" "${resume[@]}")
if [ "${NODE_RANK:-0}" != 0 ]; then
    output_args+=(--rank 1)
fi
"$ROOT/.venv/bin/llama-npu" validate "$RECIPE" --workers "$WORKERS" "${output_args[@]}" \
    "${sets[@]}" "${flags[@]}" >/dev/null || exit 2

LOG_DIR="${LOG_DIR:-runs/msrun_logs/$(basename "${RECIPE%.*}")}"
mkdir -p "$LOG_DIR"
rm -f "$LOG_DIR"/worker_*.log "$LOG_DIR/msrun.log"  # a previous launch's errors are not this one's
# msrun starts workers with the `python` on PATH: make it the venv's.
export PATH="$ROOT/.venv/bin:$PATH"
# msrun in its own process group (with its scheduler), its output in msrun.log and on the console.
setsid msrun --worker_num="$WORKERS" --local_worker_num="${LOCAL_WORKERS:-$WORKERS}" \
      --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${MASTER_PORT:-8118}" \
      --node_rank="${NODE_RANK:-0}" --log_dir="$LOG_DIR" --join="${JOIN:-True}" \
      --cluster_time_out="${CLUSTER_TIME_OUT:-600}" \
      "$ROOT/.venv/bin/llama-npu" train "$RECIPE" "$@" >"$LOG_DIR/msrun.log" 2>&1 &
msrun_pid=$!
tail -n +1 -f --pid="$msrun_pid" "$LOG_DIR/msrun.log" &
trap 'kill -INT "$msrun_pid" 2>/dev/null' INT TERM  # msrun stops its workers on SIGINT
# When a worker exits non-zero, msrun kills the other workers, then waits for its scheduler,
# which waits CLUSTER_TIME_OUT seconds for the workers that are gone (mindspore/parallel/
# cluster/process_entity/_api.py, join_processes): end msrun and its scheduler instead.
while kill -0 "$msrun_pid" 2>/dev/null; do
    if grep -q "exit with exception" "$LOG_DIR/msrun.log"; then
        sleep 2  # msrun kills the remaining workers first
        kill -TERM -- "-$msrun_pid" 2>/dev/null
        sleep 2
        kill -KILL -- "-$msrun_pid" 2>/dev/null
        break
    fi
    sleep 1
done
wait "$msrun_pid"
status=$?
if [ $status -ne 0 ]; then
    worker_status=$(grep -o "exit with exception. Error code: [0-9]*" "$LOG_DIR/msrun.log" | head -n 1 | grep -o "[0-9]*$")
    errors=()
    for log in "$LOG_DIR"/worker_*.log; do
        [ -f "$log" ] || continue
        rank="${log##*worker_}"; rank="${rank%.log}"
        error=$(grep "llama-npu: error:" "$log" | tail -n 1)
        if [ -n "$error" ]; then
            errors+=("launch: rank $rank failed: ${error#*llama-npu: error: }")
        elif grep -q "Traceback" "$log"; then
            echo "launch: rank $rank crashed; last 25 lines of $log:" >&2
            tail -n 25 "$log" >&2
        fi
    done
    echo "launch: msrun exited with status $status (logs in $LOG_DIR)" >&2
    # The cause last, one line a failing rank, where the eye lands.
    for line in "${errors[@]}"; do echo "$line" >&2; done
    status="${worker_status:-$status}"
fi
exit $status
