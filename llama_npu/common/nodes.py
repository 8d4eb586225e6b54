"""scripts/launch.sh's help with more than one node, run before and instead of msrun.

`python -m llama_npu.common.nodes check ADDR PORT NODE_RANK` checks MASTER_ADDR and
MASTER_PORT before any worker starts (one line on stderr, exit 2) and prints what msrun
would be on this node: `master` (MASTER_ADDR is one of this host's addresses: msrun starts
the scheduler here), `rehearsal` (the same, but NODE_RANK is not 0: a second node rehearsed
on the scheduler's own host) or `remote`.

`python -m llama_npu.common.nodes agree ADDR PORT NUM_WORKERS LOCAL_WORKERS NODE_RANK TIMEOUT DIGEST`
makes the nodes of a multi-node launch agree before any of them starts a worker: a node
cannot see another's LOCAL_WORKERS, and NUM_WORKERS=4 with LOCAL_WORKERS 2 on node 0 and 1 on
node 1 would start 3 workers for a cluster that waits for a 4th until CLUSTER_TIME_OUT. Node 0
listens on MASTER_PORT + 1 until every other node has sent its layout and recipe digest; each
node prints the first disagreement (one line, exit 2), or all go on.

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
import json
import os
import socket
import subprocess
import sys
import time


class NodeError(Exception):
    """Bad MASTER_ADDR or MASTER_PORT, or nodes that disagree: one line, exit 2, before any worker starts."""


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
    if not local and node_rank == 0:  # msrun would start no scheduler here, and the workers wait for one
        raise NodeError(f"launch: NODE_RANK=0 but MASTER_ADDR={addr} is not one of this node's addresses; node 0 "
                        f"is the node at MASTER_ADDR: give this node its own NODE_RANK")
    if not local:
        return "remote"
    if node_rank != 0:
        return "rehearsal"
    with socket.socket(family, socket.SOCK_STREAM) as server:
        bind(server, target, f"launch: MASTER_PORT={port} is already taken on {addr} (another launch's scheduler?); "
                             f"free it, or give every node the same other MASTER_PORT")
    return "master"


def bind(server, target, taken: str) -> None:
    """Bind `server` to `target`, or one line (`taken`) when another process holds the port."""
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed scheduler's TIME_WAIT is no user
    try:
        server.bind(target)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise NodeError(taken)


# The pre-flight agreement's port, on node 0 only, open only while the nodes agree, closed before msrun
# starts: msrun's scheduler takes MASTER_PORT (mindspore/parallel/cluster/process_entity/_api.py), and
# the workers listen on port ranges the scheduler hands them once they have registered (NodePortRanges,
# libmindspore_cluster.so; 8118 and 8374 for ranks 0 and 1 with MASTER_PORT 23419 here): none is up yet.
AGREE_PORT_OFFSET = 1


def agree(addr: str, port: int, workers: int, local: int, node_rank: int, timeout: int, digest: str) -> None:
    """Returns once every node of the launch has the same NUM_WORKERS, LOCAL_WORKERS and recipe
    digest and its own NODE_RANK; else NodeError with the same line on every node that took part.
    Node 0 waits for the others, and the others retry until node 0 listens (it may start last),
    each at most `timeout` seconds (CLUSTER_TIME_OUT, the others' wait for msrun's scheduler)."""
    family, _, _, _, target = socket.getaddrinfo(addr, port + AGREE_PORT_OFFSET, proto=socket.IPPROTO_TCP)[0]
    mine = {"node_rank": node_rank, "workers": workers, "local": local, "recipe": digest}
    if node_rank == 0:
        _hear_every_node(family, target, mine, timeout)
    else:
        _tell_node_0(target, mine, timeout)


def _disagreement(mine: dict, theirs: dict, host: str, seen: dict) -> str:
    """The first difference between node 0 (`mine`) and a node at `host`, "" if none; `seen`:
    node rank -> host of the nodes already heard."""
    rank, nodes = theirs["node_rank"], mine["workers"] // mine["local"]
    for key, name, why in (("workers", "NUM_WORKERS", "give every node the same NUM_WORKERS"),
                           ("local", "LOCAL_WORKERS", "every node must run the same LOCAL_WORKERS (node R holds "
                                                      "the ranks from R x LOCAL_WORKERS)")):
        if theirs[key] != mine[key]:
            return f"launch: {name} differs between nodes: node 0 has {mine[key]}, node {rank} ({host}) has " \
                   f"{theirs[key]}; {why}"
    if rank in seen:
        return f"launch: two nodes have NODE_RANK={rank} ({seen[rank]} and {host}); give each node its own " \
               f"NODE_RANK in [0, {nodes})"
    if theirs["recipe"] != mine["recipe"]:
        return f"launch: node {rank} ({host}) launches another recipe than node 0 (its file or --set differ: " \
               f"sha256 {mine['recipe'][:12]} on node 0, {theirs['recipe'][:12]} there); give every node the same " \
               f"recipe file and --set"
    return ""


def _hear_every_node(family, target, mine: dict, timeout: int) -> None:
    nodes = mine["workers"] // mine["local"]
    seen, peers = {0: target[0]}, []  # node rank -> host; the connections to answer
    deadline = time.monotonic() + timeout
    with socket.socket(family, socket.SOCK_STREAM) as server:
        bind(server, target, f"launch: port {target[1]} (MASTER_PORT + 1, where the nodes agree before they start) "
                             f"is already taken on {target[0]}; free it, or give every node another MASTER_PORT")
        server.listen()
        try:
            while len(seen) < nodes:
                server.settimeout(max(deadline - time.monotonic(), 0.001))
                try:
                    conn, (host, *_) = server.accept()
                except socket.timeout:
                    missing = ", ".join(str(rank) for rank in range(nodes) if rank not in seen)
                    raise NodeError(f"launch: node(s) {missing} did not reach node 0 at {target[0]}:{target[1]} within "
                                    f"{timeout} s (CLUSTER_TIME_OUT); start launch.sh on every node with the same "
                                    f"NUM_WORKERS, MASTER_ADDR and MASTER_PORT")
                try:
                    conn.settimeout(5)
                    theirs = json.loads(conn.makefile(encoding="utf-8").readline())
                    theirs = {key: type(mine[key])(theirs[key]) for key in mine}
                except (OSError, ValueError, KeyError, TypeError):  # not a launch.sh of this version
                    conn.close()
                    continue
                peers.append(conn)
                problem = _disagreement(mine, theirs, host, seen)
                if problem:
                    raise NodeError(problem)
                seen[theirs["node_rank"]] = host
            _answer(peers, "ok")
        except NodeError as exc:  # every node that came says the same line
            _answer(peers, str(exc))
            raise
        finally:
            for conn in peers:
                conn.close()


def _answer(peers: list, line: str) -> None:
    for conn in peers:
        try:
            conn.sendall(line.encode() + b"\n")
        except OSError:  # that node's launch ended meanwhile
            pass


def _tell_node_0(target, mine: dict, timeout: int) -> None:
    deadline = time.monotonic() + timeout
    where = f"{target[0]}:{target[1]}"
    while True:
        try:
            conn = socket.create_connection(target[:2], timeout=min(3.0, max(deadline - time.monotonic(), 0.1)))
            break
        except OSError:  # node 0 not listening yet (node 1 may start first), or gone since
            if time.monotonic() >= deadline:
                raise NodeError(f"launch: node 0 did not answer at {where} within {timeout} s (CLUSTER_TIME_OUT); "
                                f"start it with the same MASTER_ADDR and MASTER_PORT (it listens there only until "
                                f"every node has reached it: a node started after that, e.g. a second NODE_RANK="
                                f"{mine['node_rank']}, finds it closed)")
            time.sleep(1)
    with conn:
        conn.settimeout(timeout + 5)  # node 0 answers once every node has come, within its own CLUSTER_TIME_OUT
        try:
            conn.sendall(json.dumps(mine).encode() + b"\n")
            answer = conn.makefile(encoding="utf-8").readline().strip()
        except OSError as exc:
            answer = f"({exc.strerror or exc})"
    if answer == "ok":
        return
    if answer.startswith("launch: "):  # node 0's line, the same on every node
        raise NodeError(answer)
    why = f" {answer}" if answer else ""
    raise NodeError(f"launch: node 0 at {where} ended before every node had reached it{why}; its console says why")


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
    try:
        if argv[0] == "check":
            print(where_master_is(argv[1], int(argv[2]), int(argv[3])))
            return 0
        if argv[0] == "agree":
            addr, port, workers, local, node_rank, timeout, digest = argv[1:8]
            agree(addr, int(port), int(workers), int(local), int(node_rank), int(timeout), digest)
            return 0
    except NodeError as exc:
        print(exc, file=sys.stderr)
        return 2
    addr, port, workers, local, node_rank, log_dir, timeout = argv[1:8]
    started = start_workers(addr, int(port), int(workers), int(local), int(node_rank), log_dir, int(timeout),
                            argv[8:])
    return join(started, log_dir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
