"""Data-parallel training by hand: naive, flat, overlapped per-parameter and bucketed DDP (notebook 04).

Runbook:

    ddp = DDPBucketed(model, bucket_size_mb=25)        # or NaiveDDP / FlatDDP / DDPIndividualParameters(model)
    for x, y in batches:                               # x, y: this rank's share of the global batch
        optimizer.zero_grad(set_to_none=True)
        ddp.on_train_batch_start()                     # bucketed: drop last step's gradient views
        lm_loss(ddp(x), y).backward()                  # overlapped variants start all-reduces from hooks
        ddp.finish_gradient_synchronization()          # wait (naive/flat: all-reduce here); grads = rank mean
        optimizer.step()

    python -m helpers bench ddp [--model small/8 --bucket-mb 1 --steps 30]   # DDPBucketed vs torch DDP, gloo, 2 ranks

The models, training step and multi-rank workers that notebook 04 runs with these wrappers are in helpers.ddp_runs.

Every wrapper broadcasts rank 0's parameters and buffers at construction, averages the gradients of the
parameters that require them (a tied Parameter once: named_parameters() dedupes by identity), in
named_parameters() order, and gives a parameter that got no gradient this step a zero gradient on every rank
(not None: under weight decay or momentum the optimizer then still moves it, unlike in one process; with plain SGD
the two agree). `comm_s` adds up the time spent waiting in finish_gradient_synchronization.
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers import launch as L

MB = 2**20  # bucket sizes are in binary MB, as torch's bucket_cap_mb


class _DataParallel(nn.Module):
    """What every wrapper shares: `.module`, rank-0 broadcast, the gradient list, comm timing and a timeline."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)
        self.params = [p for _, p in module.named_parameters() if p.requires_grad]  # deduped, registration order
        self.comm_s = 0.0  # seconds spent in finish_gradient_synchronization
        self.timeline: list | None = None  # set to [] to record [launch, done] perf_counter pairs per all-reduce

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def on_train_batch_start(self) -> None:
        """Nothing to prepare, except for DDPBucketed."""

    def _all_reduce(self, flat: torch.Tensor):
        """Start an async all-reduce of flat / world (the mean over ranks); return its handle."""
        flat.div_(self.world)
        launched = time.perf_counter()
        handle = dist.all_reduce(flat, async_op=True)
        if self.timeline is not None:
            span = [launched, None]
            self.timeline.append(span)
            handle.get_future().then(lambda _: span.__setitem__(1, time.perf_counter()))
        return handle

    def _grads(self) -> list[torch.Tensor]:
        """Every parameter's gradient, a zero one where backward left it None."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return [p.grad for p in self.params]


class NaiveDDP(_DataParallel):
    """The baseline: after backward, one blocking all-reduce per parameter, in order (no overlap, many calls)."""

    def finish_gradient_synchronization(self) -> None:
        start = time.perf_counter()
        for g in self._grads():
            self._all_reduce(g).wait()
        self.comm_s += time.perf_counter() - start


class FlatDDP(_DataParallel):
    """After backward, all gradients copied into one flat buffer and all-reduced once (one α, two copies)."""

    def finish_gradient_synchronization(self) -> None:
        start = time.perf_counter()
        grads = self._grads()
        flat = torch.cat([g.reshape(-1) for g in grads])  # (total numel,)
        self._all_reduce(flat).wait()
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))
        self.comm_s += time.perf_counter() - start


def plan_buckets(sizes_bytes: list[int], bucket_size_bytes: float) -> list[list[int]]:
    """Greedy buckets of parameter indices in reverse order, each <= bucket_size_bytes (a larger one sits alone)."""
    buckets, used = [], 0
    for i in reversed(range(len(sizes_bytes))):
        if not buckets or (buckets[-1] and used + sizes_bytes[i] > bucket_size_bytes):
            buckets.append([])
            used = 0
        buckets[-1].append(i)
        used += sizes_bytes[i]
    return buckets


class DDPBucketed(_DataParallel):
    """Overlap with fewer calls: each gradient is copied once into its slot of a flat bucket buffer and stays a view
    of it (the all-reduced bucket is the gradient: nothing is copied back); a bucket's async
    all-reduce starts once all its gradients are in and every earlier bucket has started, so all ranks issue the
    same calls in the same order, even when some parameter got no gradient on some rank (finish sends those)."""

    def __init__(self, module: nn.Module, bucket_size_mb: float | None = None):
        if bucket_size_mb is not None and not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb must be > 0 (or None for one bucket), got {bucket_size_mb!r}")
        super().__init__(module)
        plan = self._plan([p.numel() * p.element_size() for p in self.params], bucket_size_mb)
        self.buckets = [[self.params[i] for i in b] for b in plan]  # parameters per bucket, launch order
        self.bucket_buffers, self._where = [], {}  # flat gradient buffers, launch order; id(param) -> (bucket, view)
        for k, bucket in enumerate(self.buckets):
            if len({p.dtype for p in bucket}) > 1:
                raise ValueError("DDPBucketed needs one dtype per bucket; cast the model or use smaller buckets")
            flat = torch.zeros(sum(p.numel() for p in bucket), dtype=bucket[0].dtype, device=bucket[0].device)
            self.bucket_buffers.append(flat)
            for p, view in zip(bucket, flat.split([p.numel() for p in bucket])):
                self._where[id(p)] = (k, view.view_as(p))
                p.register_post_accumulate_grad_hook(self._hook)
        self._reset()

    @staticmethod
    def _plan(sizes_bytes: list[int], bucket_size_mb: float | None) -> list[list[int]]:
        return plan_buckets(sizes_bytes, float("inf") if bucket_size_mb is None else bucket_size_mb * MB)

    def _reset(self) -> None:
        self._ready, self._fired, self._next, self._handles = [0] * len(self.buckets), set(), 0, []

    def on_train_batch_start(self) -> None:
        """Drop the last step's gradients: each hook then copies its fresh gradient into its bucket view once (a read
        and a write), cheaper than zeroing the buckets and letting backward add into them (a write, two reads and a
        write). Zeroed views (zero_grad(set_to_none=False)) work too: backward then adds in place."""
        for p in self.params:
            p.grad = None

    def _hook(self, p: torch.Tensor) -> None:
        if id(p) in self._fired:  # its bucket may already be on the wire
            raise RuntimeError("a gradient arrived twice in one step: call finish_gradient_synchronization() "
                               "after each backward (accumulating over several backward passes is not supported)")
        k, view = self._where[id(p)]
        if p.grad.data_ptr() != view.data_ptr():  # a fresh gradient (the usual case): one copy into the bucket
            view.copy_(p.grad)
            p.grad = view
        self._fired.add(id(p))
        self._ready[k] += 1
        self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and self._ready[self._next] == len(self.buckets[self._next]):
            self._handles.append(self._all_reduce(self.bucket_buffers[self._next]))
            self._next += 1

    def finish_gradient_synchronization(self) -> None:
        start = time.perf_counter()
        for p in self.params:  # no gradient this step: a zero one, so its bucket can go
            if id(p) not in self._fired:
                k, view = self._where[id(p)]
                view.zero_()
                p.grad = view
                self._ready[k] += 1
        self._launch_ready()
        for h in self._handles:
            h.wait()
        self._reset()
        self.comm_s += time.perf_counter() - start


class DDPIndividualParameters(DDPBucketed):
    """Overlap, one call per parameter: each gradient's async all-reduce starts from its post-accumulate-grad hook
    while backward goes on. It is DDPBucketed with one parameter per bucket: launches go in reverse registration
    order (a gradient that arrives early waits for the ones before it), so ranks whose graphs differ still match."""

    def __init__(self, module: nn.Module):
        super().__init__(module, None)

    @staticmethod
    def _plan(sizes_bytes: list[int], bucket_size_mb: float | None) -> list[list[int]]:
        return [[i] for i in reversed(range(len(sizes_bytes)))]


class TorchDDP(_DataParallel):
    """torch.nn.parallel.DistributedDataParallel behind the same loop (it waits for its buckets inside backward)."""

    def __init__(self, module: nn.Module, bucket_size_mb: float = 25, find_unused_parameters: bool = False):
        super().__init__(module)
        self.ddp = nn.parallel.DistributedDataParallel(module, bucket_cap_mb=bucket_size_mb,
                                                       gradient_as_bucket_view=True,
                                                       find_unused_parameters=find_unused_parameters)

    def forward(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Already done by the time backward returns."""


VARIANTS = {"naive": NaiveDDP, "flat": FlatDDP, "per_parameter": DDPIndividualParameters,
            "bucketed": DDPBucketed, "torch_ddp": TorchDDP}


def wrap(kind: str, module: nn.Module, bucket_size_mb: float | None = None, **kwargs) -> _DataParallel:
    """VARIANTS[kind](module), with bucket_size_mb for "bucketed" and "torch_ddp"."""
    if kind in ("bucketed", "torch_ddp"):
        kwargs["bucket_size_mb"] = bucket_size_mb if bucket_size_mb is not None or kind == "bucketed" else 25
    return VARIANTS[kind](module, **kwargs)


def overlap_fraction(backward: tuple[float, float], spans: list) -> float:
    """Share of the time with an all-reduce in flight (union of [launch, done]) that falls inside backward."""
    spans = sorted((a, b) for a, b in spans if b is not None)
    merged = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    total = sum(b - a for a, b in merged)
    inside = sum(max(0.0, min(b, backward[1]) - max(a, backward[0])) for a, b in merged)
    return inside / total if total > 0 else 0.0


# ---- the bucket-size model (notebook 04 derives it) ----

def bucket_overhead(n_buckets, grad_bytes: float, backward_s: float, alpha_s: float, beta_Bps: float):
    """Modelled time from backward's end to the last all-reduce's end, with n equal buckets ready evenly in backward."""
    n = np.asarray(n_buckets, dtype=float)
    per_bucket = alpha_s + grad_bytes / (n * beta_Bps)  # one bucket's all-reduce
    return np.maximum(per_bucket, n * per_bucket - backward_s * (1 - 1 / n))


def optimal_buckets(grad_bytes: float, backward_s: float, alpha_s: float, beta_Bps: float) -> float:
    """The n minimizing bucket_overhead: max((T_b - S/beta)/alpha, sqrt(T_b/alpha)), at least 1."""
    return max(1.0, (backward_s - grad_bytes / beta_Bps) / alpha_s, math.sqrt(backward_s / alpha_s))


def bench_parser(prog: str) -> argparse.ArgumentParser:
    """The options the 2-rank training benchmarks share (bench ddp, bench sharding): model, steps, batch, device."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--model", default="small/8")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--context-length", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="cpu | cuda (gloo either way)")
    return parser


def bench_main(argv: list[str]) -> int:
    """`python -m helpers bench ddp`: DDPBucketed vs torch DDP step time (gloo, 2 ranks, CPU), same run."""
    parser = bench_parser("python -m helpers bench ddp")
    parser.add_argument("--bucket-mb", type=float, default=1.0)
    args = parser.parse_args(argv)
    from helpers.ddp_runs import _bench_with_weights, summarize_speed  # ddp_runs imports this module

    per_rank = L.launch(_bench_with_weights, 2, args.model, args.bucket_mb, args.steps, args.warmup, args.batch_size,
                        args.context_length, backend="gloo", device=args.device)
    rows = {r["variant"]: r for r in summarize_speed([p["speed"] for p in per_rank])}
    ours, theirs = rows["bucketed"]["step_s"], rows["torch_ddp"]["step_s"]
    slowest = {k: np.max([p["speed"][k]["step"] for p in per_rank], axis=0) for k in ("bucketed", "torch_ddp")}
    paired = np.quantile(slowest["bucketed"] / slowest["torch_ddp"], [0.25, 0.5, 0.75])  # step i vs step i
    same = all(p["same_weights"] for p in per_rank)
    print(f"{args.model}, bucket {args.bucket_mb:g} MB, gloo on {args.device}, 2 ranks, {args.steps} interleaved steps "
          f"(slowest rank): DDPBucketed median {ours * 1e3:.2f} ms ({rows['bucketed']['buckets']} buckets), "
          f"torch DDP {theirs * 1e3:.2f} ms, ratio of medians {ours / theirs:.3f}; median of the per-step ratios "
          f"{paired[1]:.3f} (IQR {paired[0]:.3f}-{paired[2]:.3f}; target <= 1.05); identical weights after training: {same}")
    return 0 if same else 1
