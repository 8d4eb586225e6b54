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
#   CLUSTER_TIME_OUT  seconds the others wait when a process is missing, and the nodes wait for
#                  each other before any starts a worker (default: 600)
#   NODE_TIMEOUT   seconds node 0's scheduler waits for a worker that stopped answering, e.g.
#                  one killed on another node, before it fails the launch (default: 15; see below)
# Before msrun starts, `llama-npu validate` runs train's pre-flight checks (the output
# directory included). A worker that fails ends the launch within seconds, with the worker's
# exit status and its one-line error last on stderr.
#
# This script is the run's supervisor. SIGINT or SIGTERM to it (Ctrl-C, a scheduler's
# preemption) goes to every worker as SIGTERM, a stop request: each rank finishes the same
# optimizer step, writes its checkpoint, and the launch exits 75 with the command that
# continues it. A second signal kills everything at once. msrun itself is never signalled:
# on SIGINT it SIGKILLs its workers without letting them save (mindspore/parallel/cluster/
# process_entity/_api.py, join_processes). Workers get SIGTERM, not SIGINT: started in the
# background of a non-interactive shell they inherit SIGINT ignored.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# selftest's multi-card checks (data parallel N against one process, the sharded layouts against
# an unsharded reference, the sharded export) on N workers:
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
# More than one node (LOCAL_WORKERS < NUM_WORKERS): the layout, MASTER_ADDR and MASTER_PORT, each
# refused in one line before any worker starts. msrun gives node R the ranks from R x LOCAL_WORKERS
# (mindspore/parallel/cluster/process_entity/_api.py, _get_node_id_and_log_path): every node must
# run the same LOCAL_WORKERS, a divisor of NUM_WORKERS.
LOCAL="${LOCAL_WORKERS:-$WORKERS}"; NODE="${NODE_RANK:-0}"
case "$LOCAL" in
    ''|*[!0-9]*|0) echo "launch: LOCAL_WORKERS must be a positive integer, got '$LOCAL'" >&2; exit 2 ;;
esac
case "${CLUSTER_TIME_OUT:-600}" in
    ''|*[!0-9]*|0) echo "launch: CLUSTER_TIME_OUT must be a positive number of seconds, got '${CLUSTER_TIME_OUT:-}'" >&2; exit 2 ;;
esac
case "${NODE_TIMEOUT:-15}" in
    ''|*[!0-9]*|0) echo "launch: NODE_TIMEOUT must be a positive number of seconds, got '${NODE_TIMEOUT:-}'" >&2; exit 2 ;;
esac
if [ $((WORKERS % LOCAL)) -ne 0 ]; then
    echo "launch: LOCAL_WORKERS=$LOCAL does not divide NUM_WORKERS=$WORKERS; every node must run the same" \
         "LOCAL_WORKERS (node R holds the ranks from R x LOCAL_WORKERS)" >&2
    exit 2
fi
NODES=$((WORKERS / LOCAL))
case "$NODE" in ''|*[!0-9]*) NODE=-1 ;; esac
if [ "$NODE" -lt 0 ] || [ "$NODE" -ge "$NODES" ]; then
    echo "launch: NODE_RANK=${NODE_RANK:-} is outside [0, $NODES): NUM_WORKERS=$WORKERS / LOCAL_WORKERS=$LOCAL" \
         "makes $NODES node(s)" >&2
    exit 2
fi
# master: msrun starts the scheduler here; rehearsal: NODE_RANK > 0 on the scheduler's own host,
# whose workers start without msrun (a second msrun would start a second scheduler); remote.
master=$("$ROOT/.venv/bin/python" -m llama_npu.common.nodes check "${MASTER_ADDR:-127.0.0.1}" \
         "${MASTER_PORT:-8118}" "$NODE") || exit 2
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
run_dir="${output_dir:-runs/$(basename "${RECIPE%.*}")$rehearsal}"  # train's own default
output_args=(--output-dir "$run_dir" "${resume[@]}")
if [ "${NODE_RANK:-0}" != 0 ]; then
    output_args+=(--rank 1)
fi
# --strict-device: here the run starts, so a missing NPU is an error, not a check left for later
"$ROOT/.venv/bin/llama-npu" validate "$RECIPE" --workers "$WORKERS" --strict-device "${output_args[@]}" \
    "${sets[@]}" "${flags[@]}" >/dev/null || exit 2
# More than one node: each has checked only itself. Now the nodes agree on NUM_WORKERS, LOCAL_WORKERS,
# the recipe file and its --set, and have each its own NODE_RANK, before any of them starts a worker:
# node 0 listens on MASTER_PORT + 1 (llama_npu/common/nodes.py, agree) until the others have reached it.
if [ "$NODES" -gt 1 ]; then
    digest=$({ cat "$RECIPE"; printf '%s\0' "${sets[@]}" "$rehearsal"; } | sha256sum | cut -d' ' -f1)
    "$ROOT/.venv/bin/python" -m llama_npu.common.nodes agree "${MASTER_ADDR:-127.0.0.1}" "${MASTER_PORT:-8118}" \
        "$WORKERS" "$LOCAL" "$NODE" "${CLUSTER_TIME_OUT:-600}" "$digest" || exit 2
fi

LOG_DIR="${LOG_DIR:-runs/msrun_logs/$(basename "${RECIPE%.*}")}"
mkdir -p "$LOG_DIR"
# a previous launch's errors are not this one's
rm -f "$LOG_DIR"/worker_*.log "$LOG_DIR/msrun.log" "$LOG_DIR/scheduler.log"
# msrun starts workers with the `python` on PATH: make it the venv's.
export PATH="$ROOT/.venv/bin:$PATH"
# A worker that stops answering (kill -9, its host gone) is found by node 0's scheduler when
# its heartbeats stop: MindSpore's default MS_NODE_TIMEOUT is 30 s, so with the scheduler's
# 3 s check and this script's own wait the launch ended ~35 s after the kill. Workers send a
# heartbeat every 3-5 s from a thread of their own (MS_RETRY_INTERVAL_LOWER/UPPER; compiles
# and checkpoint writes do not hold it up), so 15 s is three missed beats. Only the scheduler
# gets it (strategies/parallel.py, run_scheduler): in a worker MS_NODE_TIMEOUT also sizes the
# wait for a communication group's unique id from rank 0 (ms_collective_comm_lib.cc, 200 s by
# default, raised on large clusters), which a short value would break.
export LLAMA_NPU_SCHEDULER_NODE_TIMEOUT="${NODE_TIMEOUT:-15}"
# msrun in its own process group (with its scheduler), its output in msrun.log and on the console.
if [ "$master" = rehearsal ]; then  # this node's workers, as msrun starts them, without its scheduler
    setsid "$ROOT/.venv/bin/python" -m llama_npu.common.nodes workers "${MASTER_ADDR:-127.0.0.1}" \
        "${MASTER_PORT:-8118}" "$WORKERS" "$LOCAL" "$NODE" "$LOG_DIR" "${CLUSTER_TIME_OUT:-600}" \
        "$ROOT/.venv/bin/llama-npu" train "$RECIPE" "$@" >"$LOG_DIR/msrun.log" 2>&1 &
else
    setsid msrun --worker_num="$WORKERS" --local_worker_num="$LOCAL" \
          --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${MASTER_PORT:-8118}" \
          --node_rank="$NODE" --log_dir="$LOG_DIR" --join="${JOIN:-True}" \
          --cluster_time_out="${CLUSTER_TIME_OUT:-600}" \
          "$ROOT/.venv/bin/llama-npu" train "$RECIPE" "$@" >"$LOG_DIR/msrun.log" 2>&1 &
fi
msrun_pid=$!
# The console shows msrun.log as it grows: the workers' lines, not msrun's own. msrun's logger
# lines carry its pid (`[WARNING] ME(<pid>:...`: its "Distributed job is spawned", the ERROR
# for a worker's exit status, 75 included, "There's worker exits with exception, kill all other
# workers."), its "Start scheduler/worker process" lines, and the RuntimeError traceback it ends
# with after any worker's non-zero exit (mindspore/parallel/cluster/process_entity/_api.py,
# join_processes, start_scheduler, _start_single_worker): this script says what happened in one
# line instead, and all of it stays in msrun.log, with MindSpore's [INFO] lines. A traceback is
# held until its last line shows whose it is: a worker's (tailed into msrun.log) is printed.
# In its own session, so that a Ctrl-C leaves it running.
CONSOLE_FILTER='
    function flush() { if (held != "") printf "%s", held; held = ""; fflush() }
    /^\[INFO\] / || index($0, "] ME(" msrun ":") || /^Start (scheduler|worker) process/ { next }
    /^Traceback / { flush(); held = $0 "\n"; next }
    held != "" && /^RuntimeError: Distributed job exited with exception/ { held = ""; next }
    held != "" && /^ / { held = held $0 "\n"; next }
    { flush(); print; fflush() }
    END { flush() }'
setsid sh -c 'tail -n +1 -f --pid="$1" "$2" | awk -v msrun="$1" "$3"' console "$msrun_pid" "$LOG_DIR/msrun.log" \
    "$CONSOLE_FILTER" &
console_pid=$!

declare -A rank_of=()  # worker pid -> rank, recorded while the worker lives
declare -A told=()     # workers already sent the stop request
stop=""                # the signal this script received
find_workers() {  # msrun's children that train: not its scheduler, not its `tail`s of the logs
    local pid env
    for pid in $(ps -o pid= --ppid "$msrun_pid" 2>/dev/null); do
        [ -n "${rank_of[$pid]:-}" ] && continue
        env=$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ") || continue
        grep -qx "MS_ROLE=MS_WORKER" <<<"$env" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != tail ] || continue
        rank_of[$pid]=$(sed -n 's/^RANK_ID=//p' <<<"$env")
    done
}
tell_workers() {  # the stop request, once to each worker, also to one started after the signal
    local pid
    find_workers
    for pid in "${!rank_of[@]}"; do
        [ -n "${told[$pid]:-}" ] && continue
        kill -TERM "$pid" 2>/dev/null
        told[$pid]=1
    done
}
on_signal() {
    local pid
    if [ -n "$stop" ]; then
        for pid in "${!rank_of[@]}"; do kill -KILL "$pid" 2>/dev/null; done
        # Out of the job table first: bash would otherwise report msrun's "Killed" after the
        # line below, at exit, and a user would read that as the last word (a CI run saw it).
        disown "$msrun_pid" 2>/dev/null
        kill -KILL -- "-$msrun_pid" 2>/dev/null
        echo "launch: second SIG$1: every worker killed; a checkpoint being written is left as a hidden partial directory" >&2
        exit $((128 + $(kill -l "$1")))
    fi
    stop="$1"
    echo "launch: SIG$1 received: every worker finishes its step and saves a checkpoint (send it again to end at once)" >&2
    tell_workers
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
# When a worker exits non-zero, msrun kills the other workers, then waits for its scheduler,
# which waits CLUSTER_TIME_OUT seconds for the workers that are gone (mindspore/parallel/
# cluster/process_entity/_api.py, join_processes): end msrun and its scheduler instead. So too when
# node 0's scheduler times out a worker of another node that stopped answering (killed, its host
# gone: mindspore/ccsrc/cluster/topology/meta_server_node.cc, UpdateTopoState, after
# MS_NODE_TIMEOUT): this node's workers would wait in their next collective.
while kill -0 "$msrun_pid" 2>/dev/null; do
    find_workers
    [ -n "$stop" ] && tell_workers
    if grep -q "exit with exception" "$LOG_DIR/msrun.log" || grep -qs "is timed out" "$LOG_DIR/scheduler.log"; then
        sleep 2  # msrun kills the remaining workers first
        kill -TERM -- "-$msrun_pid" 2>/dev/null
        sleep 2
        kill -KILL -- "-$msrun_pid" 2>/dev/null
        break
    fi
    sleep 1 & wait $!  # a signal interrupts `wait`, so its trap runs at once
done
wait "$msrun_pid"
status=$?
wait "$console_pid" 2>/dev/null  # the workers' last lines, before this script's own

# The command that continues this launch: the same arguments, --resume auto instead of
# --resume/--overwrite, the output directory named, and this node's environment.
continue_command() {
    local words=() arg skip=""
    for name in LOCAL_WORKERS MASTER_ADDR MASTER_PORT NODE_RANK; do
        [ -n "${!name:-}" ] && words+=("$name=${!name}")
    done
    words+=("$0" "$RECIPE" "$WORKERS")
    for arg in "$@"; do
        if [ -n "$skip" ]; then skip=""; continue; fi
        case "$arg" in
            --resume|--output-dir) skip=1 ;;
            --resume=*|--output-dir=*|--overwrite) ;;
            *) words+=("$arg") ;;
        esac
    done
    words+=(--output-dir "$run_dir" --resume auto)
    local quoted
    quoted=$(printf '%q ' "${words[@]}")
    echo "${quoted% }"
}

# A CPU collective whose peer never answered (mindspore/ops/kernel/cpu/native/allreduce_cpu_kernel.cc)
COLLECTIVE_FAILED="Launch kernel failed: [^ ]*(AllReduce|AllGather|Broadcast|ReduceScatter)"
if [ $status -ne 0 ]; then
    line=$(grep -o "Worker process [0-9]* exit with exception. Error code: -\?[0-9]*" "$LOG_DIR/msrun.log" | head -n 1)
    worker_pid=$(grep -o "process [0-9]*" <<<"$line" | grep -o "[0-9]*")
    worker_status=$(grep -o "\-\?[0-9]*$" <<<"$line")
    # A worker of any node timed out by node 0's scheduler, by its rank (msrun's MS_NODE_ID).
    lost=$(grep -so "The node: [0-9]* is timed out" "$LOG_DIR/scheduler.log" | head -n 1 | grep -o "[0-9]*")
    errors=()
    for log in "$LOG_DIR"/worker_*.log; do
        [ -f "$log" ] || continue
        rank="${log##*worker_}"; rank="${rank%.log}"
        error=$(grep "llama-npu: error:" "$log" | tail -n 1)
        if [ -n "$error" ]; then
            errors+=("launch: rank $rank failed: ${error#*llama-npu: error: }")
        elif [ -z "$lost" ] && [ "$NODES" -gt 1 ] && grep -qE "$COLLECTIVE_FAILED" "$log"; then
            # Its peer is gone, on another node: node 1's worker waits in the step's all-reduce
            # until the CPU backend's receive gives up (~40 s) when node 0's rank is killed. Not
            # matched: HCCL's own time-out on Ascend (HCCL_EXEC_TIMEOUT), never run here.
            error="launch: rank $rank failed in a collective with another node's rank, which stopped (killed,"
            errors+=("$error or its host gone); node 0's console names it, and $log says more")
        elif [ -z "$lost" ] && grep -q "Traceback" "$log"; then
            echo "launch: rank $rank crashed; last 25 lines of $log:" >&2
            tail -n 25 "$log" >&2
        fi
    done
    if [ "${worker_status:-0}" -lt 0 ]; then  # killed by signal -N
        errors+=("launch: rank ${rank_of[$worker_pid]:-?} (pid $worker_pid) was killed by SIG$(kill -l $((-worker_status))); the newest step complete on every rank is intact")
        worker_status=$((128 - worker_status))
    fi
    if [ -n "$lost" ]; then
        # This node's ranks failed in a collective with it: the cause is that rank, alone.
        errors=("launch: rank $lost on node $((lost / LOCAL)) stopped answering and node 0's scheduler timed it out;")
        errors[0]+=" that node's console and its LOG_DIR say why"
        worker_status="${worker_status:-1}"
    fi
    [ "$worker_status" != 75 ] && echo "launch: msrun exited with status $status (logs in $LOG_DIR)" >&2
    # The cause last, one line a failing rank, where the eye lands.
    for line in "${errors[@]}"; do echo "$line" >&2; done
    status="${worker_status:-$status}"
fi
if [ "$status" = 75 ]; then
    step=$(grep -ho "stopped by [A-Za-z ]* after step [0-9]*" "$LOG_DIR"/worker_*.log | head -n 1 | grep -o "[0-9]*$")
    echo "launch: every rank stopped after step ${step:-?} and saved it; continue with: $(continue_command "$@")" >&2
elif [ "$status" != 0 ] && [ "$status" != 2 ]; then
    echo "launch: continue with: $(continue_command "$@")" >&2
fi
exit $status
