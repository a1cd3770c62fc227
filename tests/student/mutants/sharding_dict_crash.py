"""The sharded optimizer reads every element of params as a tensor (to size its shares): parameter groups (dicts),
which the handout allows, raise AttributeError (the course's test passes a list of tensors: it passes)."""
from _fixture import *  # noqa: F401,F403

from _sharded import RoundRobinSharded


class SizesUpFront(RoundRobinSharded):
    def __init__(self, params, optimizer_cls, **kwargs):
        params = list(params)
        self.total = sum(p.numel() for p in params)
        super().__init__(params, optimizer_cls, **kwargs)


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    return SizesUpFront(params, optimizer_cls, **kwargs)
