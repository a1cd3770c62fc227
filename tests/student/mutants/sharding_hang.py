"""The sharded optimizer's constructor enters a collective on rank 0 only: rank 0 waits forever for rank 1."""
from _fixture import *  # noqa: F401,F403

import time

import torch
import torch.distributed as dist


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))
    else:
        time.sleep(3600)
    return ShardedOptimizer(params, optimizer_cls, **kwargs)  # noqa: F405
