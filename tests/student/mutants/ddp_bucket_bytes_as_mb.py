"""Bucketed DDP that compares a bucket's bytes with bucket_size_mb as if both were MB: every tensor's bytes exceed
any size in MB, so each bucket holds one tensor and is all-reduced, flattened, as soon as its gradient is ready. The
gradients are right and no call is over bucket_size_mb, so the course's test passes; but it makes one call per tensor
at every size, where buckets exist for "reducing the number of total communication calls"."""
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


class BytesAsMbDDP(torch.nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module, self.limit = module, bucket_size_mb
        for p in module.parameters():
            dist.broadcast(p.data, src=0)
        self.bucket, self.size, self.works = [], 0, []
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, p):
        self.bucket.append(p)
        self.size += p.numel() * p.element_size()  # BUG: bytes, against a limit in MB
        if self.size > self.limit:
            self._send()

    def _send(self):
        flat = _flatten_dense_tensors([p.grad for p in self.bucket])
        self.works.append((list(self.bucket), flat, dist.all_reduce(flat, async_op=True)))
        self.bucket, self.size = [], 0

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        if self.bucket:
            self._send()
        for params, flat, work in self.works:
            work.wait()
            flat /= dist.get_world_size()
            for p, g in zip(params, _unflatten_dense_tensors(flat, [p.grad for p in params])):
                p.grad.copy_(g)
        self.works = []


def get_ddp_bucketed(module, bucket_size_mb):
    return BytesAsMbDDP(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model, optimizer):
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model, optimizer):
    pass
