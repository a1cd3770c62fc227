"""Bucketed DDP that all-reduces a bucket once every gradient in it has arrived (a count per bucket), parameters in
reverse order (the order backward produces them); the bucket's gradients are flattened into one tensor, all-reduced,
and copied back after the wait."""
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
        for p in reversed([p for p in module.parameters() if p.requires_grad]):
            nbytes = p.numel() * p.element_size()
            if current and size + nbytes > limit:
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            self.buckets.append(current)
        self.bucket_of = {}
        for i, bucket in enumerate(self.buckets):
            for p in bucket:
                self.bucket_of[p] = i
                p.register_post_accumulate_grad_hook(self.grad_ready)
        self.on_train_batch_start()

    def on_train_batch_start(self):
        self.ready = [0] * len(self.buckets)
        self.in_flight = []

    def grad_ready(self, p):
        i = self.bucket_of[p]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):
            self.all_reduce_bucket(i)

    def all_reduce_bucket(self, i):
        flat = _flatten_dense_tensors([p.grad for p in self.buckets[i]])
        flat /= dist.get_world_size()
        self.in_flight.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for i, flat, work in self.in_flight:
            work.wait()
            grads = [p.grad for p in self.buckets[i]]
            for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
                g.copy_(synced)
        self.in_flight = []


def get_ddp_bucketed(module, bucket_size_mb):
    return BucketDDP(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model, optimizer):
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model, optimizer):
    ddp_model.on_train_batch_start()
