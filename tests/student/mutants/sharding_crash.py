"""The sharded optimizer's constructor kills rank 1 with SIGSEGV (a crash in native code)."""
from _fixture import *  # noqa: F401,F403

import os
import signal

import torch.distributed as dist


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    return ShardedOptimizer(params, optimizer_cls, **kwargs)  # noqa: F405
