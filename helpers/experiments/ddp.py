"""Notebook 04's experiments with helpers.ddp: the workers launched on N ranks (equivalence with one process, speed,
profiler traces), the tables and plots built from what they return, and `python -m helpers bench ddp`. The tests
call the same functions.

    checks = check_equivalence("toy", toy_variants(), backend="gloo", device="cpu")   # one row per variant
    raw, speed = speed_table(["small/cpu"], sweep_model="small/cpu", buckets_mb=[1, 25], steps=10, warmup=3,
                             batch_size=8, context_length=64, backend="gloo", device="cpu")
    overlap = overlap_table(raw["small/cpu"], ["naive", "per_parameter"], traced=True)
    sweep, fit = bucket_sweep(speed, "small/cpu", alpha_s=1e-4, beta_Bps=1e9)   # measured vs modelled step time

    python -m helpers bench ddp [--model small/cpu --bucket-mb 1 --steps 30]   # DDPBucketed vs torch DDP, gloo, 2 ranks
"""

from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers import formulas
from helpers import launch as L
from helpers.ddp import MB, _DataParallel, plan_buckets, wrap
from helpers.experiments.common import (
    BACKWARD_RANGE,
    TiedToyModel,
    bench_parser,
    cpu_state,
    make_batches,
    make_model,
    quartiles,
    rank_share,
    slowest_rank,
    train_step,
)
from helpers.model import count_parameters, lm_loss
from helpers.profiling import quiet_profiler
from helpers.results import save_results
from helpers.timing import WaitClock, interleaved, paired_ratio, pairwise_ratios, sync, time_call, verdict

EPS32 = torch.finfo(torch.float32).eps  # 2**-23; unit roundoff u = EPS32 / 2
EQUIVALENCE = {  # what §1 and tests/test_ddp.py train: global batches of batch_size x context_length tokens
    "toy": dict(steps=3, batch_size=8, context_length=6, optimizer="sgd"),
    "small/cpu": dict(steps=2, batch_size=4, context_length=16, optimizer="adamw"),
}
PROFILES = {  # notebook 04 per profile: speed-table models, the sweep's model, batch (global) and context, steps
    "cpu": dict(
        sizes=["small/cpu", "medium/cpu", "large/cpu"],
        sweep_model="large/cpu",
        batch=8,
        context=32,
        warmup=3,
        steps=10,
        extra_buckets_mb=[0.03125, 0.0625, 0.125, 0.25, 0.5],
    ),
    "gpu": dict(
        sizes=["small", "medium"], sweep_model="medium", batch=8, context=128, warmup=3, steps=10, extra_buckets_mb=[]
    ),
}


def plan_speed(
    budget,
    sizes,
    sweep_model: str,
    extra_buckets_mb,
    seed_buckets_mb,
    warmup: int,
    steps: int,
    batch_size: int,
    context_length: int,
    world: int = 2,
) -> tuple[int, list]:
    """Notebook 04's speed runs within the budget: the speed table and the seed's sweep at timing.MIN_PAIRS steps
    (always), then the sweep's extra bucket sizes below the seed's grid (largest first), then more timed steps. A
    variant's step on a rank (one thread each): its share of the batch forward+backward and an all-reduce of the
    gradients. Returns (steps, extra bucket sizes kept); the plans (budget.plans[-2:]) name what was left out."""
    from helpers.timing import MIN_PAIRS

    cal = budget.calibration.per_thread() if budget.calibration else None
    base_steps = min(steps, MIN_PAIRS)

    def variant_step(model):
        return cal.step_s(formulas.train_flops(model, batch_size // world, context_length)) + cal.allreduce_time(
            count_parameters(model) * 4
        )

    variants = {
        m: len(SPEED_VARIANTS) + (len(sweep_variants(seed_buckets_mb)) if m == sweep_model else 0) for m in sizes
    }
    round_s = lambda extra: sum(n * variant_step(m) for m, n in variants.items()) + extra * variant_step(sweep_model)
    base = f"the speed table at {base_steps} steps"
    sweep = budget.fit(
        [base] + sorted(extra_buckets_mb, reverse=True),
        lambda item: (warmup + base_steps) * (round_s(0) if item == base else variant_step(sweep_model)),
        what=f"{sweep_model}'s bucket sweep at (MB)",
        keep_first=True,
    )
    extra = sorted(sweep.kept[1:])
    sweep.dropped = [mb for mb in sweep.dropped if mb != base]
    more = budget.fit(
        [f"step {i}" for i in range(base_steps + 1, steps + 1)],
        lambda item: round_s(len(extra)),
        what="the speed table's timed",
    )
    return base_steps + len(more.kept), extra


def make_optimizer(params, name: str):
    """SGD (lr 0.1) or AdamW (lr 1e-3): what the equivalence and speed runs train with."""
    return torch.optim.SGD(params, lr=0.1) if name == "sgd" else torch.optim.AdamW(params, lr=1e-3)


def reference_training(name, steps, batch_size, context_length, seed=0, optimizer="sgd") -> dict:
    """Single-process training on the full batches: its final state_dict (the preconditions test uses it)."""
    model = make_model(name, seed)
    opt = make_optimizer(model.parameters(), optimizer)
    for x, y in make_batches(name, steps, batch_size, context_length, seed):
        train_step(model, opt, x.to(L.device()), y.to(L.device()))
    return cpu_state(model)


def bucket_mb_for(n_buckets: int) -> float:
    """A bucket size (MB) that makes plan_buckets cut the toy model's gradients into exactly n_buckets."""
    sizes = [p.numel() * p.element_size() for p in TiedToyModel().parameters() if p.requires_grad]
    for limit in sorted(set(sizes) | {sum(sizes[-k:]) for k in range(1, len(sizes) + 1)}):
        if len(plan_buckets(sizes, limit)) == n_buckets:
            return limit / MB
    raise ValueError(f"no bucket size gives {n_buckets} buckets for sizes {sizes}")


def toy_variants() -> list[tuple]:
    """(label, kind, bucket_size_mb) for the toy model: every wrapper, bucketed with 1, 2, 3 and unbounded buckets."""
    return (
        [(k, k, None) for k in ("naive", "flat", "per_parameter")]
        + [(f"bucketed x{n}", "bucketed", bucket_mb_for(n)) for n in (1, 2, 3)]
        + [("bucketed unbounded", "bucketed", None), ("torch_ddp", "torch_ddp", None)]
    )


def transformer_variants() -> list[tuple]:
    """(label, kind, bucket_size_mb) for small/cpu: every hand-written wrapper, bucketed at 0.05 MB and unbounded."""
    return [(k, k, None) for k in ("naive", "flat", "per_parameter")] + [
        ("bucketed 0.05 MB", "bucketed", 0.05),
        ("bucketed unbounded", "bucketed", None),
    ]


# ---- §1 correctness: the synced gradient vs one process's full-batch gradient, with a float32 bound ----


@dataclass
class GradientCheck:
    """One step on one rank: the synced gradient vs the single-process full-batch gradient at the same weights."""

    step: int
    max_abs_diff: float  # max over elements of |g_ddp - g_ref|
    max_ratio: float  # max over elements of |g_ddp - g_ref| / bound (passes at <= 1)
    worst: str  # the parameter holding max_ratio
    where: str = ""  # the worst element: "name[index]: got ..., one process ..., bound ..."
    summed_ratio: float = float(
        "nan"
    )  # max |g_ddp - N g_ref| / (N bound): <= 1 when gradients were summed, not averaged
    finite: bool = True  # every synced gradient element finite


@dataclass
class EquivalenceRun:
    """One variant trained on one rank: what check_equivalence compares."""

    label: str
    buckets: int | None
    start_equal: bool  # after the broadcast, bitwise the single-process start
    steps: list[GradientCheck]
    weight_ratio: float | None  # SGD: after step 1, max |w_ddp - w_ref| / its bound; None for AdamW
    state: dict[str, torch.Tensor] = field(repr=False)  # final weights (every rank must hold the same bits)


def _abs_terms(model: nn.Module, x, y) -> dict[int, torch.Tensor]:
    """Full-batch backward of a float64 `model`; per parameter (by id), Σ over tokens of |term| of the token sum each
    gradient element is (Linear: |dy|^T|x|, Embedding: |dy| per row, RMSNorm gain: |dy * x_hat|)."""
    acc = {id(p): torch.zeros_like(p) for p in model.parameters()}

    def forward_hook(mod, inputs, out):
        inp = inputs[0]

        def backward_hook(dy):  # dy: (..., out_features)
            dy, d = dy.abs(), dy.shape[-1]
            if isinstance(mod, nn.Linear):
                acc[id(mod.weight)] += dy.reshape(-1, d).T @ inp.abs().reshape(-1, inp.shape[-1])  # (out, in)
                if mod.bias is not None:
                    acc[id(mod.bias)] += dy.reshape(-1, d).sum(0)
            elif isinstance(mod, nn.Embedding):
                acc[id(mod.weight)].index_add_(0, inp.reshape(-1), dy.reshape(-1, d))  # (vocab, d)
            else:  # an RMSNorm gain: y = weight * x / rms(x)
                x_hat = inp * torch.rsqrt(inp.pow(2).mean(-1, keepdim=True) + mod.eps)
                acc[id(mod.weight)] += (dy * x_hat.abs()).reshape(-1, d).sum(0)

        if out.requires_grad:
            out.register_hook(backward_hook)

    hooked = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding)) or hasattr(m, "eps")]
    handles = [m.register_forward_hook(forward_hook) for m in hooked if getattr(m, "weight", None) is not None]
    lm_loss(model(x), y).backward()
    for h in handles:
        h.remove()
    return acc


def reference_gradients(model: nn.Module, x, y) -> tuple[dict, dict]:
    """One process, full batch, at `model`'s weights: the float32 gradients (left in .grad) and, per element, the
    float64 magnitude of the terms they sum (max of the token-level and the sequence-level Σ|term|)."""
    model.zero_grad(set_to_none=True)
    lm_loss(model(x), y).backward()
    grads = {
        n: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        for n, p in model.named_parameters()
        if p.requires_grad
    }
    m64 = copy.deepcopy(model).double()
    tokens = {n: _abs_terms(m64, x, y)[id(p)] for n, p in m64.named_parameters() if p.requires_grad}
    seq = {n: torch.zeros_like(t) for n, t in tokens.items()}
    for b in range(x.shape[0]):  # sequences do not interact: the full gradient is Σ_b (loss_b / B)'s gradients
        m64.zero_grad(set_to_none=True)
        (lm_loss(m64(x[b : b + 1]), y[b : b + 1]) / x.shape[0]).backward()
        for n, p in m64.named_parameters():
            if n in seq and p.grad is not None:
                seq[n] += p.grad.abs()
    return grads, {n: torch.maximum(tokens[n], seq[n]).float() for n in grads}


def gradient_bound(scale: torch.Tensor, n_terms: int) -> torch.Tensor:
    """How far two float32 evaluations of one gradient tensor may differ, from Σ|term| (`scale`) and the n_terms terms
    each element sums. A float32 sum of n terms is within γ_n·Σ|term| ≈ n·u·Σ|term| of the exact sum (Higham, Accuracy
    and Stability, §4.2); two evaluations plus the all-reduce's addition: 2(n+1)·u; twice that for the terms' own
    rounding: 2(n+1)·EPS32. The terms come from layers whose rounding mixes elements, so the bound is normwise (the
    tensor's largest Σ|term|), as for backward-stable matrix products; elementwise it fails (float32 vs float64)."""
    return 2 * (n_terms + 1) * EPS32 * scale.max() if scale.numel() else scale.new_zeros(())


def _ratio(diff: torch.Tensor, bound: torch.Tensor) -> float:
    """max(diff / bound), where bound 0 demands diff 0 (inf otherwise)."""
    r = torch.where(bound > 0, diff / bound.clamp_min(torch.finfo(bound.dtype).tiny), diff * float("inf"))
    return float(torch.nan_to_num(r, nan=0.0).max()) if r.numel() else 0.0


def worst_element(got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, name: str) -> str:
    """'name[index]: got g, one process r (|diff| d, bound b)' for the element of `got` farthest from `ref`."""
    diff = torch.nan_to_num((got - ref).abs(), nan=float("inf"))
    if not diff.numel():
        return f"{name}: empty"
    index = tuple(int(i) for i in np.unravel_index(int(diff.argmax()), tuple(got.shape)))
    return (
        f"{name}[{', '.join(map(str, index))}]: got {float(got[index]):.6g}, one process {float(ref[index]):.6g} "
        f"(|diff| {float(diff[index]):.3g}, bound {float(bound):.3g})"
    )


def gradient_checks(name: str, ddp, optimizer, batches, seed: int = 0, optimizer_name: str = "sgd") -> dict:
    """Train `ddp` (rank_share of every global batch); before each step, the single-process reference at its current
    weights. Returns EquivalenceRun's start_equal, steps, weight_ratio and state."""
    net, dev = ddp.module, L.device()
    start = make_model(name, seed).state_dict()
    start_equal = all(torch.equal(v, start[k]) for k, v in net.state_dict().items())
    steps, weight_ratio = [], None
    for i, batch in enumerate(batches):
        ref = make_model(name, seed)
        ref.load_state_dict(net.state_dict())  # the same weights, no hooks
        x, y = (t.to(dev) for t in batch)
        g_ref, scale = reference_gradients(ref, x, y)
        train_step(net, optimizer, *rank_share(batch), grad_sync=ddp)
        synced = {n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in net.named_parameters() if n in g_ref}
        bounds = {n: gradient_bound(scale[n], x.numel()) for n in synced}
        checks = [
            (_ratio((g - g_ref[n]).abs(), bounds[n]), float((g - g_ref[n]).abs().max()), n) for n, g in synced.items()
        ]
        worst = max(checks)
        world = dist.get_world_size() if dist.is_initialized() else 1
        steps.append(
            GradientCheck(
                step=i,
                max_abs_diff=max(c[1] for c in checks),
                max_ratio=worst[0],
                worst=worst[2],
                where=worst_element(synced[worst[2]], g_ref[worst[2]], bounds[worst[2]], worst[2]),
                summed_ratio=max(_ratio((g - world * g_ref[n]).abs(), world * bounds[n]) for n, g in synced.items()),
                finite=all(bool(torch.isfinite(g).all()) for g in synced.values()),
            )
        )
        if i == 0 and optimizer_name == "sgd":  # one SGD step: w - lr·g; bound lr·(gradient bound) + 2 roundings each
            lr = optimizer.param_groups[0]["lr"]
            w0 = {n: p.detach() - lr * g_ref[n] for n, p in ref.named_parameters() if n in g_ref}  # the reference step
            weight_ratio = max(
                _ratio(
                    (p.detach() - w0[n]).abs(),
                    lr * gradient_bound(scale[n], x.numel()) + 2 * EPS32 * (w0[n].abs() + lr * g_ref[n].abs()),
                )  # Δ(lr·g), 2 roundings each
                for n, p in net.named_parameters()
                if n in g_ref
            )
    return dict(start_equal=start_equal, steps=steps, weight_ratio=weight_ratio, state=cpu_state(net))


def equivalence_worker(
    *, model: str, variants, steps: int, batch_size: int, context_length: int, seed: int = 0, optimizer: str = "sgd"
) -> list[EquivalenceRun]:
    """Per (label, kind, bucket_size_mb): wrap a rank-seeded model (the broadcast must fix it), train on this rank's
    half of every batch, check each step's synced gradient against one process (gradient_checks)."""
    rank, out = dist.get_rank(), []
    for label, kind, mb in variants:
        net = make_model(model, seed + rank)
        ddp = wrap(
            kind, net, mb, **({"find_unused_parameters": True} if kind == "torch_ddp" and model == "toy" else {})
        )
        opt = make_optimizer(ddp.parameters(), optimizer)
        batches = make_batches(model, steps, batch_size, context_length, seed)
        out.append(
            EquivalenceRun(
                label=label,
                buckets=len(getattr(ddp, "buckets", [])) or None,
                **gradient_checks(model, ddp, opt, batches, seed, optimizer),
            )
        )
        ddp.close()
    return out


def equivalence_rows(name: str, per_rank: list[list[EquivalenceRun]]) -> pd.DataFrame:
    """One row per variant, worst over ranks and steps: bucket count, start/rank agreement, gradient and weight checks."""
    rows = []
    for runs in zip(*per_rank):  # the same variant on every rank
        first, steps = runs[0], [s for r in runs for s in r.steps]
        worst = max(steps, key=lambda s: s.max_ratio)
        ratios = [r.weight_ratio for r in runs if r.weight_ratio is not None]
        rows.append(
            {
                "model": name,
                "variant": first.label,
                "buckets": first.buckets,
                "start_equal": all(r.start_equal for r in runs),
                "ranks_equal": all(torch.equal(v, r.state[k]) for r in runs for k, v in first.state.items()),
                "max_abs_diff": max(s.max_abs_diff for s in steps),
                "grad_ratio": worst.max_ratio,
                "worst_param": worst.worst,
                "weight_ratio": max(ratios) if ratios else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def check_equivalence(
    name: str, variants, *, backend: str = "gloo", device: str = "cpu", world: int = 2, **config
) -> pd.DataFrame:
    """Launch equivalence_worker for model `name` (EQUIVALENCE[name], overridable) and tabulate (equivalence_rows).
    Passes when start_equal and ranks_equal hold and grad_ratio, weight_ratio are <= 1 (assert_equivalent)."""
    config = {**EQUIVALENCE[name], **config}
    worker = functools.partial(equivalence_worker, model=name, variants=variants, **config)
    return equivalence_rows(name, L.launch(worker, world, backend=backend, device=device))


def assert_equivalent(checks: pd.DataFrame) -> None:
    """Every row: same start as one process, same final bits on every rank, gradients (and SGD weights) in bound."""
    bad = checks[
        ~checks["start_equal"] | ~checks["ranks_equal"] | ~(checks["grad_ratio"] <= 1) | (checks["weight_ratio"] > 1)
    ]
    assert bad.empty, f"not equivalent to one process:\n{bad.to_string()}"


# ---- §2 speed ----


@dataclass
class StepIntervals:
    """One step on one rank: the backward's (start, end) and each all-reduce's [start, end] (None: not done)."""

    backward: tuple[float, float]
    comm: list[list]


@dataclass
class SpeedRun:
    """One variant's timed steps on one rank (seconds), with the last steps' intervals and the profiled steps."""

    step: list[float]
    comm: list[float]  # in finish_gradient_synchronization
    backward: list[float]
    timeline: list[StepIntervals]  # perf_counter seconds, launch -> done
    buckets: int | None
    traced: list[StepIntervals] | None = None  # profiler µs (gloo's own all-reduce events)


SPEED_VARIANTS = [
    ("local", None, None),
    ("naive", "naive", None),
    ("flat", "flat", None),
    ("per_parameter", "per_parameter", None),
    ("bucketed 25 MB", "bucketed", 25),
    ("torch_ddp 25 MB", "torch_ddp", 25),
]


def sweep_variants(buckets_mb) -> list[tuple]:
    """The bucket-size sweep: DDPBucketed at every size, and torch DDP at its default 25 MB."""
    return [(f"bucketed {mb:g} MB", "bucketed", mb) for mb in buckets_mb] + [("torch_ddp 25 MB", "torch_ddp", 25)]


def traced_steps(ddp, optimizer, batches, trace_path=None) -> list[StepIntervals]:
    """Train one step per (x, y) under torch.profiler. Per step: the backward interval (its record_function range)
    and each all-reduce's execution interval as gloo's worker threads record it ("gloo:all_reduce"), in µs of the
    host clock. `trace_path`: also save the rank's Chrome trace (open it in Perfetto or chrome://tracing)."""
    with quiet_profiler(L.device()) as prof:
        for x, y in batches:
            train_step(ddp.module, optimizer, x, y, grad_sync=ddp)
        sync(L.device())
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
    events = prof.events()
    backward = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == BACKWARD_RANGE)
    comm = sorted((e.time_range.start, e.time_range.end) for e in events if e.name.startswith("gloo:all_reduce"))
    ends = [b0 for b0, _ in backward[1:]] + [float("inf")]
    return [
        StepIntervals((b0, b1), [[a, b] for a, b in comm if b0 <= a < end]) for (b0, b1), end in zip(backward, ends)
    ]


def step_intervals(times: dict, spans: list) -> StepIntervals:
    """One step's backward interval and all-reduce spans in seconds on one clock: perf_counter where the spans are
    host times (gloo); CUDA events where they are events (NCCL: train_step's backward events, seconds from its
    start), since the host returns from backward() long before the GPU ends it."""
    if not any(hasattr(x, "elapsed_time") for span in spans for x in span):
        return StepIntervals(times["backward"], [list(s) for s in spans])
    b0, b1 = times["backward_events"]
    return StepIntervals(
        (0.0, b0.elapsed_time(b1) / 1e3), [[b0.elapsed_time(a) / 1e3, b0.elapsed_time(b) / 1e3] for a, b in spans]
    )


class _Local(_DataParallel):
    """No data parallelism: this rank's compute alone (the speed baseline); no broadcast, no all-reduce."""

    def __init__(self, module):
        nn.Module.__init__(self)
        self.module, self.params, self.clock, self.timeline = module, [], WaitClock(), None

    def finish_gradient_synchronization(self) -> None:
        pass


def speed_worker(
    *,
    model: str,
    variants,
    steps: int,
    warmup: int,
    batch_size: int,
    context_length: int,
    seed: int = 0,
    timeline_steps: int = 3,
    traced: int = 2,
    trace_dir=None,
) -> dict[str, SpeedRun]:
    """Time one step of every (label, kind, bucket_size_mb), interleaved step by step so drift hits all alike (kind
    None: compute alone). After the timed steps, `traced` profiled ones per wrapper (traces to trace_dir if given)."""
    rank, dev = dist.get_rank(), L.device()
    base = make_model(model, seed)
    batches = [rank_share(b) for b in make_batches(model, 4, batch_size, context_length, seed)]
    ddps = {
        label: wrap(kind, copy.deepcopy(base), mb) if kind else _Local(copy.deepcopy(base))
        for label, kind, mb in variants
    }
    opts = {label: make_optimizer(d.parameters(), "sgd") for label, d in ddps.items()}
    timelines = {label: [] for label in ddps}

    def step(label, i):
        ddp, record = ddps[label], i >= warmup + steps - timeline_steps
        ddp.timeline, comm0, times = ([] if record else None), ddp.comm_s, {}
        _, seconds = time_call(
            lambda: train_step(ddp.module, opts[label], *batches[i % len(batches)], grad_sync=ddp, times=times), dev
        )
        if record:
            timelines[label].append(step_intervals(times, ddp.timeline))
        return seconds, ddp.comm_s - comm0, times["backward"][1] - times["backward"][0]

    samples = interleaved({label: functools.partial(step, label) for label in ddps}, steps, warmup)
    if trace_dir is not None:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
    out = {}
    for label, ddp in ddps.items():
        s = np.asarray(samples[label])  # (steps, 3): step, comm, backward
        out[label] = SpeedRun(
            step=list(s[:, 0]),
            comm=list(s[:, 1]),
            backward=list(s[:, 2]),
            timeline=timelines[label],
            buckets=len(getattr(ddp, "buckets", [])) or None,
        )
        if traced and not isinstance(ddp, _Local):  # after the timed steps: profiler overhead stays out
            path = None if trace_dir is None else Path(trace_dir) / f"{label.replace(' ', '_')}.rank{rank}.json"
            out[label].traced = traced_steps(ddp, opts[label], [batches[i % len(batches)] for i in range(traced)], path)
    return out


def summarize_speed(per_rank: list[dict[str, SpeedRun]]) -> list[dict]:
    """One row per label: medians over steps of the slowest rank's step, comm and backward times (each step waits
    for its slowest rank), and the step time's quartiles."""
    rows = []
    for label, first in per_rank[0].items():
        med = {
            k: float(np.median(slowest_rank([getattr(r[label], k) for r in per_rank])))
            for k in ("step", "comm", "backward")
        }
        p25, _, p75 = quartiles(slowest_rank([r[label].step for r in per_rank]))
        rows.append(
            {
                "variant": label,
                "step_s": med["step"],
                "step_p25_s": p25,
                "step_p75_s": p75,
                "comm_s": med["comm"],
                "backward_s": med["backward"],
                "buckets": first.buckets,
                "steps": len(first.step),
            }
        )
    return rows


def speed_table(
    sizes,
    *,
    sweep_model: str,
    buckets_mb,
    steps: int,
    warmup: int,
    batch_size: int,
    context_length: int,
    backend: str,
    device: str,
    trace_dir=None,
) -> tuple[dict, pd.DataFrame]:
    """One speed_worker launch per model size (the sweep model also runs the bucket sweep and 2 profiled steps):
    the per-rank SpeedRuns by model, and one row per (model, variant); torch DDP's comm is not observable (NaN)."""
    from tqdm.auto import tqdm

    raw, rows = {}, []
    for name in tqdm(sizes, desc="launches (one per model size)"):
        variants = SPEED_VARIANTS + (
            [v for v in sweep_variants(buckets_mb) if v not in SPEED_VARIANTS] if name == sweep_model else []
        )
        worker = functools.partial(
            speed_worker,
            model=name,
            variants=variants,
            steps=steps,
            warmup=warmup,
            batch_size=batch_size,
            context_length=context_length,
            traced=2 if name == sweep_model else 0,
            trace_dir=None if trace_dir is None else str(Path(trace_dir) / name.replace("/", "_")),
        )
        raw[name] = L.launch(worker, 2, backend=backend, device=device)
        rows += [{"model": name, "grad_MB": count_parameters(name) * 4 / MB, **r} for r in summarize_speed(raw[name])]
    speed = pd.DataFrame(rows)
    speed.loc[speed["variant"].str.startswith("torch_ddp"), "comm_s"] = np.nan
    return raw, speed


# ---- §3 overlap ----


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


def shown_variants(speed: pd.DataFrame, model: str) -> list[str]:
    """The variants §3 shows: naive, per-parameter, the largest swept bucket size that still gives >1 bucket, 25 MB."""
    s = speed[(speed["model"] == model) & speed["variant"].str.match(r"bucketed [\d.]+ MB")].copy()
    s["mb"] = [float(v.split()[1]) for v in s["variant"]]
    several = s[s["buckets"] > 1].sort_values("mb")["variant"].tolist()
    return ["naive", "per_parameter"] + several[-1:] + ["bucketed 25 MB", "torch_ddp 25 MB"]


def overlap_table(per_rank: list[dict[str, SpeedRun]], shown, *, traced: bool) -> pd.DataFrame:
    """Per variant, mean/min/max overlap_fraction over ranks and recorded steps, from the profiler trace (when
    `traced`: gloo) and from launch -> done (not for torch DDP, whose launches happen inside torch)."""
    rows = []
    for label in shown:
        row = {"variant": label, "buckets": per_rank[0][label].buckets}
        for name, source in (("trace", "traced"), ("launch→done", "timeline")):
            if (source == "traced" and not traced) or (source == "timeline" and label.startswith("torch_ddp")):
                continue
            f = [overlap_fraction(t.backward, t.comm) for r in per_rank for t in getattr(r[label], source)]
            row.update({f"{name} overlap": float(np.mean(f)), f"{name} min": min(f), f"{name} max": max(f)})
        rows.append(row)
    return pd.DataFrame(rows).set_index("variant")


def plot_timelines(run: dict[str, SpeedRun], shown, *, traced: bool, title: str):
    """One row per variant: the last recorded step's backward bar and its all-reduces, in ms since backward began."""
    source, to_ms = ("traced", 1e-3) if traced else ("timeline", 1e3)  # profiler µs, or perf_counter seconds
    fig, axes = plt.subplots(len(shown), 1, figsize=(8, 1.0 + 0.7 * len(shown)), sharex=True)
    for ax, label in zip(axes, shown):
        t = getattr(run[label], source)[-1]
        t0 = t.backward[0]
        ax.barh(1, (t.backward[1] - t0) * to_ms, left=0, color="tab:blue", label="backward")
        for a, b in t.comm:
            if b is not None:
                ax.barh(0, (b - a) * to_ms, left=(a - t0) * to_ms, color="tab:orange", alpha=0.5, edgecolor="k", lw=0.3)
        ax.set_yticks([0, 1], ["all-reduce", "backward"])
        ax.set_title(label, fontsize=9, loc="left")
    axes[-1].set_xlabel(f"ms since backward started (rank 0, last {'profiled' if traced else 'timed'} step)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


# ---- §4 bucket-size model vs sweep ----


@dataclass
class BucketModel:
    """formulas.bucket_overhead's inputs for one model, and its optimum."""

    grad_bytes: float  # S, from count_parameters
    tensor_bytes: list[int]  # every gradient tensor's bytes, from the model itself
    planned: list[int]  # plan_buckets' bucket count at each swept size
    backward_s: float  # T_b: backward with no communication (local)
    local_step_s: float
    alpha_s: float
    beta_Bps: float
    n_star: float

    def overhead(self, n_buckets):
        """formulas.bucket_overhead with these S, T_b, α, β."""
        return formulas.bucket_overhead(n_buckets, self.grad_bytes, self.backward_s, self.alpha_s, self.beta_Bps)


def bucket_sweep(
    speed: pd.DataFrame, model: str, *, alpha_s: float, beta_Bps: float
) -> tuple[pd.DataFrame, BucketModel]:
    """The swept DDPBucketed rows of `model` (bucket_MB, buckets, measured and predicted step_s) and the fitted model."""
    s = speed[speed["model"] == model]
    sweep = s[s["variant"].str.match(r"bucketed [\d.]+ MB")].copy()
    sweep["bucket_MB"] = [float(v.split()[1]) for v in sweep["variant"]]
    sweep = sweep.sort_values("bucket_MB").reset_index(drop=True)
    local = s[s["variant"] == "local"].iloc[0]
    sizes = [p.numel() * 4 for p in make_model(model, 0).parameters() if p.requires_grad]  # float32 gradients
    S = count_parameters(model) * 4
    fit = BucketModel(
        S,
        sizes,
        [len(plan_buckets(sizes, mb * MB)) for mb in sweep["bucket_MB"]],
        local["backward_s"],
        local["step_s"],
        alpha_s,
        beta_Bps,
        formulas.optimal_buckets(S, local["backward_s"], alpha_s, beta_Bps),
    )
    sweep["predicted_s"] = fit.local_step_s + fit.overhead(sweep["buckets"])
    return sweep, fit


def sweep_display(sweep: pd.DataFrame, caption: str):
    """The sweep in ms: bucket size, bucket count, measured step and comm, modelled step."""
    ms = sweep[["bucket_MB", "buckets"]].assign(
        step_ms=sweep.step_s * 1e3, comm_ms=sweep.comm_s * 1e3, predicted_ms=sweep.predicted_s * 1e3
    )
    return ms.style.format(precision=2).hide(axis="index").set_caption(caption)


def plot_bucket_sweep(sweep: pd.DataFrame, fit: BucketModel, buckets_mb, *, title: str):
    """Modelled step time over bucket size (equal buckets, at most one per tensor), the built counts, the measured."""
    mb_curve = np.geomspace(min(buckets_mb) / 2, max(buckets_mb), 400)
    n_curve = np.clip(np.ceil(fit.grad_bytes / (mb_curve * MB)), 1, len(fit.tensor_bytes))
    b_star_mb = fit.grad_bytes / fit.n_star / MB
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(mb_curve, (fit.local_step_s + fit.overhead(n_curve)) * 1e3, label="model: compute-only step + o(n)")
    ax.plot(
        sweep["bucket_MB"], sweep["predicted_s"] * 1e3, "x", color="tab:blue", label="model at the built bucket count"
    )
    ax.plot(sweep["bucket_MB"], sweep["step_s"] * 1e3, "o", color="tab:orange", label="measured DDPBucketed")
    ax.axvline(b_star_mb, ls="--", color="gray", label=f"model optimum b* = {b_star_mb:.2g} MB")
    ax.axhline(fit.local_step_s * 1e3, ls=":", color="k", label="compute only (local)")
    ax.set_xscale("log")
    ax.set(xlabel="bucket_size_mb", ylabel="ms per step", ylim=(0, None))
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return fig


# ---- python -m helpers bench ddp ----


@dataclass
class BenchRun:
    """One rank's bench: step samples per wrapper, DDPBucketed's bucket count, whether both ended with the same weights."""

    step: dict[str, list]
    buckets: int
    same_weights: bool


def bench_worker(
    *,
    model: str,
    bucket_mb: float,
    steps: int,
    warmup: int,
    batch_size: int,
    context_length: int,
    wrappers: dict | None = None,
) -> BenchRun:
    """DDPBucketed and torch DDP (or `wrappers`: label -> f(module) giving a gradient sync with .module, e.g. a
    student's DDP) from the same weights on the same data, interleaved (same start, data and means: the same weights
    at the end)."""
    base = make_model(model, 0)
    wrappers = wrappers or {k: functools.partial(wrap, k, bucket_size_mb=bucket_mb) for k in ("bucketed", "torch_ddp")}
    ddps = {k: make(copy.deepcopy(base)) for k, make in wrappers.items()}
    opts = {k: make_optimizer(d.parameters(), "sgd") for k, d in ddps.items()}
    for k, d in ddps.items():  # a wrapper whose hooks take the optimizer (a student's, as the course calls them)
        getattr(d, "bind_optimizer", lambda _: None)(opts[k])
    batches = [rank_share(b) for b in make_batches(model, 4, batch_size, context_length, 0)]
    step = {
        k: (
            lambda i, k=k: time_call(
                lambda: train_step(ddps[k].module, opts[k], *batches[i % len(batches)], grad_sync=ddps[k]), L.device()
            )[1]
        )
        for k in ddps
    }
    samples = interleaved(step, steps, warmup)
    first = next(iter(ddps.values())).module
    same = all(torch.equal(a, b) for d in ddps.values() for a, b in zip(first.parameters(), d.module.parameters()))
    return BenchRun(samples, len(getattr(ddps.get("bucketed"), "buckets", [])), same)


def bench_main(argv: list[str]) -> int:
    """`python -m helpers bench ddp`: DDPBucketed vs torch DDP step time (gloo, 2 ranks), interleaved in one run;
    also under torchrun (the torchrun world: one node or several), where rank 0 reports and saves."""
    parser = bench_parser("python -m helpers bench ddp", bench_main.__doc__)
    parser.add_argument("--bucket-mb", type=float, default=1.0)
    parser.add_argument("--out", help="save into this folder instead of data/local/<device>/")
    args = parser.parse_args(argv)
    if not args.bucket_mb > 0:
        parser.error(f"--bucket-mb must be > 0, got {args.bucket_mb}")
    worker = functools.partial(
        bench_worker,
        model=args.model,
        bucket_mb=args.bucket_mb,
        steps=args.steps,
        warmup=args.warmup,
        batch_size=args.batch_size,
        context_length=args.context_length,
    )
    world = int(os.environ.get("WORLD_SIZE", 2)) if L._under_torchrun() else 2
    per_rank = L.launch(worker, world, backend="gloo", device=args.device)
    topology = L.torchrun_topology()["topology"] if L._under_torchrun() else "1 node, spawned ranks"
    if int(os.environ.get("RANK", 0)) != 0:
        return 0
    slowest = {k: slowest_rank([p.step[k] for p in per_rank]) for k in ("bucketed", "torch_ddp")}
    ratio = paired_ratio(slowest["bucketed"], slowest["torch_ddp"])  # step i vs step i
    same = all(p.same_weights for p in per_rank)
    rows = [
        {
            "wrapper": k,
            "median_s": float(np.median(v)),
            "p25_s": float(np.percentile(v, 25)),
            "p75_s": float(np.percentile(v, 75)),
            "world_size": world,
        }
        for k, v in slowest.items()
    ]
    path = save_results(
        rows,
        "ddp_bench",
        directory=args.out,
        model=args.model,
        bucket_mb=args.bucket_mb,
        steps=args.steps,
        topology=topology,
        ratio=ratio.median,
        ratio_low=ratio.low,
        ratio_high=ratio.high,
        same_weights=same,
    )
    print(
        f"{args.model}, bucket {args.bucket_mb:g} MB, gloo on {args.device}, {world} ranks ({topology}), "
        f"{args.steps} interleaved steps (slowest rank): DDPBucketed median {rows[0]['median_s'] * 1e3:.2f} ms "
        f"({per_rank[0].buckets} buckets), torch DDP {rows[1]['median_s'] * 1e3:.2f} ms; "
        f"{verdict('DDPBucketed', 'torch DDP', ratio, 'step time')}; identical weights after training: {same}; "
        f"saved {path.name}"
    )
    return 0 if same else 1


def speed_pivot(speed: pd.DataFrame) -> pd.DataFrame:
    """§2's table: ms per step and in finish for SPEED_VARIANTS (rows) by model (columns)."""
    rows = speed[speed["variant"].isin([v[0] for v in SPEED_VARIANTS])]
    return rows.pivot_table(index="variant", columns="model", values=["step_s", "comm_s"], sort=False) * 1e3


def describe_bucket_model(fit: BucketModel, sweep: pd.DataFrame, model: str, seed_mb) -> str:
    """§4's sentences: S, T_b, S/β, α, the optimum n*, b*, and which swept sizes hold every gradient in one bucket."""
    S, n_star = fit.grad_bytes, fit.n_star
    text = (
        f"{model}: S = {S / MB:.2f} MB of gradients in {len(fit.tensor_bytes)} tensors, T_b = "
        f"{fit.backward_s * 1e3:.1f} ms, S/β = {S / fit.beta_Bps * 1e3:.1f} ms, α = {fit.alpha_s * 1e6:.0f} µs → "
        f"n* = {n_star:.1f} buckets, b* = {S / n_star / MB:.3g} MB (predicted overhead {fit.overhead(n_star) * 1e3:.2f} ms)"
    )
    if n_star > len(fit.tensor_bytes):
        text += (
            f"\nthe model asks for more buckets ({n_star:.1f}) than {model} has gradient tensors "
            f"({len(fit.tensor_bytes)}): the finest split DDPBucketed can build is one tensor per bucket "
            f"(as DDPIndividualParameters, in fixed order)"
        )
    one = [mb for mb, n in zip(sweep["bucket_MB"], sweep["buckets"]) if n == 1]
    return text + (
        f"\nbucket sizes that hold every gradient in one bucket here: {', '.join(f'{mb:g}' for mb in one)} MB "
        f"({len([m for m in one if m in seed_mb])} of the seed's {len(seed_mb)} sizes)"
    )


# ---- comparisons that know their noise (notebook 04) ----


def paired_variants(per_rank: list[dict[str, SpeedRun]], a: str, b: str, field: str = "step"):
    """a's time over b's (field: step, comm or backward), paired step by step: the slowest rank's seconds of the same
    interleaved round (speed_worker times every variant once per round)."""
    per = lambda label: slowest_rank([getattr(r[label], field) for r in per_rank])  # noqa: E731
    return paired_ratio(per(a), per(b))


def ratio_rows(raw: dict) -> list[dict]:
    """Per model, every pair of variants' step and backward times, and naive vs flat's communication time (all of it
    after backward, never zero), paired per step: 04_ddp_ratios, read by the answers page."""
    rows = []
    for name, per_rank in raw.items():
        for timed in ("step", "backward", "comm"):
            labels = ["naive", "flat"] if timed == "comm" else list(per_rank[0])
            samples = {v: slowest_rank([getattr(r[v], timed) for r in per_rank]) for v in labels}
            rows += pairwise_ratios(samples, model=name, field=timed)
    return rows


def fastest_text(per_rank, labels, field: str = "step") -> str:
    """The fastest of `labels` by median, named only when it is measurably faster than the runner-up."""
    med = {k: float(np.median(slowest_rank([getattr(r[k], field) for r in per_rank]))) for k in labels}
    first, second = sorted(med, key=med.get)[:2]
    r = paired_variants(per_rank, first, second, field)
    if r.differs:
        return f"fastest {first} ({first} takes {r.median:.2f}x {second}'s time, {r})"
    return f"no measurable fastest: {verdict(first, second, r)}"


def speed_lines(speed: pd.DataFrame, raw: dict, sizes) -> str:
    """Per model: naive's share communicating, flat vs naive, the fastest wrapper, ours vs torch DDP at 25 MB, each
    ratio paired per step with its 95% interval (notebook 04 §2)."""
    lines = []
    for name in sizes:
        s, runs = speed[speed["model"] == name].set_index("variant"), raw[name]
        naive = s.loc["naive", "step_s"]
        wrappers = [v for v in s.index if v != "local"]
        lines.append(
            f"{name} ({s['grad_MB'].iloc[0]:.1f} MB of gradients): naive {naive * 1e3:.1f} ms/step, of which "
            f"{s.loc['naive', 'comm_s'] / naive:.0%} communicating; flat vs naive: "
            f"{verdict('flat', 'naive', paired_variants(runs, 'flat', 'naive'))}; "
            f"{fastest_text(runs, wrappers)}; ours vs torch DDP at 25 MB: "
            f"{verdict('bucketed 25 MB', 'torch_ddp 25 MB', paired_variants(runs, 'bucketed 25 MB', 'torch_ddp 25 MB'))}"
        )
    return "\n".join(lines)


def backward_lines(speed: pd.DataFrame, raw: dict, sizes) -> str:
    """Per model: backward's median alone and under naive, per-parameter and bucketed 25 MB; the overlapped variants'
    backward against compute alone paired per step (notebook 04 §3)."""
    b = speed.pivot_table(index="variant", columns="model", values="backward_s", sort=False)
    lines = []
    for name in sizes:
        r = paired_variants(raw[name], "per_parameter", "local", "backward")
        lines.append(
            f"{name}: backward {b.loc['local', name] * 1e3:.1f} ms alone, {b.loc['naive', name] * 1e3:.1f} ms "
            f"under naive, {b.loc['per_parameter', name] * 1e3:.1f} ms under per-parameter, "
            f"{b.loc['bucketed 25 MB', name] * 1e3:.1f} ms under bucketed 25 MB; "
            f"{verdict('per-parameter', 'compute alone', r, 'backward time')}"
        )
    return "\n".join(lines)


def sweep_optimum_text(per_rank, sweep: pd.DataFrame) -> str:
    """The swept bucket size with the lowest median step and the sizes not measurably slower (paired per step)."""
    labels = dict(zip(sweep["variant"], sweep["bucket_MB"]))
    med = {k: float(np.median(slowest_rank([r[k].step for r in per_rank]))) for k in labels}
    best = min(med, key=med.get)
    tied = [f"{labels[k]:g}" for k in labels if k != best and not paired_variants(per_rank, k, best).differs]
    return f"lowest median step: {labels[best]:g} MB ({med[best] * 1e3:.1f} ms); " + (
        f"not measurably slower (paired 95% interval of the ratio includes 1): {', '.join(tied)} MB"
        if tied
        else "every other swept size is measurably slower"
    )


def alpha_beta(profile: str, backend: str, device: str):
    """The 2-rank all-reduce α–β fit for (backend, device): notebook 03's saved fit when its results are present, else
    collectives.run_grid + fit_table on notebook 03's grid for this profile. Returns (fit, where it came from)."""
    from helpers.experiments import collectives
    from helpers.results import load_results

    key = dict(backend=backend, device=device, world_size=2, op="all_reduce")
    try:
        run = load_results("03_collectives")
        saved = run.frame() if run.provenance.get("profile") == profile else pd.DataFrame(columns=list(key))
        part = saved[np.logical_and.reduce([saved[k] == v for k, v in key.items()])]
        if "nodes" in part:
            part = part[part["nodes"] == 1]
        if len(part) >= 2:
            fit = collectives.fit_table(part).iloc[0]["fit"]
            return fit, f"notebook 03's saved fit ({run.label}, fit_table on the lower quartile of the calls)"
    except FileNotFoundError:
        pass
    grid = collectives.PROFILE_GRID[profile]
    df, _ = collectives.run_grid(
        grid["sizes"],
        ops=("all_reduce",),
        world_sizes=(2,),
        combos=((backend, device),),
        warmup=grid["warmup"],
        iters=grid["iters"],
        budget_s=grid["budget_s"],
    )
    assert df["wrong"].sum() == 0
    return collectives.fit_table(df).iloc[0]["fit"], f"measured here with notebook 03's {profile} grid and fit_table"
