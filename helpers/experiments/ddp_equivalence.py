"""Notebook 04 §1: every wrapper's synced gradient against one process's full-batch gradient at the same weights,
within a float32 bound derived from the sums each element is (gradient_bound), and the table of the worst case.

    checks = check_equivalence("toy", toy_variants(), backend="gloo", device="cpu")   # one row per variant
    assert_equivalent(checks)
"""

from __future__ import annotations

import copy
import functools
import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers import launch as L
from helpers.ddp import MB, plan_buckets, wrap
from helpers.experiments.common import (
    TiedToyModel,
    cpu_state,
    make_batches,
    make_model,
    make_optimizer,
    rank_share,
    train_step,
)
from helpers.model import for_edition, lm_loss

EPS32 = torch.finfo(torch.float32).eps  # 2**-23; unit roundoff u = EPS32 / 2


EQUIVALENCE = {  # what §1 and tests/test_ddp.py train: global batches of batch_size x context_length tokens
    "toy": dict(steps=3, batch_size=8, context_length=6, optimizer="sgd"),
    "small/cpu": dict(steps=2, batch_size=4, context_length=16, optimizer="adamw"),
}


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


def _digest(tensors) -> bytes:
    """A hash of the tensors' bytes (dtype and shape included): equal digests mean bitwise-equal tensors."""
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy() if t.numel() else b"")
    return h.digest()


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


def gradient_checks(
    name: str, ddp, optimizer, batches, seed: int = 0, optimizer_name: str = "sgd", references: dict | None = None
) -> dict:
    """Train `ddp` (rank_share of every global batch); before each step, the single-process reference at its current
    weights. Returns EquivalenceRun's start_equal, steps, weight_ratio and state. `references`: a dict shared between
    calls on one model, which reuses a reference whose weights and batch are bitwise the same (every variant's
    first step; later ones where the variants' updates agree bitwise)."""
    net, dev = ddp.module, L.device()
    start = make_model(name, seed).state_dict()
    start_equal = all(torch.equal(v, start[k]) for k, v in net.state_dict().items())
    steps, weight_ratio = [], None
    references = {} if references is None else references
    for i, batch in enumerate(batches):
        ref = make_model(name, seed)
        ref.load_state_dict(net.state_dict())  # the same weights, no hooks
        x, y = (t.to(dev) for t in batch)
        key = _digest([x, y, *ref.state_dict().values()])
        if key not in references:
            references[key] = reference_gradients(ref, x, y)
        g_ref, scale = references[key]
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
    rank, out, references = dist.get_rank(), [], {}  # one process's reference per distinct (weights, batch)
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
                **gradient_checks(model, ddp, opt, batches, seed, optimizer, references),
            )
        )
        ddp.close()
    return out


def equivalence_rows(name: str, per_rank: list[list[EquivalenceRun]]) -> pd.DataFrame:
    """One row per variant, worst over ranks and steps: bucket count, start/rank agreement, gradient and weight
    checks."""
    rows = []
    for runs in zip(*per_rank, strict=True):  # the same variant on every rank
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
    shape = name if name in EQUIVALENCE else for_edition(name, "2024")  # every edition's small/cpu: one setting
    config = {**EQUIVALENCE[shape], **config}
    worker = functools.partial(equivalence_worker, model=name, variants=variants, **config)
    return equivalence_rows(name, L.launch(worker, world, backend=backend, device=device))


def assert_equivalent(checks: pd.DataFrame) -> None:
    """Every row: same start as one process, same final bits on every rank, gradients (and SGD weights) in bound."""
    bad = checks[
        ~checks["start_equal"] | ~checks["ranks_equal"] | ~(checks["grad_ratio"] <= 1) | (checks["weight_ratio"] > 1)
    ]
    assert bad.empty, f"not equivalent to one process:\n{bad.to_string()}"
