"""Notebook 07 §2-4 in one launch (measure_worker): memory at three points (FSDP by the tracker, DDP and ZeRO-1 by
notebook 05's worker), one FSDP step's bytes and trace, and every kind (our FSDP, DDP, ZeRO-1, torch's fully_shard)
trained step by step, interleaved, from the same weights; then the tables built from what it returns."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _disable_current_modes

from helpers import formulas as F
from helpers import launch as L
from helpers import memory as M
from helpers.experiments import sharding as S
from helpers.experiments.common import make_batches, rank_share, slowest_rank
from helpers.experiments.fsdp_common import FsdpImpl, ImplSync, build, step
from helpers.experiments.fsdp_trace import Traced, traced_forward
from helpers.formulas import MiB
from helpers.fsdp import FSDP, bytes_sent, ddp_bytes_per_step, fsdp_bytes_per_step
from helpers.timing import interleaved, paired_ratio, sync

PEAK_TOL = 0.10  # forward/backward peak and live bytes right after backward vs the formulas: the tracker keys storages
# by address, and FSDP's resized-to-zero buffers let freed addresses come back, so these two points drift by a few %


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
        peaks[k] = step_peak(k, functools.partial(step, net, gs, opt, *batches[0]))
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
    activations + loss gradients + the LM head's gathered weight as backward starts (within PEAK_TOL); difference:
    measured - formula, in bytes (helpers.memory.track's: storage sizes as requested, on any device, so neither the
    CUDA allocator's 512-byte rounding nor cuBLAS's workspace, which no op returns, enters it)."""
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
            row = {"rank": run.rank, "point": p.label, "measured": p.live, "formula": live}
            rows.append(
                {**row, "difference": p.live - live, "tolerance": tol, "within": abs(p.live - live) <= tol * live}
            )
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
                        "difference": p.phase_peak - peak,
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
