"""DDP (2026's get_ddp) keeps each rank's own initial weights: nothing broadcast from rank 0 at construction."""
from _fixture import *  # noqa: F401,F403

import torch
from helpers.ddp import DDPIndividualParameters


class UnbroadcastDDP(DDPIndividualParameters):
    def __init__(self, module):
        own = {k: v.clone() for k, v in module.state_dict().items()}
        super().__init__(module)
        with torch.no_grad():
            for k, v in module.state_dict().items():
                v.copy_(own[k])  # undo the broadcast


def get_ddp(module):
    return UnbroadcastDDP(module)
