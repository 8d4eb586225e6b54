"""Two hosts on one machine: two network namespaces joined by a veth pair, each with its own
private address, so that two `scripts/launch.sh` (NODE_RANK 0 and 1) run as on two hosts:
node 1's MASTER_ADDR is not one of its own addresses, so its msrun starts no scheduler
(`_is_local_ip`, mindspore/parallel/cluster/process_entity/_utils.py). Root only.

Shared by tests/test_two_nodes.py and scripts/fault_matrix.py --two-nodes. Every namespace and
link is named PREFIX<pid>-N / PREFIX<pid>a|b, so that a later run finds and removes what a
killed one left, and never what a live one (another pytest worker) still uses.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import subprocess

PREFIX = "llnpu-t"


def ip(*args, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def why_not() -> str:
    """Why namespaces cannot be made here, or "" when they can be tried."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "network namespaces need root and iproute2's `ip` (CI runs as root)"
    return ""


def ours_or_abandoned(name: str) -> bool:
    """A name given here (PREFIX<pid>...) whose process is this one or gone."""
    pid = int(re.match(rf"{PREFIX}(\d+)", name).group(1))
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def remove_leftovers() -> None:
    """Namespaces named PREFIX<pid>-N (their veth ends go with them) and a veth end left outside one."""
    if shutil.which("ip") is None:
        return
    for name in re.findall(rf"^({PREFIX}\d+-\d)", ip("netns", "list", check=False).stdout, re.M):
        if ours_or_abandoned(name):
            ip("netns", "delete", name, check=False)
    for link in re.findall(rf"^\d+: ({PREFIX}\d+[ab])", ip("-o", "link", check=False).stdout, re.M):
        if ours_or_abandoned(link):
            ip("link", "delete", link, check=False)


def make_nodes() -> list:
    """Two namespaces, a veth pair between them, an address each from 10.X.Y.0/24 (X, Y random:
    the namespaces' routes are their own, so no host route can clash): [(namespace, address)].
    Raises subprocess.CalledProcessError where the kernel refuses."""
    net = f"10.{random.randint(64, 250)}.{random.randint(1, 250)}"
    me = f"{PREFIX}{os.getpid()}"
    nodes = [(f"{me}-{n}", f"{net}.{n + 1}") for n in (0, 1)]
    ip("link", "add", f"{me}a", "type", "veth", "peer", "name", f"{me}b")
    for (ns, addr), end in zip(nodes, "ab"):
        ip("netns", "add", ns)
        ip("link", "set", f"{me}{end}", "netns", ns)
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", f"{me}{end}")
        ip("-n", ns, "link", "set", f"{me}{end}", "up")
        ip("-n", ns, "link", "set", "lo", "up")
    return nodes


def in_node(nodes: list, n: int, command: list) -> list:
    """`command` run inside node `n`'s namespace (`ip netns exec` execs it: the pid is the command's)."""
    return ["ip", "netns", "exec", nodes[n][0], *command]


def node_env(nodes: list, n: int, port) -> dict:
    """launch.sh's environment for node `n` of two, one worker each."""
    return {"NODE_RANK": str(n), "LOCAL_WORKERS": "1", "MASTER_ADDR": nodes[0][1], "MASTER_PORT": str(port)}
