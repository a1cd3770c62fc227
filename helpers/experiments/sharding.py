"""Notebook 05's experiments with helpers.sharding: the workers launched on N ranks (equivalence, checkpoints,
memory at each point, speed), the tables built from what they return, the ZeRO table, and
`python -m helpers bench sharding`. Workers take keyword arguments and return dataclasses; ranks return, the parent
prints. The tests call the same functions.

    model, grad_sync, opt = build("sharded", "small/cpu")          # kinds: KINDS and "torch_zero"
    per_rank = launch(partial(equivalence_worker, model="small/cpu", kinds=list(KINDS), steps=3, batch_size=8,
                              context_length=64), 2)             # per rank: {kind: KindRun}
    table = equivalence_table(per_rank)                          # same weights / same gradients, state, calls
    per_rank = launch(partial(run_all, [partial(memory_worker, model="xl/cpu", kinds=["unsharded", "sharded"],
                                                batch_size=8, context_length=128, steps=2)]), 2)
    mem = memory_frame(per_rank); breakdown = memory_breakdown(per_rank)   # measured vs formulas.live_bytes

    python -m helpers bench sharding [--model small/cpu --steps 30]   # vs torch's ZeroRedundancyOptimizer, gloo, 2 ranks
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from helpers import ddp as D
from helpers import formulas as F
from helpers import launch as L
from helpers import memory as M
from helpers.comm import count_collectives
from helpers.experiments.common import (
    bench_parser,
    cpu_state,
    make_batches,
    make_model,
    rank_share,
    slowest_rank,
    train_step,
)
from helpers.formulas import MiB, zero_memory
from helpers.model import count_parameters
from helpers.sharding import NaiveShardedOptimizer, ShardedOptimizer, Zero1Optimizer, _rank_world
from helpers.timing import Ratio, interleaved, paired_ratio, pairwise_ratios, verdict

OPTIMIZERS = {
    "adamw": (torch.optim.AdamW, dict(lr=1e-3, weight_decay=0.1)),
    "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
}
KINDS = {
    "unsharded": None,
    "sharded": ShardedOptimizer,
    "naive_sharded": NaiveShardedOptimizer,
    "zero1": Zero1Optimizer,
}
PEAK_TOL = 0.01  # forward/backward peak vs live bytes + activations + loss gradients (live bytes: exact)
CALC_TOL = 1e-3  # measured model states vs the ZeRO calculator, relative: AdamW's 4-byte step per tensor, padding


def whole_tensor_slack(model) -> int:
    """Bytes by which ShardedOptimizer's whole-tensor shares may miss 1/N of AdamW's state: its largest-first plan
    keeps every rank within one largest tensor (8 bytes per element) of the mean, plus a 4-byte step per tensor."""
    sizes = F.meta_sizes(model)
    return 8 * max(sizes) + 4 * len(sizes)


PROFILES = {  # notebook 05 per profile: the models for memory and speed, the global batch and context, timed steps
    "cpu": dict(
        memory_models=["small/cpu", "xl/cpu"],
        speed_model="xl/cpu",
        check_model="small/cpu",
        batch=8,
        context=128,
        warmup=3,
        steps=10,
        speed_launches=[["unsharded", "naive_sharded", "sharded", "zero1", "torch_zero"]],
    ),
    # XL on one GPU shared by 2 ranks: one launch per variant, so only one copy of the model states per rank at a time
    "gpu": dict(
        memory_models=["xl"],
        speed_model="xl",
        check_model="small",
        batch=4,
        context=128,
        warmup=2,
        steps=5,
        speed_launches=[["unsharded"], ["sharded"], ["zero1"], ["torch_zero"]],
    ),
}


def plan_speed_steps(
    budget, model: str, kinds, warmup: int, steps: int, batch_size: int, context_length: int, world: int = 2
) -> int:
    """Section 4's timed steps within the budget, never fewer than timing.MIN_PAIRS (a verdict needs them): each
    round trains every kind once on each rank (one thread per rank: its share of the batch, the gradients'
    all-reduce, AdamW over the parameters). Returns the steps to run; the plan (budget.plans[-1]) names the rest."""
    from helpers.timing import MIN_PAIRS

    cal = budget.calibration.per_thread() if budget.calibration else None
    psi = count_parameters(model) * 4

    def round_s():
        step = cal.step_s(F.train_flops(model, batch_size // world, context_length))
        # AdamW reads p, g, m, v and writes p, m, v: 7 tensors of psi bytes, at 10 GB/s (a planning figure)
        return len(kinds) * (step + cal.allreduce_time(psi) + 7 * psi / 10e9)

    first = f"warm-up and steps 1-{MIN_PAIRS}"
    items = [first] + [f"step {i}" for i in range(MIN_PAIRS + 1, steps + 1)]
    plan = budget.fit(
        items,
        lambda item: (warmup + MIN_PAIRS if item == first else 1) * round_s(),
        what=f"{model}'s timed",
        keep_first=True,
    )
    return MIN_PAIRS + len(plan.kept) - 1 if steps >= MIN_PAIRS else steps


# ---- what the workers return ----


@dataclass
class KindRun:
    """One kind trained by equivalence_worker on one rank."""

    kind: str
    rank: int
    weights: dict  # name -> tensor (CPU)
    state_bytes: int  # optimizer state this rank holds
    collectives: list  # per step: [(op, bytes passed), ...]
    same_grads: list = field(default_factory=list)  # per step: the averaged gradients the update read == unsharded's


@dataclass
class Checkpoint:
    """checkpoint_worker's result: the weights and, on rank 0, the consolidated state dict."""

    weights: dict
    state_dict: dict | None


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


@dataclass
class SpeedRun:
    """speed_worker's result on one rank: per kind the per-step phase seconds, the state bytes, equal final weights."""

    samples: dict  # kind -> [{"fwd_bwd", "grad_comm", "step", "step_comm"}]
    state_bytes: dict  # kind -> bytes
    same_weights: dict  # kind -> bool (vs the first kind)


# ---- building and running ----


def param_groups(model: nn.Module, groups: bool | str):
    """All parameters in one group, or two: matrices with weight decay, the rest without and at twice the lr."""
    params = list(model.parameters())
    if not groups:
        return params
    return [
        {"params": [p for p in params if p.dim() >= 2]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "lr": 2 * OPTIMIZERS["adamw"][1]["lr"]},
    ]


def build(
    kind: str,
    name: str,
    optimizer: str = "adamw",
    seed: int = 0,
    groups: bool | str = False,
    bucket_mb=25,
    impl: Callable | None = None,
):
    """(model, gradient sync or None, optimizer) for a kind in KINDS or "torch_zero", on this rank's device; with
    `impl` (called as KINDS' classes are: impl(params, optimizer_cls, **kwargs), e.g. a student's sharded optimizer)
    any kind name builds that implementation.
    groups: False (one group), True (two, see param_groups) or "late" (the second added by add_param_group).
    Every kind but zero1 averages gradients with the same DDPBucketed (same buckets, same all-reduce)."""
    model = make_model(name, seed)
    cls, kwargs = OPTIMIZERS[optimizer]
    grad_sync = D.DDPBucketed(model, bucket_mb) if _rank_world()[1] > 1 and kind != "zero1" else None
    params = param_groups(model, groups)
    late = params.pop() if groups == "late" else None
    if impl is not None:
        opt = impl(params, cls, **kwargs)
    elif kind == "torch_zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(params, cls, **kwargs)
    else:
        opt = KINDS[kind](params, cls, **kwargs) if KINDS[kind] else cls(params, **kwargs)
    if late is not None:
        opt.add_param_group(late)
    return model, grad_sync, opt


def forward_backward(model, grad_sync, opt, x, y) -> None:
    """Zero the gradients, forward, backward, average the gradients over ranks (Zero1 does that in step); the loss
    is dropped, so memory measured around this call holds no 4-byte loss."""
    train_step(model, opt, x, y, grad_sync=grad_sync, optimizer_step=False)


def optimizer_state_bytes(opt) -> int:
    """Bytes of optimizer state this rank holds (torch's ZeroRedundancyOptimizer keeps it in .optim)."""
    state = getattr(opt, "optim", opt).state
    return sum(t.numel() * t.element_size() for s in state.values() for t in s.values() if torch.is_tensor(t))


def averaged_grads(model, opt) -> dict:
    """name -> (offset, values): the averaged gradient elements this rank's update reads, as flat CPU tensors.
    DDP kinds: every element (offset 0); Zero1Optimizer (after its step): its slice of each param group's buffer."""
    if not isinstance(opt, Zero1Optimizer):
        return {
            n: (0, p.grad.detach().flatten().cpu().clone()) for n, p in model.named_parameters() if p.grad is not None
        }
    names, out = {id(p): n for n, p in model.named_parameters()}, {}
    for f in opt.flats:
        lo, hi, start = opt.rank * len(f["shard"]), (opt.rank + 1) * len(f["shard"]), 0
        for p in f["params"]:
            a, b = max(lo, start), min(hi, start + p.numel())
            if a < b:
                out[names[id(p)]] = (a - start, f["shard"].grad[a - lo : b - lo].cpu().clone())
            start += p.numel()
    return out


def _same(grads: dict, ref: dict) -> bool:
    """True when every element in `grads` equals the same element of the reference (full) gradients, bit for bit.
    A parameter the reference has no gradient for (unused, no DDP to zero-fill) counts as zeros: Zero1's buffer."""
    return all(
        torch.equal(v, ref[n][1][o : o + len(v)] if n in ref else torch.zeros_like(v)) for n, (o, v) in grads.items()
    )


def equivalence_worker(
    *, model, kinds, steps, batch_size, context_length, optimizer="adamw", groups=False, impls: dict | None = None
) -> dict:
    """Train each kind on this rank's share of the same batches: {kind: KindRun}. With "unsharded" first in
    `kinds`, the others' averaged gradients are compared with its own, step by step (KindRun.same_grads).
    impls: kind -> an implementation for build's `impl` (e.g. {"yours": a student's get_sharded_optimizer})."""
    out, ref, impls = {}, [], impls or {}
    for kind in kinds:
        net, grad_sync, opt = build(kind, model, optimizer, groups=groups, impl=impls.get(kind))
        logs, same = [], []
        for i, batch in enumerate(make_batches(model, steps, batch_size, context_length, 0)):
            with count_collectives() as log:
                forward_backward(net, grad_sync, opt, *rank_share(batch))
                grads = None if kind == "zero1" else averaged_grads(net, opt)  # before step: grads as it reads them
                opt.step()
            grads = grads or averaged_grads(net, opt)  # zero1's reduce-scatter runs inside step()
            logs.append(log)
            if kind == "unsharded":
                ref.append(grads)
            elif ref:
                same.append(_same(grads, ref[i]))
        out[kind] = KindRun(kind, _rank_world()[0], cpu_state(net), optimizer_state_bytes(opt), logs, same)
    return out


def checkpoint_worker(
    *,
    model,
    steps,
    batch_size,
    context_length,
    resume: Checkpoint | None = None,
    start=0,
    optimizer="adamw",
    groups=True,
) -> Checkpoint:
    """ShardedOptimizer training on batches start..start+steps, from `resume` if given; returns the weights and,
    from rank 0, the consolidated state dict."""
    net, grad_sync, opt = build("sharded", model, optimizer, groups=groups)
    if resume is not None:
        net.load_state_dict(resume.weights)
        opt.load_state_dict(resume.state_dict)
    for batch in make_batches(model, start + steps, batch_size, context_length, 0)[start:]:
        train_step(net, opt, *rank_share(batch), grad_sync=grad_sync)
    opt.consolidate_state_dict(to=0)
    return Checkpoint(cpu_state(net), opt.state_dict() if _rank_world()[0] == 0 else None)


def run_all(calls: list[Callable]) -> list:
    """[call() for call in calls]: several workers (functools.partial) in one launch (each launch costs seconds)."""
    return [call() for call in calls]


def memory_worker(
    *, model, kinds, batch_size, context_length, steps=1, optimizer="adamw", impls: dict | None = None
) -> dict:
    """Per kind a MemoryRun: bytes live and peak so far after init, before and after each optimizer step
    (helpers.memory.track), and what is live after the last step by part. impls: as equivalence_worker's."""
    dev, out, (rank, world), impls = L.device(), {}, _rank_world(), impls or {}
    x, y = rank_share(make_batches(model, 1, batch_size, context_length, 0)[0])
    for kind in kinds:
        init = M.track(lambda: build(kind, model, optimizer, impl=impls.get(kind)), device=dev)
        net, grad_sync, opt = init.result
        init.result = None
        points = [MemoryPoint("after init", 0, init.current_bytes, init.peak_bytes, init.allocator_peak_bytes)]
        peak = init.peak_bytes

        def live():
            inner = [p.grad for g in getattr(opt, "local", opt).param_groups for p in g["params"]]
            buckets = getattr(grad_sync, "bucket_buffers", [])  # gradient storage, also while the grads are None
            return M.model_state(net, opt, x, y) + [p.grad for p in net.parameters()] + inner + buckets

        for step in range(1, steps + 1):
            for point, fn in (
                ("before step", lambda: forward_backward(net, grad_sync, opt, x, y)),
                ("after step", opt.step),
            ):
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
        state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
        parts = {
            k: _storage_bytes(v, exclude)
            for k, v, exclude in (
                ("parameters", params, []),
                ("gradients", grads, params),
                ("optimizer state", state, params + grads),
            )
        }
        out[kind] = MemoryRun(model, kind, rank, world, x.shape[0], context_length, points, parts)
        if grad_sync is not None:
            grad_sync.close()  # hooks off the parameters: this kind's states are freed before the next kind's build
        del net, grad_sync, opt
    return out


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


def speed_worker(
    *, model, kinds, steps, warmup, batch_size, context_length, optimizer="adamw", impls: dict | None = None
) -> SpeedRun:
    """Time every kind step by step, interleaved (the order alternates), from the same weights on the same batches.
    impls: as equivalence_worker's."""
    runs = {k: build(k, model, optimizer, impl=(impls or {}).get(k)) for k in kinds}
    batches = [rank_share(b) for b in make_batches(model, 4, batch_size, context_length, 0)]

    def step(kind):
        def one(i):
            net, grad_sync, opt = runs[kind]
            times = {}
            train_step(net, opt, *batches[i % len(batches)], grad_sync=grad_sync, times=times)
            return {k: times[k] for k in ("fwd_bwd", "grad_comm", "step", "step_comm")}

        return one

    samples = interleaved({k: step(k) for k in kinds}, steps, warmup)
    first = cpu_state(runs[kinds[0]][0])
    same = {k: all(torch.equal(first[n], v) for n, v in cpu_state(r[0]).items()) for k, r in runs.items()}
    return SpeedRun(samples, {k: optimizer_state_bytes(r[2]) for k, r in runs.items()}, same)


# ---- tables (notebook 05 and tests/test_sharding.py) ----


def partition_balance(models: list[str], world: int) -> pd.DataFrame:
    """Largest per-rank share of the fp32 state relative to Ψ/N, split by tensor count vs by bytes (meta device)."""
    from helpers.sharding import partition_by_bytes, partition_by_count

    rows = []
    for name in models:
        sizes = [4 * n for n in F.meta_sizes(name)]  # fp32 bytes per tensor
        for how, owner in (
            ("by count", partition_by_count(len(sizes), world)),
            ("by bytes", partition_by_bytes(sizes, world)),
        ):
            loads = [sum(s for s, r in zip(sizes, owner) if r == k) for k in range(world)]
            rows.append({"model": name, "partition": how, "worst rank / (Ψ/N)": max(loads) / (sum(sizes) / world)})
        # largest first to the least-loaded rank: the rank that ends worst got its last tensor while it was the least
        # loaded (≤ Ψ/N), so it ends within one tensor of the mean: worst ≤ Ψ/N + largest
        rows.append(
            {"model": name, "partition": "bound, by bytes", "worst rank / (Ψ/N)": 1 + world * max(sizes) / sum(sizes)}
        )
    return pd.DataFrame(rows).pivot(index="model", columns="partition", values="worst rank / (Ψ/N)").loc[models]


def equivalence_table(per_rank: list[dict]) -> pd.DataFrame:
    """Per rank and kind: final weights and every step's averaged gradients equal to the unsharded run's (bitwise),
    the largest weight difference, state MiB, collective calls in the last step."""
    rows = []
    for rank, runs in enumerate(per_rank):
        ref = runs["unsharded"].weights
        for kind, run in runs.items():
            rows.append(
                {
                    "rank": rank,
                    "kind": kind,
                    "same_weights": all(torch.equal(run.weights[k], ref[k]) for k in ref),
                    "same_grads": all(run.same_grads) and (kind == "unsharded" or len(run.same_grads) > 0),
                    "max_abs_diff": max(float((run.weights[k] - ref[k]).abs().max()) for k in ref),
                    "state_MiB": run.state_bytes / MiB,
                    "calls_per_step": len(run.collectives[-1]),
                }
            )
    return pd.DataFrame(rows)


def collectives_table(runs: dict, model: str, world: int, n_groups: int) -> pd.DataFrame:
    """Per kind (one rank's KindRuns): bytes passed per collective in the last step, per-rank traffic / Ψ, state vs an
    exact 1/N, and whether every step's bytes equal formulas.expected_collectives exactly (Zero1: Ψ padded to a
    multiple of N elements, at most N−1 elements per param group)."""
    psi, rows = count_parameters(model) * 4, []
    for kind, run in runs.items():
        totals = [_by_op(log) for log in run.collectives]  # per step: op -> bytes
        size = psi if kind != "zero1" else totals[-1]["all_gather"]
        expected = F.expected_collectives(kind, size, world)
        wire = sum(F.wire_factor(op, world) * b for op, b in run.collectives[-1])
        ok = (
            all(t == expected for t in totals)
            and 0 <= size - psi <= 4 * (world - 1) * n_groups
            and wire == sum(F.wire_factor(op, world) * b for op, b in expected.items())
        )
        rows.append(
            {
                "kind": kind,
                "calls": len(run.collectives[-1]),
                **{f"{op} MiB": b / MiB for op, b in totals[-1].items()},
                "padding B": size - psi,
                "per-rank traffic / Ψ": wire / psi,
                "state / (Ψ_state/N)": run.state_bytes / (runs["unsharded"].state_bytes / world),
                "matches formula": ok,
            }
        )
    return pd.DataFrame(rows).set_index("kind").fillna(0)


def _by_op(log) -> dict:
    """[(op, bytes), ...] -> {op: total bytes}."""
    out = {}
    for op, nbytes in log:
        out[op] = out.get(op, 0) + nbytes
    return out


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
            f"ShardedOptimizer ({1 - s.live_bytes / u.live_bytes:.0%} less) and {z.live_bytes:.1f} MiB with "
            f"Zero1Optimizer; the peak over {last} steps falls from {u.peak_bytes:.1f} to {s.peak_bytes:.1f} "
            f"MiB ({1 - s.peak_bytes / u.peak_bytes:.0%})."
        )
        first = g[(g["label"] == "after step 1") & (g["rank"] == 0)].set_index("kind")
        extra = (first["phase_peak_bytes"] - first["live_bytes"]) / MiB
        lines.append(
            "    transient inside the first step() on rank 0 (its peak minus what stays): "
            + ", ".join(f"{k} {v:.2f} MiB" for k, v in extra.items())
        )
    return "\n".join(lines)


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


def summarize_speed(per_rank: list[SpeedRun]) -> list[dict]:
    """One row per kind: medians over steps of the slowest rank's seconds per iteration, in step(), and communicating
    in step() (each step waits for its slowest rank)."""
    rows = []
    for kind in per_rank[0].samples:
        per = lambda key: slowest_rank([[s[key] for s in r.samples[kind]] for r in per_rank])  # noqa: E731
        med = {k: float(np.median(per(k))) for k in ("fwd_bwd", "grad_comm", "step", "step_comm")}
        total = slowest_rank([[s["fwd_bwd"] + s["step"] for s in r.samples[kind]] for r in per_rank])
        rows.append(
            {
                "kind": kind,
                "iteration_s": float(np.median(total)),
                "fwd_bwd_s": med["fwd_bwd"],
                "grad_comm_s": med["grad_comm"],
                "step_s": med["step"],
                "step_comm_s": med["step_comm"],
                "steps": len(per_rank[0].samples[kind]),
            }
        )
    return rows


def speed_runs(
    launches,
    *,
    model,
    steps: int,
    warmup: int,
    batch_size: int,
    context_length: int,
    world: int,
    backend: str,
    device: str,
) -> list[list[SpeedRun]]:
    """Notebook 05's timing: one launch per group of kinds (those timed together in one interleaved loop), each rank's
    SpeedRun per launch."""
    return [
        L.launch(
            functools.partial(
                speed_worker,
                model=model,
                kinds=kinds,
                steps=steps,
                warmup=warmup,
                batch_size=batch_size,
                context_length=context_length,
            ),
            world,
            backend=backend,
            device=device,
        )
        for kinds in launches
    ]


def speed_table(per_launch: list[list[SpeedRun]]) -> pd.DataFrame:
    """summarize_speed over one or more launches, indexed by kind, with update_s = step_s - step_comm_s."""
    speed = pd.DataFrame([row for per_rank in per_launch for row in summarize_speed(per_rank)]).set_index("kind")
    speed["update_s"] = speed["step_s"] - speed["step_comm_s"]
    return speed


def ratio_rows(per_launch: list[list[SpeedRun]]) -> list[dict]:
    """Every pair of kinds timed in one launch, time per iteration paired step by step (05_sharding_ratios, which the
    answers page reads); kinds timed in separate launches are not paired."""
    by_launch = {}
    for kind, (launch, samples) in iteration_samples(per_launch).items():
        by_launch.setdefault(launch, {})[kind] = samples
    return [row for launch, samples in by_launch.items() for row in pairwise_ratios(samples, launch=launch)]


def iteration_samples(per_launch: list[list[SpeedRun]]) -> dict[str, tuple[int, np.ndarray]]:
    """kind -> (its launch's index, the slowest rank's seconds per iteration, step by step) (notebook 05)."""
    return {
        kind: (i, slowest_rank([[s["fwd_bwd"] + s["step"] for s in r.samples[kind]] for r in per_rank]))
        for i, per_rank in enumerate(per_launch)
        for kind in per_rank[0].samples
    }


def paired_iterations(per_launch, a: str, b: str) -> Ratio | None:
    """a's iteration time over b's, paired step by step (both timed interleaved in one launch), or None when they
    ran in separate launches (no pairs: the gpu profile runs one kind per launch so each has the card)."""
    samples = iteration_samples(per_launch)
    (la, sa), (lb, sb) = samples[a], samples[b]
    return paired_ratio(sa, sb) if la == lb else None


def compare_text(per_launch, a: str, b: str, names: dict) -> str:
    """verdict() for a vs b per iteration, or why there is no paired ratio."""
    r = paired_iterations(per_launch, a, b)
    if r is None:
        return (
            f"{names[a]} and {names[b]} ran in separate launches here: their medians are not paired, so no "
            "difference is claimed"
        )
    return verdict(names[a], names[b], r, "time per iteration")


SPEED_NAMES = {
    "unsharded": "unsharded",
    "sharded": "ShardedOptimizer",
    "naive_sharded": "naive sharding",
    "torch_zero": "torch ZeroRedundancyOptimizer",
    "zero1": "Zero1Optimizer",
}


def speed_summary(speed: pd.DataFrame, per_launch=None) -> str:
    """Where ShardedOptimizer's time goes vs unsharded, naive sharding, torch's ZeroRedundancyOptimizer and Zero1;
    with per_launch (speed_worker results) every "A vs B" carries its paired ratio and interval."""
    u, s = speed.loc["unsharded"], speed.loc["sharded"]
    delta = s["iteration_s"] - u["iteration_s"]
    vs = (lambda a, b: "; " + compare_text(per_launch, a, b, SPEED_NAMES)) if per_launch else (lambda a, b: "")
    lines = [
        f"ShardedOptimizer vs unsharded: {delta * 1e3:+.2f} ms per iteration between medians "
        f"({delta / u['iteration_s']:+.1%}){vs('sharded', 'unsharded')}.",
        f"ShardedOptimizer's broadcasts take {s['step_comm_s'] * 1e3:.2f} ms, its update {s['update_s'] * 1e3:.2f}"
        f" ms vs {u['update_s'] * 1e3:.2f} ms for the full unsharded update; forward+backward without the "
        f"all-reduce wait {(s['fwd_bwd_s'] - s['grad_comm_s']) * 1e3:.2f} vs "
        f"{(u['fwd_bwd_s'] - u['grad_comm_s']) * 1e3:.2f} ms (the same computation in both: any gap is noise).",
    ]
    if "naive_sharded" in speed.index:
        lines.append(
            f"one broadcast per owner instead of one per tensor: "
            f"{speed.loc['naive_sharded', 'step_comm_s'] * 1e3:.2f} → {s['step_comm_s'] * 1e3:.2f} ms"
            f"{vs('sharded', 'naive_sharded')}"
        )
    t, z = speed.loc["torch_zero"], speed.loc["zero1"]
    lines.append(
        f"ShardedOptimizer / torch ZeroRedundancyOptimizer (ratio of medians): step "
        f"{s['step_s'] / t['step_s']:.2f}, iteration {s['iteration_s'] / t['iteration_s']:.2f}"
        f"{vs('sharded', 'torch_zero')}"
    )
    lines.append(
        f"Zero1Optimizer: no all-reduce in backward; its reduce-scatter + all-gather take "
        f"{z['step_comm_s'] * 1e3:.2f} ms vs {u['grad_comm_s'] * 1e3:.2f} ms waiting for the unsharded "
        f"all-reduce (which partly overlaps backward); iteration {z['iteration_s'] * 1e3:.2f} ms "
        f"({z['iteration_s'] / u['iteration_s'] - 1:+.1%} between medians){vs('zero1', 'unsharded')}"
    )
    return "\n".join(lines)


def zero_table(model="xl", world_size: int = 8, precision: str = "mixed") -> pd.DataFrame:
    """Per-rank GB (10⁹ bytes) of model states, and sent per step (ring), for ZeRO stages 0-3 (notebook 05's table and
    calculator)."""
    names = {
        "parameters": "parameters (GB)",
        "gradients": "gradients (GB)",
        "optimizer state": "optimizer state (GB)",
        "total": "total (GB)",
        "communication": "sent per step (GB)",
    }
    rows = [
        {"stage": s, **{names[k]: v / 1e9 for k, v in zero_memory(model, world_size, s, precision).items()}}
        for s in range(4)
    ]
    return pd.DataFrame(rows).set_index("stage").round(4)


def zero_plot(model="xl", world_sizes=(1, 2, 4, 8, 16, 32, 64), precision: str = "mixed"):
    """GB (10⁹ bytes) of model states per rank vs ranks for ZeRO stages 0-3 (calculator only); returns the figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for stage in range(4):
        ax.plot(
            world_sizes,
            [zero_memory(model, n, stage, precision)["total"] / 1e9 for n in world_sizes],
            "o-",
            label=f"stage {stage}",
        )
    ax.set_xscale("log", base=2)
    ax.set(xlabel="ranks N", ylabel="GB per rank (model states; GB = 10⁹ bytes)")
    ax.set_title(f"{model}, {precision} precision + Adam, calculator (meta device; no measurement)", fontsize=9)
    ax.legend()
    return fig


def bench_main(argv: list[str]) -> int:
    """`python -m helpers bench sharding`: ShardedOptimizer vs torch's ZeroRedundancyOptimizer, gloo, 2 ranks."""
    args = bench_parser("python -m helpers bench sharding", bench_main.__doc__).parse_args(argv)
    kinds = ["unsharded", "sharded", "torch_zero"]
    worker = functools.partial(
        speed_worker,
        model=args.model,
        kinds=kinds,
        steps=args.steps,
        warmup=args.warmup,
        batch_size=args.batch_size,
        context_length=args.context_length,
    )
    per_rank = L.launch(worker, 2, backend="gloo", device=args.device)
    rows = speed_table([per_rank])
    ours, theirs = rows.loc["sharded"], rows.loc["torch_zero"]
    state = max(r.state_bytes["sharded"] / (r.state_bytes["unsharded"] / 2) for r in per_rank)
    same = all(all(r.same_weights.values()) for r in per_rank)
    print(f"{args.model}, gloo on {args.device}, 2 ranks, {args.steps} interleaved steps (median of the slowest rank):")
    for k, r in rows.iterrows():
        print(
            f"  {k:>10}: iteration {r['iteration_s'] * 1e3:.2f} ms, optimizer step {r['step_s'] * 1e3:.2f} ms "
            f"(communicating {r['step_comm_s'] * 1e3:.2f} ms)"
        )
    print(
        f"ShardedOptimizer / ZeroRedundancyOptimizer: step {ours['step_s'] / theirs['step_s']:.3f}, iteration "
        f"{ours['iteration_s'] / theirs['iteration_s']:.3f} (claimed: at most 1.05); per-rank state / "
        f"(unsharded / 2): {state:.4f} (claimed: at most 1.02); identical weights in all three: {same}"
    )
    return 0 if same else 1
