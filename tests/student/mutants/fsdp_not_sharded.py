"""FSDP keeps a full copy of every weight on every rank beside its shards: nothing saved at init."""
from _fixture import *  # noqa: F401,F403
from _fixture import SHARD_TYPES

from helpers.fsdp import FSDP


class ReplicatingFSDP(FSDP):
    def __init__(self, module, compute_dtype=None):
        full = [p.detach().clone() for p in module.parameters()]
        super().__init__(module, compute_dtype=compute_dtype, shard_types=SHARD_TYPES)
        self.full = full


def get_fsdp(module, compute_dtype=None):
    return ReplicatingFSDP(module, compute_dtype=compute_dtype)
