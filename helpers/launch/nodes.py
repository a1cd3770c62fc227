"""Ranks started by torchrun, and a multi-node run rehearsed on one machine: the topology seen from inside the process
group, a free loopback port, and one torchrun agent per simulated node.

    runs = run_simulated_nodes(["bench", "collectives", "--profile", "cpu", "--sizes", "4096B"])   # one per agent
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch.distributed as dist


def torchrun_topology() -> dict:
    """Under torchrun, inside the process group: nodes (agents), distinct hosts, and whether the nodes were simulated
    on fewer hosts (several agents on one machine, e.g. a multi-node rehearsal on a laptop). Every rank calls it."""
    world = dist.get_world_size()
    names = [None] * world
    dist.all_gather_object(names, socket.gethostname())
    nodes = world // int(os.environ.get("LOCAL_WORLD_SIZE", world))
    hosts = len(set(names))
    return {
        "nodes": nodes,
        "hosts": hosts,
        "simulated": nodes > hosts,
        "topology": topology_label(nodes, hosts),
    }


def topology_label(nodes: int, hosts: int) -> str:
    """How a saved run's provenance names its topology: "2 node(s)", or "2 node(s) simulated on 1 host(s)"."""
    return f"{nodes} node(s)" + (f" simulated on {hosts} host(s)" if nodes > hosts else "")


def free_port() -> int:
    """A loopback port nobody was listening on a moment ago (for a rendezvous a script starts itself)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_simulated_nodes(
    argv: list[str], nodes: int = 2, timeout_s: float = 300, cwd=None
) -> list[subprocess.CompletedProcess]:
    """Rehearse a multi-node run on this machine: one torchrun agent per node (`--nnodes N --node-rank r`, one
    process each, c10d rendezvous on a free loopback port), each running `python -m helpers ARGV`. Every agent is
    killed if any fails or the run passes `timeout_s`. Real multi-node numbers need real nodes: this checks the path."""
    import uuid

    port = free_port()
    run_id = uuid.uuid4().hex[:8]
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(nodes),
                "--node-rank",
                str(r),
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-id",
                run_id,
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "-m",
                "helpers",
                *argv,
            ],
            cwd=cwd or Path(__file__).resolve().parents[2],  # the repository root
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(nodes)
    ]
    try:
        outs = [a.communicate(timeout=timeout_s) for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.communicate()
    return [
        subprocess.CompletedProcess(a.args, a.returncode, out, err) for a, (out, err) in zip(agents, outs, strict=True)
    ]
