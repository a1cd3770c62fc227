"""The experiments notebook 04 runs with helpers.ddp: toy and Transformer models, a training step, and the workers
launched on N ranks (equivalence with one process, speed, profiler traces). The tests and `bench ddp` use them too.

    per_rank = launch(equivalence_worker, 2, "toy", [("bucketed", "bucketed", 1.0)], 3, 8, 6)  # final state_dicts
    reference_training("toy", 3, 8, 6)                                 # what every one of them must equal
    per_rank = launch(speed_worker, 2, "small/8", variants, 10, 3, 8, 64)   # interleaved step times, traces
    summarize_speed(per_rank)                                          # one row per variant, slowest rank's medians
"""
from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from helpers import launch as L
from helpers.ddp import _DataParallel, wrap
from helpers.model import build_model, lm_loss, random_batch
from helpers.profiling import quiet_profiler
from helpers.timing import sync, time_call

BACKWARD_RANGE = "ddp: backward"  # the record_function range around loss.backward() in train_step


def cpu_state(model: nn.Module) -> dict:
    """A copy of model.state_dict() on the CPU: what workers return to the parent for comparison."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


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
    return cpu_state(model)


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
        out[label] = {"state": cpu_state(model),
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
