"""Small workers for notebook 00, `python -m helpers demo` and the tests: an all-reduce of the rank ids, a planted
failure on one rank, a collective one rank never enters.

    launch(all_reduce_rank_ids, 2)        # every rank sees the sum 0 + 1
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from helpers.launch.core import device


def all_reduce_rank_ids() -> dict:
    """Each rank all-reduces its rank id; returns what it saw (the sum should be 0+1+...+(n-1))."""
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank)], device=device())
    dist.all_reduce(t)
    return {
        "rank": rank,
        "world_size": world,
        "backend": dist.get_backend(),
        "device": str(t.device),
        "torch_threads": torch.get_num_threads(),
        "pid": os.getpid(),
        "sum": t.item(),
    }


def _wait_for_all_reduce() -> float:
    """All-reduce a one and read the result: the rank waits for the collective on every backend (gloo blocks in the
    call; NCCL's call returns once queued, and the read waits for the GPU)."""
    t = torch.ones(1, device=device())
    dist.all_reduce(t)
    return t.item()


def fail_on_rank(bad_rank: int = 1) -> int:
    """Raise on `bad_rank` while the other ranks wait for an all-reduce: shows how launch reports a crash."""
    if dist.get_rank() == bad_rank:
        raise ValueError(f"planted failure on rank {bad_rank}")
    _wait_for_all_reduce()
    return dist.get_rank()


def skip_collective_on_rank(skip_rank: int = 1) -> int:
    """Every rank but `skip_rank` waits for an all-reduce that can never complete: a hung collective."""
    if dist.get_rank() != skip_rank:
        _wait_for_all_reduce()
    else:
        time.sleep(3600)
    return dist.get_rank()
