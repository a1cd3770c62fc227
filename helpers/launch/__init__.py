"""Run a function on N ranks with torch.distributed set up; get every rank's return value.

Runbook:

    from helpers.launch import launch, device
    results = launch(worker, 2, arg)        # 2 local ranks: gloo on CPU, NCCL with >= 2 GPUs
    results = launch(worker, 2, backend="gloo", device="cpu")   # force gloo on CPU tensors

    # the same worker code, ranks started by torchrun (one node, then two):
    torchrun --nproc-per-node 8 -m helpers demo
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 \
             --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m helpers demo

`launch` starts fresh Python processes (torch.multiprocessing: "forkserver" on a
machine without CUDA, whose server imports torch once; "spawn" with a GPU), so the
worker and its arguments are pickled; functions defined in a notebook cell are
pickled by value (cloudpickle). The parent holds the rendezvous store on a port
the OS picks, so two runs never collide on a port. Ranks do not print: they
return values, and the parent prints and plots.

The code, one idea per module (everything public is importable from here):
    core      each rank's device, the backend, the start method, a rank's body, launch() and finish()
    failures  RankError: which rank failed first and why, the other ranks' state, stopping them
    nodes     torchrun's topology, a free port, a multi-node run rehearsed on one machine
    demo      small workers for notebook 00, `python -m helpers demo` and the tests
"""

from helpers.launch.core import (
    STARTUP_S,
    _under_torchrun,
    choose_backend,
    device,
    finish,
    launch,
    start_method,
    using_device,
)
from helpers.launch.demo import all_reduce_rank_ids, fail_on_rank, skip_collective_on_rank
from helpers.launch.failures import RankError
from helpers.launch.nodes import free_port, run_simulated_nodes, topology_label, torchrun_topology

__all__ = [
    # core
    "STARTUP_S",
    "choose_backend",
    "device",
    "finish",
    "launch",
    "start_method",
    "using_device",
    "_under_torchrun",  # the experiments' bench commands ask whether torchrun started them
    # failures
    "RankError",
    # nodes
    "free_port",
    "run_simulated_nodes",
    "topology_label",
    "torchrun_topology",
    # demo
    "all_reduce_rank_ids",
    "fail_on_rank",
    "skip_collective_on_rank",
]
