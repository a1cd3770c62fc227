"""A sharded optimizer whose param_groups are in the wrapped optimizer's own format (every default of optimizer_cls
filled in, so a scheduler can change them): the inner groups mirror them and take their hyperparameters before each
step; owners by size; one asynchronous broadcast per parameter."""
import torch
import torch.distributed as dist


class MirroredGroupsSharded(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls = optimizer_cls
        self.owner, self.loads = {}, [0] * self.world
        self.pairs = []  # (the wrapper's group, this rank's inner group)
        self.inner = None
        probe = torch.zeros(1, requires_grad=True)
        super().__init__(params, optimizer_cls([probe], **kwargs).defaults)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in sorted(group["params"], key=lambda p: -p.numel()):
            self.owner[p] = min(range(self.world), key=lambda r: (self.loads[r], r))
            self.loads[self.owner[p]] += p.numel()
        local = dict(group, params=[p for p in group["params"] if self.owner[p] == self.rank])
        if self.inner is None:
            self.inner = self.optimizer_cls([local])
        else:
            self.inner.add_param_group(local)
        self.pairs.append((group, self.inner.param_groups[-1]))

    @torch.no_grad()
    def step(self, closure=None):
        for group, local in self.pairs:
            local.update({k: v for k, v in group.items() if k != "params"})
        loss = self.inner.step(closure)
        works = [dist.broadcast(p.data, src=r, async_op=True) for p, r in self.owner.items()]
        for w in works:
            w.wait()
        return loss


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    return MirroredGroupsSharded(params, optimizer_cls, **kwargs)
