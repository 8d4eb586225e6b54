"""scripts/launch.sh's help with more than one node, run before and instead of msrun.

`python -m llama_npu.common.nodes check ADDR PORT NODE_RANK` checks MASTER_ADDR and
MASTER_PORT before any worker starts (one line on stderr, exit 2) and prints what msrun
would be on this node: `master` (MASTER_ADDR is one of this host's addresses: msrun starts
the scheduler here), `rehearsal` (the same, but NODE_RANK is not 0: a second node rehearsed
on the scheduler's own host) or `remote`.

`python -m llama_npu.common.nodes workers ...` starts a rehearsed node's workers without
msrun, so without a second scheduler (msrun starts one whenever MASTER_ADDR is local,
mindspore/parallel/cluster/process_entity/_api.py, ProcessManager.run, and the second one
fails "Address already in use"). It follows MindSpore's own multi-node form: each worker
gets MS_ROLE=MS_WORKER, MS_SCHED_HOST, MS_SCHED_PORT, MS_WORKER_NUM and MS_NODE_ID, as msrun's
_ComputeGraphNode sets them (same file), and it writes and reports like msrun, so that
launch.sh supervises it as it does msrun.
"""
from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time


class NodeError(Exception):
    """Bad MASTER_ADDR or MASTER_PORT: one line, exit 2, before any worker starts."""


def where_master_is(addr: str, port: int, node_rank: int) -> str:
    """'master', 'rehearsal' or 'remote' (see above); SystemExit with one line when MASTER_ADDR
    does not resolve or has no route, or when the scheduler's port is taken on node 0 (NodeError)."""
    try:
        family, _, _, _, target = socket.getaddrinfo(addr, port, proto=socket.IPPROTO_TCP)[0]
    except socket.gaierror as exc:
        raise NodeError(f"launch: MASTER_ADDR={addr} does not resolve ({exc.strerror}); give node 0's address, "
                         f"or a host name this node resolves")
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:  # picks the route and source address, sends nothing (msrun's _utils._get_local_ip does the same)
            probe.connect(target)
        except OSError as exc:
            raise NodeError(f"launch: MASTER_ADDR={addr} has no route from this node ({exc.strerror}); check the "
                             f"address and this node's network")
        local = probe.getsockname()[0] == target[0]
    if not local:
        return "remote"
    if node_rank != 0:
        return "rehearsal"
    with socket.socket(family, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed scheduler's TIME_WAIT is no user
        try:
            server.bind(target)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise NodeError(f"launch: MASTER_PORT={port} is already taken on {addr} (another launch's scheduler?); "
                             f"free it, or give every node the same other MASTER_PORT")
    return "master"


def start_workers(addr: str, port: int, workers: int, local: int, node_rank: int, log_dir: str,
                  timeout: int, command: list) -> list:
    """This node's workers, with msrun's environment, each in its own session and log."""
    started = []
    for index in range(local):
        rank = node_rank * local + index  # msrun's _get_node_id_and_log_path
        env = dict(os.environ, MS_ROLE="MS_WORKER", MS_SCHED_HOST=addr, MS_SCHED_PORT=str(port),
                   MS_WORKER_NUM=str(workers), MS_NODE_ID=str(rank), RANK_ID=str(rank), RANK_SIZE=str(workers),
                   DEVICE_ID=str(index), MS_TOPO_TIMEOUT=str(timeout))
        log = open(os.path.join(log_dir, f"worker_{rank}.log"), "w", encoding="utf-8")
        started.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        preexec_fn=os.setsid))
        log.close()
        print(f"Start worker process with rank id:{rank}, log file:{log.name}.", flush=True)
    return started


def join(workers: list, log_dir: str) -> int:
    """Wait like msrun's join_processes: the first non-zero exit, in msrun's words (launch.sh reads
    them), ends the others; 0 when every worker exits 0. The logs are followed on stdout."""
    tails = [subprocess.Popen(["tail", "-n", "+1", "-f", os.path.join(log_dir, name)])
             for name in sorted(os.listdir(log_dir)) if name.startswith("worker_")]
    try:
        while True:
            codes = [proc.poll() for proc in workers]
            failed = next((proc for proc, code in zip(workers, codes) if code not in (None, 0)), None)
            if failed is not None:
                print(f"[ERROR] ME({os.getpid()}:0,MainProcess) Worker process {failed.pid} exit with exception. "
                      f"Error code: {failed.returncode}.", flush=True)
                for proc in workers:
                    if proc.poll() is None:
                        os.killpg(proc.pid, 9)
                return 1
            if all(code == 0 for code in codes):
                return 0
            time.sleep(1)
    finally:
        time.sleep(0.5)  # the tails' last lines
        for tail in tails:
            tail.kill()


def main(argv: list) -> int:
    if argv[0] == "check":
        try:
            print(where_master_is(argv[1], int(argv[2]), int(argv[3])))
        except NodeError as exc:
            print(exc, file=sys.stderr)
            return 2
        return 0
    addr, port, workers, local, node_rank, log_dir, timeout = argv[1:8]
    started = start_workers(addr, int(port), int(workers), int(local), int(node_rank), log_dir, int(timeout),
                            argv[8:])
    return join(started, log_dir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
