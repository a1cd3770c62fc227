"""`yours` for DDP on the course's own language model, within the handout's contract: every edition's DDP class wraps
an arbitrary nn.Module, and the 2024/2025 handouts benchmark the bucketed one on cs336-basics' BasicsTransformerLM at
buckets of 1, 10, 100 and 1000 MB. A small configuration of that model (the student's own, else our copy of its
layout) is wrapped on LM_WORLD ranks; every step's synced gradient is compared with the average one process computes
from every rank's share at the same weights, and every bucket's all-reduce with bucket_size_mb. Launched by
helpers.course.yours.ddp.runner; the parent's side is helpers.course.yours.ddp.lm_checks.

    per_rank = L.launch(functools.partial(lm_worker, path, ["bucketed"], opts), LM_WORLD)   # in the ranks
    checks = lm_checks("bucketed", [r["bucketed"] for r in per_rank], path)   # in the parent (ddp_lm_checks)
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

import helpers.course.yours.adapters as A
import helpers.course.yours.course_models as CM
import helpers.course.yours.student_calls as S
from helpers.course.yours.collectives import watch_calls
from helpers.experiments.common import rank_rows
from helpers.experiments.ddp_equivalence import gradient_bound, worst_element
from helpers.formulas import MiB
from helpers.model import lm_loss

LM_WORLD = 3  # ranks: averaging over 3 is not halving, and a ring of 3 is not a pair (2 cores: see lm_worker)
HANDOUT_BUCKETS_MB = (1.0, 10.0, 100.0, 1000.0)  # 2024/2025 ddp_bucketed_benchmarking (a)
SEVERAL_BUCKETS = (1 / 2, 1 / 3, 1 / 4, 1 / 5, 1 / 6, 1 / 8)  # fractions of the small model's gradient bytes tried
SLACK_BYTES = 8  # a bucket's all-reduce may round its capacity up to whole elements


@dataclass
class Readiness:
    """The course LM's trainable tensors in registration order, their bytes, and where each one's gradient comes in
    one backward (post-accumulate hooks)."""

    names: list[str]
    nbytes: list[int]
    at: dict[str, int]  # name -> position in the order gradients become ready

    def late(self) -> dict[str, str]:
        """name -> an earlier-registered tensor whose gradient is ready before this one's: what a bucket fired from
        one member's hook can leave behind."""
        out, first = {}, None  # first: the earliest-ready tensor registered so far
        for n in self.names:
            if first is not None and self.at.get(first, -1) < self.at.get(n, -1):
                out[n] = first
            if first is None or self.at.get(n, len(self.at)) < self.at.get(first, len(self.at)):
                first = n
        return out

    def most_buckets(self, limit: float) -> int:
        """The most buckets of at most `limit` bytes a greedy fill makes, filled in registration order, its reverse
        (the handout's suggestion), the order gradients become ready, or that order's reverse: what a correct
        bucketed DDP may need, whichever order it fills in."""
        ready = sorted(self.names, key=lambda n: self.at.get(n, len(self.at)))
        size = dict(zip(self.names, self.nbytes, strict=True))
        orders = (self.names, self.names[::-1], ready, ready[::-1])
        return max(_greedy([size[n] for n in order], limit) for order in orders)

    def parts(self, limit: float) -> bool:
        """Whether buckets of at most `limit` bytes, filled in reverse registration order (the handout's suggestion),
        hold a tensor whose gradient comes after that of the bucket's last-added member."""
        bucket, size = [], 0
        for n, b in zip(reversed(self.names), reversed(self.nbytes), strict=True):
            if bucket and size + b > limit:
                if any(self.at.get(m, -1) > self.at.get(bucket[-1], -1) for m in bucket):
                    return True
                bucket, size = [], 0
            bucket.append(n)
            size += b
        return any(self.at.get(m, -1) > self.at.get(bucket[-1], -1) for m in bucket)


def _greedy(nbytes: list[int], limit: float) -> int:
    """Buckets a greedy fill of these sizes makes: a new bucket when the next tensor would overflow this one."""
    count, size = 0, 0
    for b in nbytes:
        if count == 0 or size + b > limit:
            count, size = count + 1, 0
        size += b
    return count


def readiness(model: nn.Module, x, y) -> Readiness:
    """One backward of `model` on (x, y) with a post-accumulate hook on every trainable tensor."""
    names = {p: n for n, p in model.named_parameters() if p.requires_grad}
    ready: list[str] = []
    handles = [p.register_post_accumulate_grad_hook(lambda p: ready.append(names[p])) for p in names]
    lm_loss(model(x), y).backward()
    for h in handles:
        h.remove()
    model.zero_grad(set_to_none=True)
    return Readiness(
        list(names.values()), [p.numel() * p.element_size() for p in names], {n: i for i, n in enumerate(ready)}
    )


def lm_bucket_sizes(order: Readiness) -> list[float]:
    """Bucket sizes (MB) the bucketed flavour runs the course LM at: two fractions of the small model that cut it into
    several buckets of several tensors where registration order and readiness part (the first two that do, else the
    first two tried), then the handout's 1 to 1000 MB."""
    total = sum(order.nbytes)
    parting = [f for f in SEVERAL_BUCKETS if order.parts(f * total)]
    chosen = sorted((parting + list(SEVERAL_BUCKETS))[:2])
    return [round(f * total / MiB, 6) for f in chosen] + list(HANDOUT_BUCKETS_MB)


def basics_on_path(path: str) -> None:
    """<repository>/cs336-basics importable where the adapters' root is a subfolder (the 2024 layout: tests in
    cs336-systems/, cs336-basics/ beside it)."""
    root = A.assignment_root(Path(path))
    for folder in (root / "cs336-basics", root.parent / "cs336-basics"):
        if folder.is_dir() and str(folder) not in sys.path:
            sys.path.append(str(folder))


# ---- in a rank ----


_REFERENCE: dict = {}  # (model class, world, step, the weights' digest) -> one_process there, shared by the runs


def reference(ref: nn.Module, step: int, x, y, world: int) -> tuple[dict, dict]:
    """one_process at `ref`'s weights on step `step`'s batch, computed once per rank for each set of weights: it
    depends on nothing else (the model class, the world, the batch, the weights), and the runs of a flavour at
    several bucket sizes, or of several flavours, often reach bitwise the same weights (rank 0's start always)."""
    key = (type(ref), world, step, tuple(sorted(S.digest(dict(ref.named_parameters())).items())))
    if key not in _REFERENCE:
        _REFERENCE[key] = one_process(ref, x, y, world)
    return _REFERENCE[key]


def one_process(model: nn.Module, x, y, world: int) -> tuple[dict, dict]:
    """One process at `model`'s weights: each rank's share of the batch forward and backward, the gradients averaged
    (what the handout has every rank end with; in exact arithmetic the full batch's, and unlike the full batch's,
    not moved by a model's own lower-precision arithmetic); and per tensor Σ_b |∂(loss_b / B)| over the B sequences,
    the magnitude of the sums each element is (gradient_bound's scale; a float32 estimate, its own rounding is
    negligible against the bound)."""
    grads: dict = {}
    for r in range(world):
        rows = rank_rows(x.shape[0], r, world)
        model.zero_grad(set_to_none=True)
        lm_loss(model(x[rows]), y[rows]).backward()
        for n, p in model.named_parameters():
            if p.grad is not None:
                grads[n] = grads[n] + p.grad if n in grads else p.grad.detach().clone()
    grads = {n: g / world for n, g in grads.items()}
    scale = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for b in range(x.shape[0]):  # sequences do not interact: the gradient is Σ_b of (loss_b / B)'s
        model.zero_grad(set_to_none=True)
        (lm_loss(model(x[b : b + 1]), y[b : b + 1]) / x.shape[0]).backward()
        for n, p in model.named_parameters():
            if p.grad is not None:
                scale[n] += p.grad.abs()
    model.zero_grad(set_to_none=True)
    return grads, scale


def compare_step(grads: dict, g_ref: dict, scale: dict, tokens: int) -> dict:
    """One step on this rank: each tensor's synced gradient vs one process's, max |diff| over gradient_bound (passes
    at <= 1); the worst element; the tensors beyond the bound; `factor`, c when every gradient is c x one process's
    within c x the bound (summed: c = world; halved on 3 ranks: c = 1.5), else None."""
    got = {n: torch.zeros_like(ref) if grads.get(n) is None else grads[n] for n, ref in g_ref.items()}
    bounds = {n: gradient_bound(scale[n], tokens) for n in g_ref}
    ratios = {n: _ratio((got[n] - ref).abs().max(), bounds[n]) for n, ref in g_ref.items()}
    den = sum(float((ref * ref).sum()) for ref in g_ref.values())
    c = sum(float((got[n] * ref).sum()) for n, ref in g_ref.items()) / den if den > 0 else float("nan")
    proportional = c == c and all(
        _ratio((got[n] - c * ref).abs().max(), abs(c) * bounds[n]) <= 1 for n, ref in g_ref.items()
    )
    worst = max(ratios, key=ratios.get)
    return {
        "ratio": ratios[worst],
        "where": worst_element(got[worst], g_ref[worst], bounds[worst], worst),
        "wrong": sorted(n for n, r in ratios.items() if not r <= 1),
        "factor": c if proportional else None,
        "finite": all(bool(torch.isfinite(g).all()) for g in grads.values() if g is not None),
        "zeros": sorted(n for n in g_ref if g_ref[n].any() and (grads.get(n) is None or not grads[n].any())),
        "digest": S.digest({n: g for n, g in grads.items() if g is not None}),
    }


def _ratio(diff: torch.Tensor, bound: torch.Tensor) -> float:
    """diff / bound; a zero bound demands a zero diff (inf otherwise); NaN counts as inf."""
    diff, bound = float(diff), float(bound)
    if diff != diff:
        return float("inf")
    return diff / bound if bound > 0 else (0.0 if diff == 0 else float("inf"))


class PlainSGD:
    """SGD (p -= lr * grad) with an optimizer's zero_grad(), step() and param_groups, for the hooks' `optimizer`
    argument: torch.optim's constructor imports torch._dynamo, seconds per rank on a small CPU."""

    def __init__(self, params, lr: float):
        self.param_groups = [{"params": list(params), "lr": lr}]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.param_groups[0]["params"]:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        for p in group["params"]:
            if p.grad is not None:
                p.add_(p.grad, alpha=-group["lr"])


def lm_run(fns: dict, impl: str, cls: type, order: Readiness, bucket_mb: float | None) -> dict:
    """The course's DDP procedure on its LM on this rank: the model seeded by the rank (the broadcast must give rank
    0's), LM_STEPS SGD steps on this rank's rows with the adapters' hooks; before each, one process's average of
    every rank's gradient at the same weights; each step's all-reduces as called (bytes, async_op, the phase of
    backward they were launched in), and how many buckets a greedy fill makes at this size."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ref = CM.course_lm(cls, 0)  # rank 0's start, then each step's one-process reference
    shim = S.StudentDDP(fns, impl, CM.course_lm(cls, rank), bucket_mb)
    shim.keep = False
    mine = S.by_position(ref, shim.ddp)
    start_diff = [n for n, p in ref.named_parameters() if not torch.equal(mine[n].detach(), p.detach())]
    shim.optimizer = opt = PlainSGD(shim.ddp.parameters(), lr=CM.LM_LR)
    batches = CM.lm_batches(world)
    steps, sizes = [], {n: p.numel() * p.element_size() for n, p in ref.named_parameters() if p.requires_grad}
    for s, (x, y) in enumerate(batches):
        with torch.no_grad():
            for n, p in ref.named_parameters():
                p.copy_(mine[n])
        g_ref, scale = reference(ref, s, x, y, world)
        rows = rank_rows(x.shape[0], rank, world)
        shim.on_train_batch_start()
        opt.zero_grad()
        with watch_calls() as calls:
            counting = calls.count_ready(mine.values())
            loss = lm_loss(shim(x[rows]), y[rows])
            calls.backward_of(loss)
            loss.backward()
            shim.finish_gradient_synchronization()
            for h in counting:
                h.remove()
        grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in mine.items()}
        steps.append(
            {
                **compare_step(grads, g_ref, scale, x.numel() + world),  # the tokens, then the average
                "messages": [c.nbytes for c in calls.of("all_reduce")],
                "calls": [(c.async_op, c.phase) for c in calls.of("all_reduce")],
                "ready": [c.ready for c in calls.of("all_reduce")],  # calls sharing a count were launched at once
            }
        )
        opt.step()
    return {
        "bucket_mb": bucket_mb,
        "buckets": None if bucket_mb is None else order.most_buckets(bucket_mb * MiB),
        "start_diff": start_diff,
        "steps": steps,
        "late": order.late(),
        "sizes": sizes,
        "state": S.digest({n: p.detach() for n, p in mine.items()}),
    }


def usable_lm(world: int) -> tuple[type, str, Readiness]:
    """The course LM class to wrap, where it comes from, and its readiness on the first batch; our copy of the layout
    when the student's cannot be built or run with the course's arguments (their model is not what is checked)."""
    cls, source = CM.course_lm_class()
    batch = CM.lm_batches(world)[0]
    try:
        return cls, source, readiness(CM.course_lm(cls, 0), *batch)
    except Exception as exc:  # noqa: BLE001 - the student's model failing is a reason to use ours, reported
        if cls is CM.CourseLM:
            raise
        why = f"our copy of the course's layout (your BasicsTransformerLM raised {type(exc).__name__}: {exc})"
        return CM.CourseLM, why, readiness(CM.course_lm(CM.CourseLM, 0), *batch)


def lm_worker(path: str, impls: list[str], opts, parts=("course",)) -> dict:
    """In each rank, per DDP flavour: lm_run at each bucket size (bucketed) or once, each a phase of its own (an
    exception is that run's error). {impl: outcome with "source" (whose LM) and "runs"}. Three gloo ranks on a 2-core
    CPU: the model is small enough that the launch, not the work, dominates (a few seconds)."""
    out = {}
    for impl in impls:

        def run(impl=impl):
            fns = S.adapter_fns(path, "ddp", impl)
            basics_on_path(path)
            cls, source, order = usable_lm(dist.get_world_size())
            sizes = lm_bucket_sizes(order) if impl == "bucketed" else [None]
            runs = [S.phase(path, functools.partial(lm_run, fns, impl, cls, order, mb)) for mb in sizes]
            return {"source": source, "sizes": sizes, "runs": runs}

        out[impl] = S.outcome(run)
    return out
