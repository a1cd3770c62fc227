"""Notebook 05 §3: bytes live and at the peak after init, before and after each optimizer step, per kind and rank
(memory_worker), and the tables comparing them with formulas.live_bytes and the ZeRO calculator.

    per_rank = launch(partial(run_all, [partial(memory_worker, model="xl/cpu", kinds=["unsharded", "sharded"],
                                                batch_size=8, context_length=128, steps=2)]), 2)
    mem = memory_frame(per_rank); breakdown = memory_breakdown(per_rank)   # measured vs formulas.live_bytes
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pandas as pd
import torch

from helpers import formulas as F
from helpers import launch as L
from helpers import memory as M
from helpers.experiments.common import (
    make_batches,
    rank_share,
)
from helpers.experiments.sharding_build import build, forward_backward
from helpers.formulas import MiB, zero_memory
from helpers.model import count_parameters
from helpers.sharding import _rank_world

PEAK_TOL = 0.01  # forward/backward peak vs live bytes + activations + loss gradients (live bytes: exact)


CALC_TOL = 1e-3  # measured model states vs the ZeRO calculator, relative: AdamW's 4-byte step per tensor, padding


def whole_tensor_slack(model) -> int:
    """Bytes by which ShardedOptimizer's whole-tensor shares may miss 1/N of AdamW's state: its largest-first plan
    keeps every rank within one largest tensor (8 bytes per element) of the mean, plus a 4-byte step per tensor."""
    sizes = F.meta_sizes(model)
    return 8 * max(sizes) + 4 * len(sizes)


@dataclass
class MemoryPoint:
    """Bytes at one point: live at its end, peak so far; phase_* for the phase that led there (None after init)."""

    point: str  # "after init" | "before step" | "after step"
    step: int  # 0 for "after init"
    live: int
    peak: int
    allocator_peak: int | None
    phase_start: int | None = None
    phase_peak: int | None = None

    @property
    def label(self) -> str:
        return f"{self.point} {self.step}" if self.step else self.point


@dataclass
class MemoryRun:
    """memory_worker's result for one kind on one rank: its points and what is live after the last step, by part."""

    model: str
    kind: str
    rank: int
    world: int
    batch_per_rank: int
    context_length: int
    points: list  # [MemoryPoint]
    parts: dict  # "parameters" | "gradients" | "optimizer state" -> bytes of distinct storages


def memory_worker(
    *, model, kinds, batch_size, context_length, steps=1, optimizer="adamw", impls: dict | None = None
) -> dict:
    """Per kind a MemoryRun: bytes live and peak so far after init, before and after each optimizer step
    (helpers.memory.track), and what is live after the last step by part. impls: as equivalence_worker's.
    One kind at a time: its model, gradient sync and optimizer live only inside memory_run, so they are freed
    before the next kind's build."""
    impls = impls or {}
    x, y = rank_share(make_batches(model, 1, batch_size, context_length, 0)[0])
    return {
        kind: memory_run(
            kind,
            model=model,
            x=x,
            y=y,
            context_length=context_length,
            steps=steps,
            optimizer=optimizer,
            impl=impls.get(kind),
        )
        for kind in kinds
    }


def memory_run(
    kind: str, *, model: str, x, y, context_length: int, steps: int, optimizer: str = "adamw", impl=None
) -> MemoryRun:
    """memory_worker's measurements of one kind on this rank's batch share x, y (B, T): build it, then `steps` rounds
    of forward/backward and optimizer step, each tracked with everything already live counted from the start."""
    dev, (rank, world) = L.device(), _rank_world()
    init = M.track(lambda: build(kind, model, optimizer, impl=impl), device=dev)
    net, grad_sync, opt = init.result
    init.result = None
    points = [MemoryPoint("after init", 0, init.current_bytes, init.peak_bytes, init.allocator_peak_bytes)]
    peak = init.peak_bytes

    def live():
        inner = [p.grad for g in getattr(opt, "local", opt).param_groups for p in g["params"]]
        buckets = getattr(grad_sync, "bucket_buffers", [])  # gradient storage, also while the grads are None
        return M.model_state(net, opt, x, y) + [p.grad for p in net.parameters()] + inner + buckets

    phases = (("before step", functools.partial(forward_backward, net, grad_sync, opt, x, y)), ("after step", opt.step))
    for step in range(1, steps + 1):
        for point, fn in phases:
            trace = M.track(fn, existing=live(), device=dev)
            peak = max(peak, trace.peak_bytes)
            points.append(
                MemoryPoint(
                    point,
                    step,
                    trace.current_bytes,
                    peak,
                    trace.allocator_peak_bytes,
                    trace.baseline_bytes,
                    trace.peak_bytes,
                )
            )
    params = list(net.parameters()) + list(net.buffers())
    grads = [p.grad for p in net.parameters()] + [
        p.grad for g in getattr(opt, "local", opt).param_groups for p in g["params"]
    ]
    state = M.optimizer_state(opt)
    parts = {
        k: _storage_bytes(v, exclude)
        for k, v, exclude in (
            ("parameters", params, []),
            ("gradients", grads, params),
            ("optimizer state", state, params + grads),
        )
    }
    if grad_sync is not None:
        grad_sync.close()  # hooks off the parameters: nothing outside this call holds this kind's states
    return MemoryRun(model, kind, rank, world, x.shape[0], context_length, points, parts)


def _storage_bytes(tensors, exclude=()) -> int:
    """Bytes of the distinct storages behind `tensors`, leaving out those already behind `exclude`."""
    key = lambda t: (str(t.device), t.untyped_storage().data_ptr())  # noqa: E731
    seen = {key(t) for t in exclude if torch.is_tensor(t)}
    total = 0
    for t in tensors:
        if torch.is_tensor(t) and key(t) not in seen:
            seen.add(key(t))
            total += t.untyped_storage().nbytes()
    return total


def _memory_runs(nested):
    """Every MemoryRun in launch(run_all, ...)'s nested lists and {kind: MemoryRun} dicts, in order."""
    if isinstance(nested, MemoryRun):
        yield nested
    else:
        for item in nested.values() if isinstance(nested, dict) else nested:
            yield from _memory_runs(item)


def memory_frame(per_rank) -> pd.DataFrame:
    """One row per model, kind, rank and point: live, peak so far, the phase's peak, the allocator's peak (bytes)."""
    return pd.DataFrame(
        [
            {
                "model": r.model,
                "kind": r.kind,
                "rank": r.rank,
                "point": p.point,
                "step": p.step,
                "label": p.label,
                "live_bytes": p.live,
                "peak_bytes": p.peak,
                "phase_peak_bytes": p.phase_peak if p.phase_peak is not None else p.peak,
                "allocator_peak_bytes": p.allocator_peak,
            }
            for r in _memory_runs(per_rank)
            for p in r.points
        ]
    )


def memory_table(mem: pd.DataFrame) -> pd.DataFrame:
    """MiB live and peak per model and point (rows) by kind and rank (columns)."""
    order = pd.MultiIndex.from_frame(mem[["model", "label"]].drop_duplicates())
    return (
        mem.assign(live=mem.live_bytes / MiB, peak=mem.peak_bytes / MiB)
        .pivot_table(index=["model", "label"], columns=["kind", "rank"], values=["live", "peak"], sort=False)
        .reindex(order)
    ).round(2)


def memory_breakdown(per_rank) -> pd.DataFrame:
    """Per run and point: formulas.live_bytes' parts vs the measured live bytes (tolerance 0); before each step also the
    forward/backward peak vs those parts + activations + the two (B, T, V) loss gradients (tolerance PEAK_TOL, plus
    one largest parameter's bytes where gradients already exist: "slack")."""
    rows = []
    for r in _memory_runs(per_rank):
        b, t = r.batch_per_rank, r.context_length
        acts = sum(F.activation_bytes(r.model, b, t).values()) + F.loss_grad_bytes(r.model, b, t)
        for p in r.points:
            parts = F.live_bytes(r.kind, r.model, r.world, r.rank, b, t, p.point, p.step)
            key = {"model": r.model, "kind": r.kind, "rank": r.rank}
            rows.append({**key, "point": p.label, **parts, "activations": 0, "measured": p.live, "tolerance": 0.0})
            if p.point == "before step":  # the forward/backward peak: backward's start
                # where .grad already exists, autograd forms each new gradient before adding it in: one
                # parameter-sized temporary (at most the largest) may sit on top of backward's start
                slack = 4 * max(F.meta_sizes(r.model)) if parts["gradients"] else 0
                rows.append(
                    {
                        **key,
                        "point": f"peak in fwd/bwd {p.step}",
                        **parts,
                        "activations": acts,
                        "measured": p.phase_peak,
                        "tolerance": PEAK_TOL,
                        "slack": slack,
                    }
                )
    out = pd.DataFrame(rows).fillna({"slack": 0})
    out["analytic"] = out[["parameters", "gradients", "optimizer state", "other", "activations"]].sum(axis=1)
    out["within"] = (out["measured"] - out["analytic"]).abs() <= out["tolerance"] * out["measured"] + out["slack"]
    return out


def memory_summary(mem: pd.DataFrame) -> str:
    """Per model: the worst rank's live and peak bytes after the last step, unsharded vs sharded vs Zero1, and the
    transient inside the first step() on rank 0."""
    lines, last = [], mem["step"].max()
    for name, g in mem.groupby("model", sort=False):
        m = g[g["label"] == f"after step {last}"].groupby("kind")[["live_bytes", "peak_bytes"]].max() / MiB
        u, s, z = m.loc["unsharded"], m.loc["sharded"], m.loc["zero1"]
        lines.append(
            f"{name} (Ψ = {count_parameters(name) * 4 / MiB:.1f} MiB of fp32 parameters): after the optimizer "
            f"step the worst rank holds {u.live_bytes:.1f} MiB unsharded, {s.live_bytes:.1f} MiB with "
            f"ShardedOptimizer ({_change(s.live_bytes, u.live_bytes)}) and {z.live_bytes:.1f} MiB with "
            f"Zero1Optimizer; the peak over {last} steps is {u.peak_bytes:.1f} MiB unsharded and "
            f"{s.peak_bytes:.1f} MiB with ShardedOptimizer ({_change(s.peak_bytes, u.peak_bytes)})."
        )
        first = g[(g["label"] == "after step 1") & (g["rank"] == 0)].set_index("kind")
        extra = (first["phase_peak_bytes"] - first["live_bytes"]) / MiB
        lines.append(
            "    transient inside the first step() on rank 0 (its peak minus what stays): "
            + ", ".join(f"{k} {v:.2f} MiB" for k, v in extra.items())
        )
    return "\n".join(lines)


def _change(a: float, b: float) -> str:
    """a against b in words: '25% less', '3% more' or 'the same' (to the percent shown)."""
    pct = round(100 * abs(1 - a / b))
    return "the same" if pct == 0 else f"{pct}% {'less' if a < b else 'more'}"


def calculator_table(per_rank) -> pd.DataFrame:
    """Measured model states after the last step / formulas.zero_memory (fp32): unsharded = stage 0, Zero1 and
    ShardedOptimizer = stage 1; within CALC_TOL (AdamW's 4-byte step per tensor, padding), ShardedOptimizer's state
    within whole_tensor_slack (whole-tensor shares)."""
    rows = []
    for r in _memory_runs(per_rank):
        stage = 0 if r.kind == "unsharded" else 1
        calc = zero_memory(r.model, r.world, stage, "fp32")
        got = {
            "parameters": r.parts["parameters"] - F.buffer_bytes(r.model),
            "gradients": r.parts["gradients"],
            "optimizer state": r.parts["optimizer state"],
        }
        tol = {k: CALC_TOL * calc[k] for k in got}
        if r.kind == "sharded":
            tol["optimizer state"] = whole_tensor_slack(r.model)
        rows.append(
            {
                "model": r.model,
                "kind": r.kind,
                "stage": stage,
                "rank": r.rank,
                **{f"{k} measured/calc": got[k] / calc[k] for k in got},
                "within": all(abs(got[k] - calc[k]) <= tol[k] for k in got),
            }
        )
    return pd.DataFrame(rows).set_index(["model", "kind", "rank"])
