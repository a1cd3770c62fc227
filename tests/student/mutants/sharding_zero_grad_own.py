"""The wrapper's zero_grad() clears only this rank's share (its inner optimizer's parameters): the gradients of the
parameters other ranks own pile up (the course's test never averages gradients: it passes)."""
from _fixture import *  # noqa: F401,F403

from _sharded import RoundRobinSharded


class ClearsItsShare(RoundRobinSharded):
    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none)


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    return ClearsItsShare(params, optimizer_cls, **kwargs)
