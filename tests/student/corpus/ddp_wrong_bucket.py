"""MUTANT: bucketed DDP that, when a bucket is complete, all-reduces the bucket numbered by how many buckets have
completed so far: it counts buckets in forward order while backward fills them from the last, so with two or more
buckets it reduces one that is not ready (its gradients are missing: zeros) and the ready one never."""
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


class BucketDDP(torch.nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, 0)
        limit = bucket_size_mb * 1024 * 1024
        self.buckets, current, size = [], [], 0
        for p in [p for p in module.parameters() if p.requires_grad]:
            nbytes = p.numel() * p.element_size()
            if current and size + nbytes > limit:
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            self.buckets.append(current)
        self.bucket_of = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        for p in self.bucket_of:
            p.register_post_accumulate_grad_hook(self.grad_ready)
        self.on_train_batch_start()

    def on_train_batch_start(self):
        self.ready = [0] * len(self.buckets)
        self.launched = []

    def grad_ready(self, p):
        i = self.bucket_of[p]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):
            j = len(self.launched)  # BUG: should be i
            grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in self.buckets[j]]
            flat = _flatten_dense_tensors(grads) / dist.get_world_size()
            self.launched.append((j, flat, dist.all_reduce(flat, async_op=True)))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for j, flat, work in self.launched:
            work.wait()
            params = [p for p in self.buckets[j] if p.grad is not None]
            for p, synced in zip(params, _unflatten_dense_tensors(flat, [p.grad for p in params])):
                p.grad.copy_(synced)


def get_ddp_bucketed(module, bucket_size_mb):
    return BucketDDP(module, bucket_size_mb)
