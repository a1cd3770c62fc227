"""A sharded optimizer that balances bytes: each parameter to the rank with the fewest elements so far; the inner
optimizer made once the Optimizer constructor has added every group; after the step each owner broadcasts its
parameters as one flat buffer."""
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


class SizeBalancedSharded(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.loads = [0] * self.world
        self.by_owner = {r: [] for r in range(self.world)}
        self.local_groups = []
        self.inner = None
        super().__init__(params, kwargs)
        self.inner = optimizer_cls(self.local_groups, **kwargs)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        mine = []
        for p in group["params"]:
            owner = min(range(self.world), key=lambda r: (self.loads[r], r))
            self.loads[owner] += p.numel()
            self.by_owner[owner].append(p)
            if owner == self.rank:
                mine.append(p)
        local = {k: v for k, v in group.items() if k != "params"}
        local["params"] = mine
        if self.inner is None:
            self.local_groups.append(local)
        else:
            self.inner.add_param_group(local)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = self.inner.step(closure, **kwargs)
        for owner, params in self.by_owner.items():
            if params:
                flat = _flatten_dense_tensors([p.data for p in params])
                dist.broadcast(flat, src=owner)
                for p, new in zip(params, _unflatten_dense_tensors(flat, params)):
                    p.data.copy_(new)
        return loss


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    return SizeBalancedSharded(params, optimizer_cls, **kwargs)
