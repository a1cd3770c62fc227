"""DDP (individual parameters) that averages by halving: right on the course's 2 ranks, wrong on any other number."""
from _fixture import *  # noqa: F401,F403

from helpers.ddp import DDPIndividualParameters
from torch import distributed as dist


class HalvingDDP(DDPIndividualParameters):
    def _all_reduce(self, flat):
        flat.div_(2)  # BUG: the world size is not always 2
        return dist.all_reduce(flat, async_op=True)


def get_ddp_individual_parameters(module):
    return HalvingDDP(module)
