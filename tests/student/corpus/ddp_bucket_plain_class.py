"""Bucketed DDP as a plain Python class (not an nn.Module): buckets filled in registration order (not reversed), MB
read as 10**6 bytes, each bucket all-reduced once the set of its members with a gradient is complete, whatever order
they arrive in; the average taken after the wait. Other attributes (parameters(), named_parameters()) come from the
model."""
from torch.distributed import broadcast
import torch
import torch.distributed as dist


class PlainBucketDDP:
    def __init__(self, module, bucket_size_mb):
        self.module = module
        for p in module.parameters():
            broadcast(p.data, src=0)
        limit = bucket_size_mb * 1e6
        self.buckets = [[]]
        for p in module.parameters():
            if not p.requires_grad:
                continue
            used = sum(q.numel() * q.element_size() for q in self.buckets[-1])
            if self.buckets[-1] and used + p.numel() * p.element_size() > limit:
                self.buckets.append([])
            self.buckets[-1].append(p)
        self.where = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._ready)
        self.arrived = [set() for _ in self.buckets]
        self.works = []

    def _ready(self, p):
        i = self.where[id(p)]
        self.arrived[i].add(id(p))
        if len(self.arrived[i]) == len(self.buckets[i]):
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
            self.works.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.module, name)

    def finish_gradient_synchronization(self):
        for i, flat, work in self.works:
            work.wait()
            flat /= dist.get_world_size()
            offset = 0
            for q in self.buckets[i]:
                q.grad.copy_(flat[offset : offset + q.numel()].view_as(q.grad))
                offset += q.numel()
        self.works = []
        self.arrived = [set() for _ in self.buckets]


def get_ddp_bucketed(module, bucket_size_mb):
    return PlainBucketDDP(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model, optimizer):
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model, optimizer):
    pass
