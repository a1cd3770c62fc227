"""A sharded optimizer as an ordinary Python class (no torch.optim.Optimizer): it keeps its own param_groups, one inner
optimizer per group for this rank's share (none where it owns nothing), its own zero_grad over every parameter; its
step averages the gradients over the ranks itself (no DDP needed) before the owners step."""
import torch
import torch.distributed as dist


class PlainSharded:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.defaults = optimizer_cls, kwargs
        self.param_groups, self.inners, self.owned = [], [], []
        self.count = 0
        params = list(params)
        for group in params if isinstance(params[0], dict) else [{"params": params}]:
            self.add_param_group(group)

    def add_param_group(self, param_group):
        group = {**self.defaults, **param_group, "params": list(param_group["params"])}
        self.param_groups.append(group)
        owners = []
        for _ in group["params"]:
            owners.append(self.count % self.world)
            self.count += 1
        self.owned.append(owners)
        mine = [p for p, r in zip(group["params"], owners) if r == self.rank]
        hyper = {k: v for k, v in group.items() if k != "params"}
        self.inners.append(self.optimizer_cls(mine, **hyper) if mine else None)

    def zero_grad(self, set_to_none=True):
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= self.world
        for inner in self.inners:
            if inner is not None:
                inner.step()
        for group, owners in zip(self.param_groups, self.owned):
            for p, r in zip(group["params"], owners):
                dist.broadcast(p.data, src=r)
        return loss


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    return PlainSharded(params, optimizer_cls, **kwargs)
