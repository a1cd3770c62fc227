"""add_param_group during training hands the whole new group to every rank's inner optimizer: each rank steps (and
keeps the state of) every added parameter; the weights stay right, the state is not sharded."""
from _fixture import *  # noqa: F401,F403

import torch

from _sharded import RoundRobinSharded


class AddsUnsharded(RoundRobinSharded):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.built = False
        super().__init__(params, optimizer_cls, **kwargs)
        self.built = True

    def add_param_group(self, param_group):
        if not self.built:
            return super().add_param_group(param_group)
        torch.optim.Optimizer.add_param_group(self, param_group)
        self.inner.add_param_group(dict(self.param_groups[-1]))


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    return AddsUnsharded(params, optimizer_cls, **kwargs)
