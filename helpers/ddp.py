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

Every wrapper broadcasts rank 0's parameters and buffers at construction, averages the gradients of the
parameters that require them (a tied Parameter once: named_parameters() dedupes by identity), in
named_parameters() order, and gives a parameter that got no gradient this step a zero gradient on every rank
(not None: under weight decay or momentum the optimizer then still moves it, unlike in one process; with plain SGD
the two agree). `comm_s` adds up the time spent waiting in finish_gradient_synchronization.
"""
from __future__ import annotations

import argparse
import copy
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from helpers import launch as L
from helpers.model import build_model, lm_loss, random_batch
from helpers.profiling import quiet_profiler
from helpers.timing import sync, time_call

MB = 2**20  # bucket sizes are in binary MB, as torch's bucket_cap_mb
BACKWARD_RANGE = "ddp: backward"  # the record_function range around loss.backward() in train_step


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


# ---- models and training shared by the notebook, the tests and the benchmark ----

class ToyModel(nn.Module):
    """ids (B, T) -> logits (B, T, vocab): tied embedding/head, a frozen Linear, an unused Parameter, a buffer."""

    def __init__(self, vocab: int = 32, d: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.fc = nn.Linear(d, d)
        self.frozen = nn.Linear(d, d, bias=False).requires_grad_(False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied: one Parameter in two modules
        self.unused = nn.Parameter(torch.randn(d))  # never in forward: gets no gradient
        self.register_buffer("scale", torch.rand(d))  # differs per rank until broadcast

    def forward(self, ids):
        h = torch.tanh(self.fc(self.emb(ids))) * self.scale  # (B, T, d)
        return self.head(self.frozen(h))  # (B, T, vocab)


def make_model(name: str, seed: int) -> nn.Module:
    """"toy" (ToyModel) or a helpers.model size, built on this rank's device with torch seeded by `seed`."""
    torch.manual_seed(seed)
    model = ToyModel() if name == "toy" else build_model(name)
    return model.to(L.device())


def make_batches(name: str, steps: int, batch_size: int, context_length: int, seed: int):
    """`steps` global (inputs, targets) batches, the same on every rank."""
    gen = torch.Generator().manual_seed(seed + 1)
    vocab = 32 if name == "toy" else None
    out = []
    for _ in range(steps):
        if vocab:
            tokens = torch.randint(vocab, (batch_size, context_length + 1), generator=gen)  # (B, T+1)
            out.append((tokens[:, :-1], tokens[:, 1:]))
        else:
            out.append(random_batch(name, batch_size, context_length, generator=gen))
    return out


def make_optimizer(params, name: str):
    return torch.optim.SGD(params, lr=0.1) if name == "sgd" else torch.optim.AdamW(params, lr=1e-3)


def train_step(ddp, optimizer, x, y, times: dict | None = None) -> float:
    """One data-parallel step on this rank's batch; `times` gets the backward's start and end (perf_counter)."""
    optimizer.zero_grad(set_to_none=True)
    ddp.on_train_batch_start()
    loss = lm_loss(ddp(x), y)
    b0 = time.perf_counter()
    with record_function(BACKWARD_RANGE):  # what traced_steps finds in the profile
        loss.backward()
    b1 = time.perf_counter()
    ddp.finish_gradient_synchronization()
    optimizer.step()
    if times is not None:
        times.update(backward=(b0, b1))
    return loss.item()


def reference_training(name, steps, batch_size, context_length, seed=0, optimizer="sgd") -> dict:
    """Single-process training on the full batches: the state_dict every data-parallel run must reproduce."""
    model = make_model(name, seed)
    opt = make_optimizer(model.parameters(), optimizer)
    for x, y in make_batches(name, steps, batch_size, context_length, seed):
        opt.zero_grad(set_to_none=True)
        lm_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def equivalence_worker(name, variants, steps, batch_size, context_length, seed=0, optimizer="sgd") -> dict:
    """Train each (label, kind, bucket_size_mb) on this rank's half batch from a rank-seeded model; return the
    final state_dicts (which must equal reference_training's) and each wrapper's bucket count."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for label, kind, mb in variants:
        model = make_model(name, seed + rank)  # differs per rank: the broadcast must fix it
        ddp = wrap(kind, model, mb, **({"find_unused_parameters": True} if kind == "torch_ddp" and name == "toy" else {}))
        opt = make_optimizer(ddp.parameters(), optimizer)
        for x, y in make_batches(name, steps, batch_size, context_length, seed):
            share = slice(rank * batch_size // world, (rank + 1) * batch_size // world)
            train_step(ddp, opt, x[share].to(L.device()), y[share].to(L.device()))
        out[label] = {"state": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                      "buckets": len(getattr(ddp, "buckets", [])) or None}
    return out


def uneven_worker(kinds) -> dict:
    """Rank 1 skips a layer that rank 0 uses: each kind's synced gradients vs the mean of both ranks' own (max diff)."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1)).to(L.device())
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank)).to(L.device())  # (4, 8) per rank
    forward = (lambda m: m[2](m[1](m[0](x)))) if rank == 0 else (lambda m: m[2](m[0](x)))
    forward(base).pow(2).mean().backward()
    own = [p.grad if p.grad is not None else torch.zeros_like(p) for p in base.parameters()]
    mean = [torch.stack(_gather(g)).mean(0) for g in own]
    out = {}
    for kind, mb in kinds:
        ddp = wrap(kind, copy.deepcopy(base), mb)
        ddp.on_train_batch_start()
        ddp.module.zero_grad(set_to_none=True)  # after it, on purpose: the hooks must copy into the buckets
        forward(ddp.module).pow(2).mean().backward()
        ddp.finish_gradient_synchronization()
        out[f"{kind} {mb}"] = max(float((p.grad - m).abs().max()) for p, m in zip(ddp.module.parameters(), mean))
    return out


def _gather(t: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return parts


def traced_steps(ddp, optimizer, batches, trace_path=None) -> list[dict]:
    """Train one step per (x, y) under torch.profiler. Per step: the backward interval (its record_function range)
    and each all-reduce's execution interval as gloo's worker threads record it ("gloo:all_reduce"), in µs of the
    host clock. `trace_path`: also save the rank's Chrome trace (open it in Perfetto or chrome://tracing)."""
    dev = L.device()
    with quiet_profiler(dev) as prof:
        for x, y in batches:
            train_step(ddp, optimizer, x, y)
        sync(dev)
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
    events = prof.events()
    backward = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == BACKWARD_RANGE)
    comm = sorted((e.time_range.start, e.time_range.end) for e in events if e.name.startswith("gloo:all_reduce"))
    ends = [b0 for b0, _ in backward[1:]] + [float("inf")]
    return [{"backward": (b0, b1), "comm": [[a, b] for a, b in comm if b0 <= a < end]}
            for (b0, b1), end in zip(backward, ends)]


def speed_worker(name, variants, steps, warmup, batch_size, context_length, seed=0, timeline_steps=3,
                 traced=2, trace_dir=None) -> dict:
    """Time one step of every (label, kind, bucket_size_mb), interleaved step by step so drift hits all alike.

    kind None = this rank's compute alone (no wrapper, no communication). Returns per label: step samples (s), comm
    samples (s in finish), backward durations, for the last `timeline_steps` steps the backward interval and every
    all-reduce's [launch, done] times, and under "traced" `traced` more steps profiled (traced_steps; not timed),
    whose Chrome traces go to trace_dir/<label>.rank<r>.json when trace_dir is given.
    """
    rank, world, dev = dist.get_rank(), dist.get_world_size(), L.device()
    if trace_dir is not None:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
    base = make_model(name, seed)
    runs = {}
    for label, kind, mb in variants:
        model = copy.deepcopy(base)
        ddp = wrap(kind, model, mb) if kind else _Local(model)
        runs[label] = dict(ddp=ddp, opt=make_optimizer(ddp.parameters(), "sgd"), step=[], comm=[], backward=[],
                           timeline=[], buckets=len(getattr(ddp, "buckets", [])) or None)
    batches = make_batches(name, 4, batch_size, context_length, seed)
    share = slice(rank * batch_size // world, (rank + 1) * batch_size // world)
    for i in range(warmup + steps):
        x, y = (t[share].to(dev) for t in batches[i % len(batches)])
        for label, r in runs.items():
            ddp, record = r["ddp"], i >= warmup + steps - timeline_steps
            ddp.timeline = [] if record else None
            comm0, times = ddp.comm_s, {}
            _, seconds = time_call(lambda: train_step(ddp, r["opt"], x, y, times), dev)
            if i >= warmup:
                r["step"].append(seconds)
                r["comm"].append(ddp.comm_s - comm0)
                r["backward"].append(times["backward"][1] - times["backward"][0])
            if record:
                r["timeline"].append({"backward": times["backward"], "comm": [list(s) for s in ddp.timeline]})
    for label, r in runs.items():  # after the timed steps: the profiler's overhead stays out of the samples
        if isinstance(r["ddp"], _Local) or not traced:
            continue
        path = None if trace_dir is None else Path(trace_dir) / f"{label.replace(' ', '_')}.rank{rank}.json"
        xy = [tuple(t[share].to(dev) for t in batches[i % len(batches)]) for i in range(traced)]
        r["traced"] = traced_steps(r["ddp"], r["opt"], xy, path)
    return {label: {k: v for k, v in r.items() if k not in ("ddp", "opt")} for label, r in runs.items()}


class _Local(_DataParallel):
    """No data parallelism: this rank's compute alone (the speed baseline); no broadcast, no all-reduce."""

    def __init__(self, module):
        nn.Module.__init__(self)
        self.module, self.params, self.comm_s, self.timeline = module, [], 0.0, None

    def finish_gradient_synchronization(self) -> None:
        pass


def summarize_speed(per_rank: list[dict]) -> list[dict]:
    """One row per label: the slowest rank's median step, comm and backward times."""
    rows = []
    for label, first in per_rank[0].items():
        med = {k: max(statistics.median(r[label][k]) for r in per_rank) for k in ("step", "comm", "backward")}
        rows.append({"variant": label, "step_s": med["step"], "comm_s": med["comm"], "backward_s": med["backward"],
                     "buckets": first["buckets"], "steps": len(first["step"])})
    return rows


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


def _bench_with_weights(name, bucket_mb, steps, warmup, batch_size, context_length) -> dict:
    """bench_worker, plus whether both wrappers ended with the same weights (same start, same data, same means)."""
    rank, world, dev = dist.get_rank(), dist.get_world_size(), L.device()
    base = make_model(name, 0)
    models = {k: copy.deepcopy(base) for k in ("bucketed", "torch_ddp")}
    ddps = {k: wrap(k, m, bucket_mb) for k, m in models.items()}
    opts = {k: make_optimizer(d.parameters(), "sgd") for k, d in ddps.items()}
    samples = {k: [] for k in ddps}
    batches = make_batches(name, 4, batch_size, context_length, 0)
    share = slice(rank * batch_size // world, (rank + 1) * batch_size // world)
    for i in range(warmup + steps):
        x, y = (t[share].to(dev) for t in batches[i % len(batches)])
        order = list(ddps) if i % 2 == 0 else list(ddps)[::-1]  # alternate who goes first
        for k in order:
            _, seconds = time_call(lambda: train_step(ddps[k], opts[k], x, y), dev)
            if i >= warmup:
                samples[k].append(seconds)
    same = all(torch.equal(a, b) for a, b in zip(models["bucketed"].parameters(), models["torch_ddp"].parameters()))
    speed = {k: {"step": s, "comm": [0.0], "backward": [0.0], "buckets": len(getattr(ddps[k], "buckets", [])) or None}
             for k, s in samples.items()}
    return {"speed": speed, "same_weights": same}
