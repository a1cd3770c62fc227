"""Bucketed DDP that closes a bucket only once it has passed bucket_size_mb (a tensor added, then the size checked):
every gradient is right, but a bucket holds up to one tensor more than the handout's "at most bucket_size_mb"."""
from _fixture import *  # noqa: F401,F403

import torch
import torch.distributed as dist


class OverflowingDDP(torch.nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, 0)
        self.buckets, current, size = [], [], 0
        for p in reversed([p for p in module.parameters() if p.requires_grad]):
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_size_mb * 1024 * 1024:  # BUG: checked after adding, so the bucket may be over
                self.buckets.append(current)
                current, size = [], 0
        if current:
            self.buckets.append(current)
        self.index = {p: i for i, b in enumerate(self.buckets) for p in b}
        for p in self.index:
            p.register_post_accumulate_grad_hook(self.ready)
        self.count, self.works = [0] * len(self.buckets), []

    def ready(self, p):
        i = self.index[p]
        self.count[i] += 1
        if self.count[i] == len(self.buckets[i]):
            flat = torch.cat([q.grad.flatten() for q in self.buckets[i]]) / dist.get_world_size()
            self.works.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for i, flat, work in self.works:
            work.wait()
            offset = 0
            for q in self.buckets[i]:
                q.grad.copy_(flat[offset : offset + q.numel()].view_as(q))
                offset += q.numel()
        self.works, self.count = [], [0] * len(self.buckets)


def get_ddp_bucketed(module, bucket_size_mb):
    return OverflowingDDP(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model, optimizer):
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model, optimizer):
    pass
