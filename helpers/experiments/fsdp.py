"""Notebook 07's experiments with helpers.fsdp and helpers.ring: workers launched on N ranks (equivalence with one
process, memory at three points, bytes and a profiler trace, speed against DDP / ZeRO-1 / torch's fully_shard, the
ring all-reduces), activation checkpointing in this process, the tables built from what they return, and
`python -m helpers bench fsdp`. Workers take keyword arguments and return dataclasses; the tests call the same code.

    per_rank = launch(partial(equivalence_worker, model="small/cpu", n_layers=2, dtypes=["fp32", "fp16"], steps=3,
                              batch_size=4, context_length=16), 2)          # per rank: {dtype: EquivalenceRun}
    table = equivalence_table(per_rank, model="small/cpu", n_layers=2)        # vs one process, with the derived bound
    per_rank = launch(partial(measure_worker, model="small/cpu", batch_size=8, context_length=64, steps=6, warmup=2), 2)
    memory_table(per_rank); bytes_table(per_rank); gather_timeliness(per_rank); speed_table(per_rank)
    ckpt = checkpoint_sweep("small/cpu", n_layers=12, batch_size=8, context_length=128, segments=[0, 1, 2, 3, 4, 6, 12])
    ring = ring_table([launch(partial(ring_worker, sizes=[2**10, 2**16], steps=5, warmup=2), n) for n in (2, 4)])

    python -m helpers bench fsdp [--model small/cpu --steps 30]   # our FSDP vs torch fully_shard, gloo, 2 ranks
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.checkpoint import checkpoint

from helpers import formulas as F
from helpers import launch as L
from helpers import memory as M
from helpers import ring as R
from helpers.experiments import sharding as S
from helpers.experiments.common import bench_parser, make_batches, rank_rows, rank_share, slowest_rank
from helpers.formulas import MiB
from helpers.fsdp import FSDP, bytes_sent, ddp_bytes_per_step, fsdp_bytes_per_step
from helpers.model import build_model, lm_loss
from helpers.profiling import label_modules, quiet_profiler
from helpers.timing import interleaved, paired_ratio, sync

PROFILES = {  # what notebook 07 runs per profile
    "cpu": dict(
        check_model="small/cpu",
        check_layers=2,
        check_batch=4,
        check_context=16,
        model="small/cpu",
        batch=8,
        context=64,
        steps=8,
        warmup=2,
        ckpt_model="small/cpu",
        ckpt_layers=12,
        ckpt_batch=4,
        ckpt_context=64,
        segments=[0, 1, 2, 3, 4, 6, 12],
        ckpt_steps=3,
        ring_worlds=[2, 4],
        ring_sizes=[2**8, 2**14, 2**18],
        ring_steps=5,
    ),
    "gpu": dict(
        check_model="small/cpu",
        check_layers=2,
        check_batch=4,
        check_context=16,
        model="small",
        batch=8,
        context=128,
        steps=10,
        warmup=3,
        ckpt_model="xl",
        ckpt_layers=None,
        ckpt_batch=4,
        ckpt_context=1024,
        segments=[0, 1, 2, 3, 4, 6, 8, 12, 16],
        ckpt_steps=5,
        ring_worlds=[2, 4],
        ring_sizes=[2**10, 2**16, 2**20, 2**23],
        ring_steps=6,
    ),
}
DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
EPS = {k: torch.finfo(v or torch.float32).eps for k, v in DTYPES.items()}
LOSS_SCALE = {"fp32": 1.0, "fp16": 2.0**10, "bf16": 1.0}  # a power of two (exact): keeps fp16 logit gradients out of
# subnormals; bf16 has fp32's range
SHARD_TYPES = (nn.Linear, nn.Embedding)
LR = 0.1
PEAK_TOL = 0.10  # forward/backward peak and live bytes right after backward vs the formulas: the tracker keys storages
# by address, and FSDP's resized-to-zero buffers let freed addresses come back, so these two points drift by a few %


def build(name: str, n_layers=None, seed: int = 0, context_length=None) -> nn.Module:
    """A TransformerLM preset (optionally fewer/more layers, shorter context), seeded, on this rank's device."""
    torch.manual_seed(seed)
    overrides = {k: v for k, v in (("n_layers", n_layers), ("context_length", context_length)) if v is not None}
    return build_model(name, **overrides).to(L.device())


# ---- 1 · correctness: one process on the whole batch, with a derived bound ----


@dataclass
class EquivalenceRun:
    """One dtype trained by equivalence_worker on one rank: per step the full weights before it and the gradients."""

    dtype: str
    world: int
    weights: list  # per step: {name: tensor}
    grads: list  # per step: {name: tensor} (all ranks' mean, gathered)
    replicated: list  # per step: [this rank's replicated gradients]
    logs: list  # per step: [(op, bytes)]
    device: str = "cpu"  # where the run computed: its one-process reference is computed there too


@dataclass(frozen=True)
class FsdpImpl:
    """An FSDP implementation as the course's adapters call it (ours by default): wrap(module, compute_dtype),
    on_after_backward(model, optimizer), gather_full_params(model) -> {name: full tensor}."""

    wrap: Callable = FSDP
    on_after_backward: Callable = lambda model, optimizer: model.finish_gradient_synchronization()  # noqa: E731
    gather_full_params: Callable = lambda model: model.gather_full_params()  # noqa: E731


class ImplSync:
    """An FsdpImpl's wrapped model behind the gradient-sync protocol `step` and train_step use."""

    def __init__(self, model, impl: FsdpImpl, optimizer=None):
        self.model, self.impl, self.optimizer = model, impl, optimizer

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def on_train_batch_start(self) -> None:
        """Nothing: the course's FSDP adapters have no such hook."""

    def finish_gradient_synchronization(self) -> None:
        self.impl.on_after_backward(self.model, self.optimizer)


def equivalence_worker(
    *, model, n_layers, dtypes, steps, batch_size, context_length, impl: FsdpImpl | None = None
) -> dict:
    """Per dtype: FSDP (or `impl`; rank-seeded: the broadcast must fix it) trains with SGD on this rank's rows of each
    batch. EquivalenceRun.weights has steps + 1 entries (the last: after the last step); grads, replicated and logs
    only where the implementation has ours' gather_full_grads, replicated and comm_log."""
    rank, out, impl = dist.get_rank(), {}, impl or FsdpImpl()
    for dtype in dtypes:
        fsdp = impl.wrap(build(model, n_layers, seed=rank), DTYPES[dtype])
        opt = torch.optim.SGD(fsdp.parameters(), lr=LR)
        run = EquivalenceRun(dtype, dist.get_world_size(), [], [], [], [], device=L.device().type)
        for batch in make_batches(model, steps, batch_size, context_length, 0):
            x, y = rank_share(batch)
            run.weights.append(impl.gather_full_params(fsdp))
            start = len(getattr(fsdp, "comm_log", []))
            opt.zero_grad(set_to_none=True)
            (lm_loss(fsdp(x), y) * LOSS_SCALE[dtype]).backward()
            impl.on_after_backward(fsdp, opt)
            for p in fsdp.parameters():
                if p.grad is not None and LOSS_SCALE[dtype] != 1:
                    p.grad.div_(LOSS_SCALE[dtype])
            if hasattr(fsdp, "gather_full_grads"):
                run.grads.append(fsdp.gather_full_grads())
                run.replicated.append([p.grad.clone() for p in fsdp.replicated])
                run.logs.append(fsdp.comm_log[start:])
            opt.step()
        run.weights.append(impl.gather_full_params(fsdp))
        out[dtype] = run
    return out


def loaded(model, n_layers, weights: dict, device: str = "cpu") -> nn.Module:
    """A fresh model `model` on `device` holding `weights` ({name: tensor}, as gather_full_params returns them)."""
    net = build(model, n_layers).to(device)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(weights[name])
    return net


def reference_grads(net: nn.Module, x, y, dtype: str) -> dict:
    """One process, whole batch, on `net` (a fresh module holding the weights to check at): fp32, or the casts FSDP's
    compute dtype makes (sharded weights and their modules' floating inputs to 16 bits; gradients back to fp32
    through the cast). A parameter that gets no gradient gets zeros, as FSDP gives it."""
    if DTYPES[dtype] is None:
        logits = net(x)
    else:
        cast = {id(p) for m in net.modules() if isinstance(m, SHARD_TYPES) for p in m.parameters(recurse=False)}
        params = {n: p.to(DTYPES[dtype]) if id(p) in cast else p for n, p in net.named_parameters()}
        for m in net.modules():
            if isinstance(m, SHARD_TYPES):
                m.register_forward_pre_hook(
                    lambda m, a: tuple(t.to(DTYPES[dtype]) if t.is_floating_point() else t for t in a)
                )
        logits = torch.func.functional_call(net, params, (x,))
    (lm_loss(logits, y) * LOSS_SCALE[dtype]).backward()
    return {
        n: p.grad / LOSS_SCALE[dtype] if p.grad is not None else torch.zeros_like(p) for n, p in net.named_parameters()
    }


def ranks_reference(load, shares: list, dtype: str) -> dict:
    """One process, each rank's (x, y) rows on their own (reference_grads on a fresh `load()` each), averaged: what
    FSDP's ranks compute before their mean. In fp16 a token's upstream gradient depends on the shapes of the batch it
    ran in (1e-5-scale differences here), which no summation bound covers, so fp16 compares to this."""
    parts = [reference_grads(load(), x, y, dtype) for x, y in shares]
    return {k: sum(p[k] for p in parts) / len(parts) for k in parts[0]}


def magnitudes(net: nn.Module, x, y) -> tuple[dict, dict]:
    """Per gradient entry, in float64: Σ|term| of the sum backward forms for it, and the number of terms. Linear
    weight: |δ|ᵀ|x| over tokens (bias: Σ|δ|); Embedding: |δ| into its row, positions summed over the batch; an
    elementwise gain (out = a·w): Σ|δ·a|. A parameter used twice (tied) adds both uses' terms."""
    net = copy.deepcopy(net).double()
    total = {id(p): torch.zeros_like(p) for p in net.parameters()}
    count, seen = {id(p): 0 for p in net.parameters()}, []

    def record(m, args, out):
        if out.requires_grad:
            out.register_hook(lambda g, m=m, a=args[0], o=out: seen.append((m, a.detach(), o.detach(), g)))

    for m in net.modules():
        if list(m.parameters(recurse=False)):
            m.register_forward_hook(record)
    lm_loss(net(x), y).backward()
    per_token = next(g for m, a, _, g in seen if isinstance(m, nn.Embedding) and a.dim() == 2)  # (B, T, C)
    for m, a, out, g in seen:
        if isinstance(m, nn.Embedding) and a.dim() == 1:  # positions (T,): every sample's token gradient adds in
            g, a = per_token.flatten(0, -2), a.repeat(per_token.shape[0])
        g = g.abs().flatten(0, -2)  # (terms, out features)
        if isinstance(m, nn.Linear):
            total[id(m.weight)] += g.T @ a.abs().flatten(0, -2)
            if m.bias is not None:
                total[id(m.bias)] += g.sum(0)
        elif isinstance(m, nn.Embedding):
            total[id(m.weight)].index_add_(0, a.flatten(), g)
        else:
            (w,) = m.parameters(recurse=False)
            total[id(w)] += (g * (out / w).abs().flatten(0, -2)).sum(0)
        for p in m.parameters(recurse=False):
            count[id(p)] += g.shape[0]
    return ({n: total[id(p)] for n, p in net.named_parameters()}, {n: count[id(p)] for n, p in net.named_parameters()})


def bound(net: nn.Module, x, y, dtype: str) -> dict:
    """|g_fsdp − g_ref| ≤ n·eps·Σ|term| per entry: both sides add the same n terms in their own order, each within
    ~n·eps/2·Σ|term| of the exact sum (Higham, §4.2); eps of the dtype the sums run in."""
    total, count = magnitudes(net, x, y)
    return {n: (count[n] * EPS[dtype] * total[n]).float() for n in total}


def equivalence_table(per_rank: list[dict], *, model, n_layers, steps, batch_size, context_length) -> pd.DataFrame:
    """Per dtype and step: the largest |g_fsdp − g_ref| and its ratio to the bound (≤ 1 passes), bitwise equal
    (expected with 1 rank only), replicated gradients identical on every rank."""
    rows = []
    batches = make_batches(model, steps, batch_size, context_length, 0)
    for dtype, run in per_rank[0].items():
        for s, (x, y) in enumerate(batches):
            # on the run's device: cuBLAS and a CPU BLAS sum in different orders, so only there can 1 rank be bitwise
            x, y = x.to(run.device), y.to(run.device)
            load = functools.partial(loaded, model, n_layers, run.weights[s], device=run.device)
            whole = _on_cpu(reference_grads(load(), x, y, dtype))
            shares = [(x[rows], y[rows]) for rows in (rank_rows(x.shape[0], r, run.world) for r in range(run.world))]
            ref = whole if dtype == "fp32" else _on_cpu(ranks_reference(load, shares, dtype))
            lim = _on_cpu(bound(load(), x, y, dtype))
            diff = {n: (run.grads[s][n] - ref[n]).abs().detach() for n in ref}
            rows.append(
                {
                    "ranks": run.world,
                    "dtype": dtype,
                    "step": s,
                    "reference": "whole batch" if dtype == "fp32" else "each rank's rows, averaged",
                    "max_abs_diff": max(float(d.max()) for d in diff.values()),
                    "whole batch max_abs_diff": max(float((run.grads[s][n] - whole[n]).abs().max()) for n in whole),
                    "max_diff/bound": max(float((d / lim[n].clamp_min(1e-30)).max().detach()) for n, d in diff.items()),
                    "bitwise": all(torch.equal(run.grads[s][n], ref[n]) for n in ref),
                    "replicated_equal": all(
                        torch.equal(a, b) for r in per_rank for a, b in zip(r[dtype].replicated[s], run.replicated[s])
                    ),
                }
            )
    return pd.DataFrame(rows)


def _on_cpu(tensors: dict) -> dict:
    """{name: tensor} moved to the CPU, where launch returns the ranks' tensors."""
    return {n: t.detach().cpu() for n, t in tensors.items()}


# ---- 2-4 · memory, bytes and trace, speed: one launch ----


class TrackedFSDP(FSDP):
    """helpers.fsdp.FSDP that reports its gathers and frees to helpers.memory.track (same behaviour otherwise)."""

    def _gather(self, module):
        with _disable_current_modes():  # its empty buffers are made and resized to 0 unseen; counted when gathered
            use = super()._gather(module)
        for flat in use.flats:
            M.note_storage_allocated(flat, "all_gather")
        return use

    def _start_gather(self, use, k):
        super()._start_gather(use, k)
        M.note_storage_allocated(use.flats[k], "all_gather")

    def _free(self, use, k):
        if use.gathered(k):
            M.note_storage_freed(use.flats[k])
        super()._free(use, k)


def build_kind(kind: str, name: str, seed: int = 0, impl: FsdpImpl | None = None):
    """(model to call, gradient sync or None, AdamW) for fsdp | ddp | zero1 | torch_fsdp, from the same weights; with
    `impl` (an FsdpImpl, e.g. a student's), that implementation under any kind name."""
    cls, kwargs = S.OPTIMIZERS["adamw"]
    if impl is not None:
        net = impl.wrap(build(name, seed=seed), None)
        opt = cls(net.parameters(), **kwargs)
        return net, ImplSync(net, impl, opt), opt
    if kind in ("ddp", "zero1"):
        return S.build("unsharded" if kind == "ddp" else "zero1", name, seed=seed)
    net = build(name, seed=seed)
    if kind == "fsdp":
        net = TrackedFSDP(net)
        return net, net, cls(net.parameters(), **kwargs)
    if kind == "torch_fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in net.blocks:
            fully_shard(block)
        fully_shard(net)
        return net, None, cls(net.parameters(), **kwargs)
    raise ValueError(f"unknown kind {kind!r}; expected fsdp, ddp, zero1 or torch_fsdp")


def step(net, grad_sync, opt, x, y, optimizer_step: bool = True) -> None:
    """One training step for any kind: zero grads, forward, backward, wait for the gradients, optimizer step."""
    opt.zero_grad()
    if hasattr(grad_sync, "on_train_batch_start"):
        grad_sync.on_train_batch_start()
    lm_loss((grad_sync or net)(x), y).backward()
    if grad_sync is not None:
        grad_sync.finish_gradient_synchronization()
    if optimizer_step:
        opt.step()


@dataclass
class FsdpMemory:
    """fsdp_memory's result on one rank: S.MemoryPoint list and the largest gathered bytes alive at once."""

    model: str
    rank: int
    world: int
    batch_per_rank: int
    context_length: int
    points: list
    peak_gathered: int


def fsdp_memory(*, model, batch_size, context_length, steps=2, impl: FsdpImpl | None = None) -> FsdpMemory:
    """Bytes live and peak after init, before and after each optimizer step of FSDP + AdamW (helpers.memory.track;
    for another `impl`, M.track_resizing, which also sees storages resized in place)."""
    dev, (rank, world) = L.device(), S._rank_world()
    x, y = rank_share(make_batches(model, 1, batch_size, context_length, 0)[0])
    track = M.track if impl is None else M.track_resizing
    init = track(lambda: _settled(build_kind("fsdp", model, impl=impl)), device=dev)
    net, sync_, opt = init.result
    init.result = None
    points, peak = [S.MemoryPoint("after init", 0, init.current_bytes, init.peak_bytes, None)], init.peak_bytes
    for i in range(1, steps + 1):
        for point, fn in (
            ("before step", lambda: step(net, sync_, opt, x, y, optimizer_step=False)),
            ("after step", opt.step),
        ):
            live = iter(M.model_state(net, opt, x, y) + [p.grad for p in net.parameters()])  # released once read:
            trace = track(fn, existing=live, device=dev)  # zero_grad's old gradients may die
            peak = max(peak, trace.peak_bytes)
            points.append(
                S.MemoryPoint(point, i, trace.current_bytes, peak, None, trace.baseline_bytes, trace.peak_bytes)
            )
    return FsdpMemory(model, rank, world, x.shape[0], context_length, points, getattr(net, "peak_gathered_bytes", None))


def _settled(result):
    """`result` after a barrier: the backend may hold the last collective's tensor (a full weight FSDP's init
    broadcast) until the next collective, which the tracker would count as live after init."""
    dist.barrier()
    return result


@dataclass
class Traced:
    """One traced FSDP step's forward on one rank (profiler µs): per sharded module call, its gathers' end, the
    previous module's forward end (when a prefetched gather should be done), its own start."""

    rows: list  # [{"module", "gather_end", "needed_at", "start"}]
    forward_us: float


def traced_forward(fsdp: FSDP, opt, x, y) -> Traced:
    """Profile one step (after a first one recorded the call order); match each forward all-gather, in issue order,
    to its module's labelled forward range: gloo's own host event against the range (host time); under NCCL the
    all-gather kernel against the kernels the range's ops launched (device time: the host runs ahead of the GPU)."""
    with label_modules(fsdp.module), quiet_profiler(L.device()) as prof:
        step(fsdp.module, fsdp, opt, x, y)
        sync(L.device())
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    names = {m: n for n, m in fsdp.module.named_modules()}
    ranges = [e for e in events if " (" in e.name and e.name.split(" (")[0] in {names[m] for m in fsdp.call_order}]
    ranges = ranges[: len(fsdp.call_order)]  # the forward calls, in call order
    spans = (
        [(r.time_range.start, r.time_range.end) for r in ranges]
        if dist.get_backend() != "nccl"
        else [kernel_span(events, r) for r in ranges]
    )
    return gather_rows(
        [names[m] for m in fsdp.call_order][: len(ranges)],
        [len(fsdp.units[m]) for m in fsdp.call_order],
        spans,
        [e.time_range.end for e in events if is_gather(e)],
    )


def is_gather(e) -> bool:
    """An all-gather's own event: gloo's host event, or NCCL's kernel on the GPU (ncclDevKernel_AllGather_...)."""
    device = e.device_type == torch.autograd.DeviceType.CUDA
    return (e.name.startswith("gloo:") and "gather" in e.name) or (
        device and "allgather" in e.name.lower() and "nccl" in e.name.lower()
    )


def kernel_span(events, r) -> tuple[float, float]:
    """(first start, last end) on the GPU of the kernels launched by the ops inside the host range `r`, NCCL's
    aside (the profiler links each kernel to its op: linked_correlation_id); r's own times when it launched none."""
    cpu = torch.autograd.DeviceType.CPU
    ops = {
        e.id
        for e in events
        if e.device_type == cpu
        and e.thread == r.thread
        and r.time_range.start <= e.time_range.start
        and e.time_range.end <= r.time_range.end
    }
    kernels = [
        e.time_range
        for e in events
        if e.device_type != cpu and e.linked_correlation_id in ops and "nccl" not in e.name.lower()
    ]
    if not kernels:
        return r.time_range.start, r.time_range.end
    return min(k.start for k in kernels), max(k.end for k in kernels)


def gather_rows(modules: list, gathers_per_call: list, spans: list, gather_ends: list) -> Traced:
    """Traced rows from each call's (start, end) on one clock and the all-gathers' ends in issue order: a call's
    gathers should end by the time the previous call ends (when its prefetch is needed)."""
    rows, g = [], 0
    for i, (name, k, (start, _)) in enumerate(zip(modules, gathers_per_call, spans)):
        ends = gather_ends[g : g + k]
        g += k
        rows.append(
            {
                "module": name,
                "gather_end": max(ends) if ends else float("nan"),
                "needed_at": spans[i - 1][1] if i else start,
                "start": start,
            }
        )
    return Traced(rows, spans[-1][1] - spans[0][0] if spans else 0.0)


def step_peak(kind: str, fn) -> float:
    """Peak bytes above the start of fn(): the CUDA allocator's on a GPU, else helpers.memory.track's; nan for
    torch's fully_shard on CPU (its DTensor storages are opaque to the tracker)."""
    dev = L.device()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        fn()
        torch.cuda.synchronize(dev)
        return float(torch.cuda.max_memory_allocated(dev) - base)
    if kind == "torch_fsdp":
        fn()
        return float("nan")
    trace = M.track(fn, device=dev)
    return float(trace.peak_bytes - trace.baseline_bytes)


@dataclass
class MeasureRun:
    """measure_worker's result on one rank."""

    memory: list  # S.MemoryRun (ddp, zero1) + FsdpMemory
    fsdp_log: list  # one step's [(op, bytes)]
    traced: Traced | None
    samples: dict  # kind -> [seconds per step]
    peaks: dict  # kind -> tracker peak bytes of one step
    same_weights: dict = field(default_factory=dict)  # kind -> final weights equal to fsdp's within 1e-4


def measure_worker(
    *,
    model,
    batch_size,
    context_length,
    steps,
    warmup,
    kinds=("fsdp", "ddp", "zero1", "torch_fsdp"),
    memory=True,
    trace=True,
    impls: dict | None = None,
) -> MeasureRun:
    """Memory (FSDP, and DDP / ZeRO-1 by notebook 05's worker), one FSDP step's bytes and trace, then every kind
    trained step by step, interleaved, from the same weights on the same batches. impls: kind -> FsdpImpl (a
    student's FSDP as one more kind, e.g. {"yours": ...})."""
    mem = []
    if memory:
        runs = S.memory_worker(
            model=model, kinds=["unsharded", "zero1"], batch_size=batch_size, context_length=context_length, steps=2
        )
        mem = list(runs.values()) + [fsdp_memory(model=model, batch_size=batch_size, context_length=context_length)]
    built = {k: build_kind(k, model, impl=(impls or {}).get(k)) for k in kinds}
    batches = [rank_share(b) for b in make_batches(model, 4, batch_size, context_length, 0)]
    peaks = {}
    for k, (net, gs, opt) in built.items():  # a first step, its peak measured
        peaks[k] = step_peak(k, lambda: step(net, gs, opt, *batches[0]))
    fsdp = built.get("fsdp", (None, None))[1]
    log, traced = [], None
    if fsdp is not None:
        start = len(fsdp.comm_log)
        step(*built["fsdp"], *batches[1])
        log = fsdp.comm_log[start:]
        traced = traced_forward(fsdp, built["fsdp"][2], *batches[2]) if trace else None

    def timed(kind):
        def one(i):
            sync(L.device())
            t0 = time.perf_counter()
            step(*built[kind], *batches[i % len(batches)])
            sync(L.device())
            return time.perf_counter() - t0

        return one

    samples = interleaved({k: timed(k) for k in kinds}, steps, warmup)
    return MeasureRun(mem, log, traced, samples, peaks)


def memory_table(per_rank: list[MeasureRun]) -> pd.DataFrame:
    """MiB live / peak per rank, kind and point (DDP = unsharded, ZeRO-1, FSDP = ZeRO-3)."""
    rows = []
    for r in per_rank:
        for run in r.memory:
            kind = {"unsharded": "ddp"}.get(getattr(run, "kind", "fsdp"), getattr(run, "kind", "fsdp"))
            for p in run.points:
                rows.append(
                    {
                        "kind": kind,
                        "rank": run.rank,
                        "point": p.label,
                        "live_MiB": p.live / MiB,
                        "peak_MiB": p.peak / MiB,
                    }
                )
    return pd.DataFrame(rows)


def fsdp_memory_check(per_rank: list[MeasureRun]) -> pd.DataFrame:
    """FSDP's measured live bytes vs formulas.fsdp_live_bytes (exact) and the step's forward/backward peak vs live +
    activations + loss gradients + the LM head's gathered weight as backward starts (within PEAK_TOL)."""
    rows = []
    for r in per_rank:
        run = r.memory[-1]
        for p in run.points:
            live = sum(
                F.fsdp_live_bytes(
                    run.model, run.world, run.batch_per_rank, run.context_length, p.point, p.step
                ).values()
            )
            tol = PEAK_TOL if p.point == "before step" else 0.0  # after init / after step: exact
            row = {"rank": run.rank, "point": p.label, "measured": p.live, "formula": live, "tolerance": tol}
            rows.append({**row, "within": abs(p.live - live) <= tol * live})
            if p.point == "before step":
                acts = sum(F.activation_bytes(run.model, run.batch_per_rank, run.context_length).values())
                peak = (
                    p.phase_start
                    + acts
                    + F.loss_grad_bytes(run.model, run.batch_per_rank, run.context_length)
                    + F.fsdp_gathered_peak_bytes(run.model, run.world, modules=1)
                )  # the LM head, regathered
                rows.append(
                    {
                        "rank": run.rank,
                        "point": f"fwd/bwd peak {p.step}",
                        "measured": p.phase_peak,
                        "formula": peak,
                        "tolerance": PEAK_TOL,
                        "within": abs(p.phase_peak - peak) <= PEAK_TOL * peak,
                    }
                )
    return pd.DataFrame(rows)


def zero_check(per_rank: list[MeasureRun]) -> pd.DataFrame:
    """Model states after the last step per kind against formulas.zero_memory (fp32): DDP stage 0, ZeRO-1 stage 1,
    FSDP stage 3 (FSDP: padding and whole norm gains; AdamW's 4-byte step per tensor)."""
    rows = []
    for r in per_rank:
        for run in r.memory:
            kind = getattr(run, "kind", "fsdp")
            stage = {"unsharded": 0, "zero1": 1, "fsdp": 3}[kind]
            calc = F.zero_memory(run.model, run.world, stage, "fp32")
            last = run.points[-1]
            other = F.token_bytes(run.batch_per_rank, run.context_length) + F.buffer_bytes(run.model)
            measured = last.live - other
            rows.append(
                {
                    "kind": {"unsharded": "ddp"}.get(kind, kind),
                    "stage": stage,
                    "rank": run.rank,
                    "measured_MiB": measured / MiB,
                    "zero_MiB": calc["total"] / MiB,
                    "measured/zero": measured / calc["total"],
                }
            )
    return pd.DataFrame(rows)


def bytes_table(per_rank: list[MeasureRun], model: str) -> pd.DataFrame:
    """One FSDP step's bytes per collective (rank 0) and per-rank bytes sent vs fsdp_bytes_per_step, with DDP's
    formula beside it."""
    world, log = len(per_rank), per_rank[0].fsdp_log
    e = F.fsdp_shard_elements(model, world)
    psi, rep = e["sharded"] * world, e["replicated"]  # padded Ψ of the sharded weights
    by_op = S._by_op(log)
    sent = bytes_sent(log, world)
    formula = fsdp_bytes_per_step(psi, world, 4, 4, rep)
    ddp = ddp_bytes_per_step(psi + rep, world)
    return pd.DataFrame(
        [
            {
                **{f"{op} MiB": b / MiB for op, b in by_op.items()},
                "sent MiB": sent / MiB,
                "formula MiB": formula / MiB,
                "equal": sent == formula,
                "DDP formula MiB": ddp / MiB,
                "FSDP / DDP": sent / ddp,
            }
        ]
    )


def gather_timeliness(per_rank: list[MeasureRun]) -> pd.DataFrame:
    """Per rank and forward module call: did its all-gather end before the previous module's forward ended
    (prefetch in time), and the stall (µs) it caused otherwise."""
    rows = []
    for rank, r in enumerate(per_rank):
        for i, row in enumerate(r.traced.rows):
            stall = max(0.0, row["gather_end"] - row["needed_at"]) if i else row["start"] - row["needed_at"]
            rows.append(
                {
                    "rank": rank,
                    "call": i,
                    "module": row["module"],
                    "prefetched": i > 0,
                    "in_time": i > 0 and row["gather_end"] <= row["needed_at"],
                    "stall_us": stall,
                }
            )
    return pd.DataFrame(rows)


def speed_table(per_rank: list[MeasureRun], baseline: str = "fsdp") -> pd.DataFrame:
    """Per kind: median and quartiles of the slowest rank's step (ms), the paired ratio to `baseline` with its 95 %
    interval, and the largest per-rank peak of a step (MiB, helpers.memory.track)."""
    kinds = list(per_rank[0].samples)
    slow = {k: slowest_rank([r.samples[k] for r in per_rank]) for k in kinds}
    rows = []
    for k in kinds:
        ratio = paired_ratio(slow[k], slow[baseline])
        p25, p50, p75 = np.percentile(slow[k], [25, 50, 75])
        rows.append(
            {
                "kind": k,
                "median_ms": p50 * 1e3,
                "p25_ms": p25 * 1e3,
                "p75_ms": p75 * 1e3,
                f"/ {baseline}": ratio.median,
                "low": ratio.low,
                "high": ratio.high,
                "measurable": ratio.differs,
                "peak_MiB": max(r.peaks[k] for r in per_rank) / MiB,
            }
        )
    return pd.DataFrame(rows).set_index("kind")


# ---- 5 · activation checkpointing (this process) ----


class CheckpointedLM(nn.Module):
    """A TransformerLM whose blocks run in segments of `segment` under torch.utils.checkpoint (0: no checkpointing):
    backward keeps only each segment's input and recomputes the segment's forward."""

    def __init__(self, lm: nn.Module, segment: int):
        super().__init__()
        if segment < 0 or segment > len(lm.blocks):
            raise ValueError(f"segment must be 0 (none) or 1..{len(lm.blocks)} blocks, got {segment}")
        self.lm, self.segment = lm, segment

    def _run(self, lo: int, hi: int, x):
        for block in self.lm.blocks[lo:hi]:
            x = block(x)  # (B, T, C)
        return x

    def forward(self, idx):
        lm, k = self.lm, self.segment
        x = lm.tok_emb(idx) + lm.pos_emb(torch.arange(idx.shape[1], device=idx.device))  # (B, T, C)
        if k == 0:
            x = self._run(0, len(lm.blocks), x)
        for lo in range(0, len(lm.blocks), k or len(lm.blocks) + 1):
            x = checkpoint(self._run, lo, lo + k, x, use_reentrant=False)
        return lm.lm_head(lm.norm_f(x))  # (B, T, V)


def checkpoint_sweep(model, *, n_layers, batch_size, context_length, segments, steps=3, warmup=1) -> pd.DataFrame:
    """Per segment size: the peak bytes of forward+backward above the parameters (helpers.memory.track) and the
    step's time, interleaved over segment sizes, with the paired ratio to no checkpointing."""
    lm = build(model, n_layers, context_length=context_length)
    x, y = make_batches(model, 1, batch_size, context_length, 0)[0]
    x, y = x.to(L.device()), y.to(L.device())
    nets = {k: CheckpointedLM(lm, k) for k in segments}

    def run(k):
        lm.zero_grad(set_to_none=True)
        lm_loss(nets[k](x), y).backward()

    peaks = {k: M.track(lambda k=k: run(k), existing=list(lm.parameters()), device=L.device()) for k in segments}
    times = interleaved({k: (lambda i, k=k: _timed(lambda: run(k))) for k in segments}, steps, warmup)
    base = segments[0]
    rows = []
    for k in segments:
        r = paired_ratio(times[k], times[base])
        rows.append(
            {
                "segment": k,
                "peak_MiB": (peaks[k].peak_bytes - peaks[k].baseline_bytes) / MiB,
                "median_ms": float(np.median(times[k])) * 1e3,
                "time / none": r.median,
                "low": r.low,
                "high": r.high,
            }
        )
    return pd.DataFrame(rows).set_index("segment")


def _timed(fn) -> float:
    sync(L.device())
    t0 = time.perf_counter()
    fn()
    sync(L.device())
    return time.perf_counter() - t0


def checkpoint_model(model, *, n_layers, batch_size, context_length, segments) -> pd.DataFrame:
    """formulas.checkpoint_memory per segment size, with I = one block input (B·T·d fp32) and A = one block's saved
    activations (formulas.activation_bytes / L), in MiB; plus the continuous and the integer optimum."""
    cfg = F.get_config(model, **({"n_layers": n_layers} if n_layers else {}))
    I = F.residual_stream_bytes(batch_size, context_length, cfg.d_model)
    A = F.activation_bytes(cfg, batch_size, context_length)["blocks"] / cfg.n_layers
    k_cont, k_best = F.best_segment(cfg.n_layers, I, A)
    rows = [{"segment": k, "model_MiB": F.checkpoint_memory(cfg.n_layers, k, I, A) / MiB} for k in segments]
    out = pd.DataFrame(rows).set_index("segment")
    out.attrs.update(k_continuous=k_cont, k_best=k_best, input_MiB=I / MiB, block_MiB=A / MiB, n_blocks=cfg.n_layers)
    return out


# ---- 6 · ring all-reduce by hand ----


@dataclass
class RingRun:
    """ring_worker's result on one rank: per size, exact agreement with dist.all_reduce and seconds per method."""

    world: int
    exact: dict  # size -> bool
    sent: dict  # size -> {method: bytes this rank sent}
    samples: dict  # size -> {method: [seconds]}
    on: str = "gloo on cpu"  # backend and device the data moved by


def ring_backend(worlds) -> tuple[str, str]:
    """(backend, device) for ring_worker at every world size in `worlds`, one choice for all so that one α–β fit
    covers them: NCCL on CUDA where every world has a GPU per rank, else gloo on the CPU. Not gloo on CUDA: gloo's
    send/recv hand the tensor's data pointer to its transport as host memory (ProcessGroupGloo::send/recv stage no
    copy), so the data stays in host memory and the table says so."""
    choices = {L.choose_backend(n) for n in worlds}
    return ("nccl", "cuda") if choices == {("nccl", "cuda")} else ("gloo", "cpu")


METHODS = {
    "dist.all_reduce": lambda t: dist.all_reduce(t),
    "ring": R.ring_all_reduce,
    "alternate ring": R.alternate_ring_all_reduce,
}


def ring_worker(*, sizes, steps, warmup) -> RingRun:
    """Per size (elements, fp32): all three all-reduces on integer-valued data (sums exact in any order) must equal
    bitwise; then timed, interleaved, each call between barriers."""
    rank, world, dev = dist.get_rank(), dist.get_world_size(), L.device()
    exact, sent, samples = {}, {}, {}
    for n in sizes:
        data = torch.randint(-1000, 1000, (n,), generator=torch.Generator().manual_seed(rank)).float().to(dev)  # (n,)
        outs = {}
        for name, fn in METHODS.items():
            t = data.clone()
            outs[name] = (fn(t), t)
        sent[n] = {k: v[0] for k, v in outs.items() if isinstance(v[0], int)}
        exact[n] = all(torch.equal(v[1], outs["dist.all_reduce"][1]) for v in outs.values())

        def timed(name, n=n):
            def one(i):
                t = data.clone()
                dist.barrier()
                t0 = time.perf_counter()
                METHODS[name](t)
                sync(dev)  # NCCL's wait() only orders the stream
                return time.perf_counter() - t0

            return one

        samples[n] = interleaved({k: timed(k) for k in METHODS}, steps, warmup)
    return RingRun(world, exact, sent, samples, on=f"{dist.get_backend()} on {dev.type}")


def ring_table(per_launch: list[list[RingRun]]) -> pd.DataFrame:
    """Per world size, message size and method: exact, bytes sent / S vs the formula, median slowest-rank µs."""
    rows = []
    for per_rank in per_launch:
        world = per_rank[0].world
        for n, by in per_rank[0].samples.items():
            S_ = 4 * n
            for method in by:
                t = float(np.median(slowest_rank([r.samples[n][method] for r in per_rank])))
                sent = [r.sent[n].get(method) for r in per_rank]
                formula = {
                    "ring": R.ring_bytes_sent(S_, world),
                    "alternate ring": R.alternate_ring_bytes_sent(S_, world),
                }.get(method)
                rows.append(
                    {
                        "N": world,
                        "on": per_rank[0].on,
                        "S_bytes": S_,
                        "method": method,
                        "exact": all(r.exact[n] for r in per_rank),
                        "sent/S": np.mean(sent) / S_ if formula else np.nan,
                        "formula/S": formula / S_ if formula else np.nan,
                        "median_us": t * 1e6,
                    }
                )
    return pd.DataFrame(rows)


def ring_fit(table: pd.DataFrame) -> dict:
    """Least-squares α (s) and W (B/s) of the standard ring's model 2(N−1)(α + S/(N W)) over its measured rows, and
    every row's modelled µs (ring and alternate ring) from the same α, W."""
    ring = table[table["method"] == "ring"]
    A = np.stack([2 * (ring["N"] - 1), 2 * (ring["N"] - 1) / ring["N"] * ring["S_bytes"]], axis=1)
    (alpha, inv_w), *_ = np.linalg.lstsq(A.astype(float), ring["median_us"].to_numpy() * 1e-6, rcond=None)
    alpha, W = max(float(alpha), 1e-9), 1 / max(float(inv_w), 1e-15)
    model = {"ring": R.ring_time, "alternate ring": R.alternate_ring_time}
    out = table.copy()
    out["model_us"] = [
        model[m](s, n, alpha, W) * 1e6 if m in model else np.nan
        for m, s, n in zip(out["method"], out["S_bytes"], out["N"])
    ]
    return {"alpha_s": alpha, "W_Bps": W, "table": out}


# ---- 7 · calculators ----


def strategies_table(
    model, world_size: int, gpu_bytes: float, batch_size: int = 4, context_length=None, precision: str = "mixed"
) -> pd.DataFrame:
    """Per strategy (DDP, ZeRO-1, ZeRO-2, FSDP = ZeRO-3): GB (10⁹ bytes) of model states + saved activations per rank,
    what is left of `gpu_bytes` and whether they fit, and the GB each rank sends per step (ring) (notebook 07's table
    and calculator)."""
    acts = sum(F.activation_bytes(model, batch_size, context_length).values()) * (0.5 if precision == "mixed" else 1)
    rows = []
    for stage, name in enumerate(["DDP", "ZeRO-1", "ZeRO-2", "FSDP (ZeRO-3)"]):
        z = F.zero_memory(model, world_size, stage, precision)
        total = z["total"] + acts
        rows.append(
            {
                "strategy": name,
                "model states (GB)": z["total"] / 1e9,
                "activations (GB)": acts / 1e9,
                "total (GB)": total / 1e9,
                "left on GPU (GB)": (gpu_bytes - total) / 1e9,
                "fits": total <= gpu_bytes,
                "sent per step (GB)": z["communication"] / 1e9,
            }
        )
    return pd.DataFrame(rows).set_index("strategy").round(4)


def ffn_table(*, tokens, d, f, n, C, W, n_tp) -> pd.DataFrame:
    """formulas.gated_ffn for DP, FSDP, TP and FSDP×TP side by side (per device)."""
    rows = [
        {"strategy": s, **F.gated_ffn(s, tokens=tokens, d=d, f=f, n=n, C=C, W=W, n_tp=n_tp)}
        for s in ("dp", "fsdp", "tp", "fsdp_tp")
    ]
    return pd.DataFrame(rows).set_index("strategy")


# ---- python -m helpers bench fsdp ----


def bench_main(argv: list[str]) -> int:
    """`python -m helpers bench fsdp`: helpers.fsdp.FSDP vs torch's fully_shard, gloo, 2 ranks, interleaved steps."""
    args = bench_parser("python -m helpers bench fsdp", bench_main.__doc__).parse_args(argv)
    worker = functools.partial(
        measure_worker,
        model=args.model,
        batch_size=args.batch_size,
        context_length=args.context_length,
        steps=args.steps,
        warmup=args.warmup,
        kinds=("fsdp", "torch_fsdp"),
        memory=False,
        trace=False,
    )
    per_rank = L.launch(worker, 2, backend="gloo", device=args.device)
    table = speed_table(per_rank, baseline="torch_fsdp")
    ours, theirs = table.loc["fsdp"], table.loc["torch_fsdp"]
    print(
        f"{args.model}, gloo on {args.device}, 2 ranks, {args.steps} interleaved steps: FSDP / fully_shard step time "
        f"{ours['/ torch_fsdp']:.3f}x (95% CI {ours['low']:.3f}-{ours['high']:.3f}; claimed: at most 1.10), "
        f"{ours['median_ms']:.1f} vs {theirs['median_ms']:.1f} ms; per-rank peak {ours['peak_MiB']:.2f} vs "
        f"{theirs['peak_MiB']:.2f} MiB (helpers.memory.track)"
    )
    return 0


# ---- 8 · the 2026 leaderboard as a plan (formulas.leaderboard_plan), with the published marks ----


def plan_table(plan: list[dict], marks=()) -> pd.DataFrame:
    """One row per strategy × checkpointing × LM head × optimizer precision: GB per GPU, fits per GPU (with the plan's
    margin), predicted step seconds per GPU, and for each mark (helpers.published, a time) the share of its speed the
    plan would reach on the B200 (notebook 07 §8)."""
    rows = []
    for r in plan:
        row = {
            "strategy": r["strategy"],
            "checkpointing": r["checkpointing"],
            "head": r["head"],
            "precision": r["precision"],
            "GB per GPU": r["memory_GB"],
            "TFLOP per step": r["flops"] / 1e12,
        }
        row.update({f"fits {g}": ok for g, ok in r["fits"].items()})
        row.update({f"step s, {g}": s for g, s in r["step_s"].items()})
        b200 = next(g for g in r["step_s"] if g.startswith("B200"))
        row.update({f"% of {m.name}": round(100 * m.share(r["step_s"][b200] * 1e3), 1) for m in marks})
        rows.append(row)
    return pd.DataFrame(rows).set_index(["strategy", "checkpointing", "head", "precision"])


def plot_plan(plan: list[dict], marks=(), gpu: str = "B200 ~180 GB", title: str = ""):
    """Predicted step time of each plan on `gpu` at the stated MFU, whiskers over the MFU band (grey: does not fit with
    the plan's margin), with the published marks as lines labelled with their source and year."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    labels = [f"{r['strategy']} · {r['checkpointing']} · {r['head']} head · {r['precision']}" for r in plan]
    colors = ["#4a7" if r["fits"][gpu] else "#ccc" for r in plan]
    steps = [r["step_s"][gpu] for r in plan]
    band = [sorted(r["step_band_s"][gpu].values()) for r in plan]  # fastest (highest MFU) to slowest
    ax.bar(
        range(len(plan)),
        steps,
        color=colors,
        edgecolor="#555",
        yerr=[[s - b[0] for s, b in zip(steps, band)], [b[-1] - s for s, b in zip(steps, band)]],
        error_kw=dict(elinewidth=0.6, capsize=0),
    )  # whiskers: the band over formulas.PLAN_MFUS
    for m, style in zip(marks, ("--", ":", "-.")):
        ax.axhline(m.value / 1e3, color="#c33", linestyle=style, label=m.label)
    ax.set_xticks(range(len(plan)), labels, fontsize=5, rotation=90)
    ax.set(ylabel="predicted step (s)", title=title or f"2026 leaderboard plans on 2× {gpu} (grey: does not fit)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
