"""Written for the course's two ranks: owners alternate between rank 0 and "the other" (every rank but 0), and after
the step each of the two copies in what the other broadcast, as a student does with two halves. On 2 ranks it is the
round-robin optimizer and passes the course's test; on 3, rank 2 steps rank 1's share and never takes rank 0's."""
from _fixture import *  # noqa: F401,F403

import torch
import torch.distributed as dist

from _sharded import RoundRobinSharded


class TwoHalves(RoundRobinSharded):
    def add_param_group(self, param_group):
        torch.optim.Optimizer.add_param_group(self, param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            self.owner[p] = len(self.owner) % 2
        self.add_local_group(group, [p for p in group["params"] if self.owner[p] == min(self.rank, 1)])

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = self.inner.step(closure, **kwargs)
        for p, rank in self.owner.items():
            other = p.data.clone()
            dist.broadcast(other, src=rank)
            if self.rank == 1 - rank:  # the other half of two
                p.data.copy_(other)
        return loss


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    return TwoHalves(params, optimizer_cls, **kwargs)
