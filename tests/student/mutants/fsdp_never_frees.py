"""FSDP never frees a gathered weight after its module's forward or backward."""
from _fixture import *  # noqa: F401,F403
from _fixture import SHARD_TYPES

from helpers.fsdp import FSDP


class HoardingFSDP(FSDP):
    def _free(self, use, k):
        pass


def get_fsdp(module, compute_dtype=None):
    return HoardingFSDP(module, compute_dtype=compute_dtype, shard_types=SHARD_TYPES)
