"""Notebook 07 §1: is FSDP's gradient the one process's on the whole batch? Each rank trains on its rows
(equivalence_worker); one process recomputes the gradients from the same weights (reference_grads) and a bound says
how far apart rounding may put them (equivalence_table): in fp32 against the whole batch, the last sum's two orders
plus how far the per-token terms came out from one process on each rank's rows (batch_shape_bound; nothing on a CPU,
cuBLAS's shape-dependent kernels on a GPU); in fp16 against each rank's rows, the last sum's orders (bound)."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers import launch as L
from helpers.experiments.common import make_batches, rank_rows, rank_share
from helpers.experiments.fsdp_common import DTYPES, EPS, LOSS_SCALE, LR, SHARD_TYPES, FsdpImpl, build
from helpers.model import lm_loss


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


@dataclass
class Term:
    """One use of a parameter in backward, as the factors of the per-token terms its gradient sums: a Linear weight
    D^T A over tokens (D: the output's gradient, A: the input, (tokens, features) each), a bias sum D, an Embedding
    row the sum of D over the tokens A (indices) that read it, an elementwise gain (out = a * w) sum D * A."""

    name: str
    kind: str  # "linear" | "bias" | "embedding" | "gain"
    D: torch.Tensor
    A: torch.Tensor | None

    def summed(self, D=None, A=None, like=None) -> torch.Tensor:
        """The gradient these factors (or others of the same shapes) make, shaped as `like`, the parameter."""
        D, A = self.D if D is None else D, self.A if A is None else A
        if self.kind == "linear":
            return D.T @ A
        if self.kind == "bias":
            return D.sum(0)
        if self.kind == "embedding":
            return torch.zeros(like.shape, dtype=D.dtype, device=D.device).index_add_(0, A, D)
        return (D * A).sum(0)

    def sizes(self, A):
        """A's magnitudes as the sum of |term| takes them: |A| for a Linear weight or a gain; a bias has none, an
        Embedding's are indices (as they are)."""
        return A.abs() if self.kind in ("linear", "gain") else A


def terms(net: nn.Module, x, y) -> list[Term]:
    """Every parameter use's Term from lm_loss(net(x), y).backward(), in net's dtype and on its device, in call
    order; tokens flattened batch-major. Positions (an Embedding called on (T,) ids) take every sample's token
    gradient (the batch's sum)."""
    names, seen = {id(p): n for n, p in net.named_parameters()}, []

    def record(m, args, out):
        if out.requires_grad:
            out.register_hook(lambda g, m=m, a=args[0], o=out: seen.append((m, a.detach(), o.detach(), g)))

    handles = [m.register_forward_hook(record) for m in net.modules() if list(m.parameters(recurse=False))]
    try:
        lm_loss(net(x), y).backward()
    finally:
        for h in handles:
            h.remove()
    seen.reverse()  # backward meets the uses last first
    per_token = next(g for m, a, _, g in seen if isinstance(m, nn.Embedding) and a.dim() == 2)  # (B, T, C)
    out = []
    for m, a, o, g in seen:
        if isinstance(m, nn.Embedding) and a.dim() == 1:  # positions (T,): every sample's token gradient adds in
            g, a = per_token, a.repeat(per_token.shape[0])
        g = g.flatten(0, -2)  # (tokens, out features)
        if isinstance(m, nn.Linear):
            out.append(Term(names[id(m.weight)], "linear", g, a.flatten(0, -2)))
            if m.bias is not None:
                out.append(Term(names[id(m.bias)], "bias", g, None))
        elif isinstance(m, nn.Embedding):
            out.append(Term(names[id(m.weight)], "embedding", g, a.flatten()))
        else:
            (w,) = m.parameters(recurse=False)
            out.append(Term(names[id(w)], "gain", g, (o / w.detach()).flatten(0, -2)))
    return out


def magnitudes(net: nn.Module, x, y) -> tuple[dict, dict]:
    """Per gradient entry, in float64: Σ|term| of the sum backward forms for it, and the number of terms. Linear
    weight: |δ|ᵀ|x| over tokens (bias: Σ|δ|); Embedding: |δ| into its row, positions summed over the batch; an
    elementwise gain (out = a·w): Σ|δ·a|. A parameter used twice (tied) adds both uses' terms."""
    net = copy.deepcopy(net).double()
    params = dict(net.named_parameters())
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    count = dict.fromkeys(params, 0)
    for t in terms(net, x, y):
        total[t.name] += t.summed(t.D.abs(), t.sizes(t.A), params[t.name])
        count[t.name] += t.D.shape[0]
    return total, count


def bound(net: nn.Module, x, y, dtype: str) -> dict:
    """|g_fsdp − g_ref| ≤ n·eps·Σ|term| per entry: both sides add the same n terms in their own order, each within
    ~n·eps/2·Σ|term| of the exact sum (Higham, §4.2); eps of the dtype the sums run in. It assumes both sides'
    terms are bitwise equal: true for FSDP's fp16 check (its reference runs each rank's rows, the ranks' shapes)."""
    total, count = magnitudes(net, x, y)
    return {n: (count[n] * EPS[dtype] * total[n]).float() for n in total}


def batch_shape_bound(load, x, y, world: int) -> tuple[dict, bool]:
    """(per-entry bound, whether the terms came out bitwise equal) for |g_fsdp − g_whole| in fp32: FSDP on `world`
    ranks (rank_rows' whole sequences each, the mean over ranks; world a power of two) against one process on the
    whole batch, `load()` a fresh model at the step's weights on the run's device.

    Both sides sum n per-token terms t_i (a Linear weight's entry: δ_i·a_i over the tokens), each in its own order,
    but not necessarily the same terms: a token's activation a_i and upstream gradient δ_i come out of matmuls
    whose accumulation order the BLAS picks by shape. A CPU BLAS computes a row the same way whatever the batch
    (the terms are bitwise equal); cuBLAS picks another kernel, tiling and split-K for half the rows, so every
    activation and upstream gradient before the last sum rounds differently. By the triangle inequality,
        |Σ t_i^fsdp − Σ t_i^whole| ≤ γ_n Σ|t^fsdp| + γ_n Σ|t^whole| + Σ_i |t_i^fsdp − t_i^whole|,
        |t_i^fsdp − t_i^whole| ≤ |Δδ_i| |a_i^fsdp| + |δ_i^whole| |Δa_i|,
    each sum over tokens a matmul of absolute values; the first two are taken as n·eps·max(Σ|t^fsdp|, Σ|t^whole|)
    (eps = 2u, γ_n ≈ n·u), the old summation bound (bound) when the terms are equal. The FSDP side's terms are
    one process's on each rank's rows, on the same device: the shapes FSDP's ranks ran, so the kernels they ran
    (their fp16 check, against the same runs, is bitwise on a GPU), divided by world as FSDP's mean divides them.
    Δδ and Δa are measured between that run and the whole batch's, so the bound holds whatever order either
    side's matmuls and sums accumulated in; it is fitted to nothing: a gradient not averaged (2x) is off by the
    gradient itself, 5e4 times this bound or more on every parameter of notebook 07's check.

    Why not a bound for any order derived from the model alone (gamma_k |A||B| for each matmul, carried through
    forward and backward): carried componentwise, or as norms with each op's operator norm, it has to assume that
    every op's rounding lines up with the next op's worst case, and over one block of this model it outgrows the
    activations themselves (relative error above 1 at the second RMSNorm), so it could not catch a bug."""
    whole = terms(load(), x, y)
    parts = [terms(load(), x[rows], y[rows]) for rows in (rank_rows(x.shape[0], r, world) for r in range(world))]
    params = {n: p.detach() for n, p in load().named_parameters()}
    lim = {n: torch.zeros(p.shape, dtype=torch.float64) for n, p in params.items()}
    equal = True
    for k, t in enumerate(whole):
        if any(p[k].name != t.name for p in parts):
            raise ValueError(f"the ranks' rows called the parameters in another order than the whole batch ({t.name})")
        D = t.D.double().cpu()
        Dr = torch.cat([p[k].D for p in parts]).double().cpu() / world  # FSDP's mean: each rank's share / world
        A = Ar = None if t.A is None else t.A.cpu()
        if t.kind in ("linear", "gain"):
            A, Ar = A.double(), torch.cat([p[k].A for p in parts]).double().cpu()
        equal &= torch.equal(D, Dr) and (A is None or torch.equal(A, Ar))
        like = lim[t.name]
        total = torch.maximum(t.summed(D.abs(), t.sizes(A), like), t.summed(Dr.abs(), t.sizes(Ar), like))
        moved = t.summed((Dr - D).abs(), t.sizes(Ar), like)
        if t.kind in ("linear", "gain"):
            moved = moved + t.summed(D.abs(), (Ar - A).abs(), like)
        lim[t.name] += D.shape[0] * EPS["fp32"] * total + moved
    return {n: v.float() for n, v in lim.items()}, equal


def equivalence_table(per_rank: list[dict], *, model, n_layers, steps, batch_size, context_length) -> pd.DataFrame:
    """Per dtype and step: the largest |g_fsdp − g_ref| and its ratio to the bound (≤ 1 passes) with the parameter
    where it is largest, bitwise equal (expected with 1 rank only), whether one process's per-token terms came out
    the same on each rank's rows as on the whole batch (fp32: batch_shape_bound; False where the device's matmuls
    round by shape), replicated gradients identical on every rank. fp32 is bounded against the whole batch
    (batch_shape_bound), fp16 against each rank's rows (bound)."""
    rows = []
    batches = make_batches(model, steps, batch_size, context_length, 0)
    for dtype, run in per_rank[0].items():
        for s, (x, y) in enumerate(batches):
            # on the run's device: cuBLAS and a CPU BLAS sum in different orders, so only there can 1 rank be bitwise
            x, y = x.to(run.device), y.to(run.device)
            load = functools.partial(loaded, model, n_layers, run.weights[s], device=run.device)
            whole = _on_cpu(reference_grads(load(), x, y, dtype))
            shares = [(x[rows], y[rows]) for rows in (rank_rows(x.shape[0], r, run.world) for r in range(run.world))]
            if dtype == "fp32":  # the summation bound plus what the batch's shape changed in the terms
                ref, (lim, same_terms) = whole, batch_shape_bound(load, x, y, run.world)
            else:  # the reference runs the ranks' shapes: the summation bound alone
                ref, same_terms = _on_cpu(ranks_reference(load, shares, dtype)), None
                lim = _on_cpu(bound(load(), x, y, dtype))
            diff = {n: (run.grads[s][n] - ref[n]).abs().detach() for n in ref}
            ratio = {n: float((d / lim[n].clamp_min(1e-30)).max()) for n, d in diff.items()}
            rows.append(
                {
                    "ranks": run.world,
                    "dtype": dtype,
                    "step": s,
                    "reference": "whole batch" if dtype == "fp32" else "each rank's rows, averaged",
                    "max_abs_diff": max(float(d.max()) for d in diff.values()),
                    "whole batch max_abs_diff": max(float((run.grads[s][n] - whole[n]).abs().max()) for n in whole),
                    "max_diff/bound": max(ratio.values()),
                    "max_at": max(ratio, key=ratio.get) if max(ratio.values()) > 0 else "",
                    "bitwise": all(torch.equal(run.grads[s][n], ref[n]) for n in ref),
                    "terms_equal": same_terms,
                    "replicated_equal": all(
                        torch.equal(a, b)
                        for r in per_rank
                        for a, b in zip(r[dtype].replicated[s], run.replicated[s], strict=True)
                    ),
                }
            )
    return pd.DataFrame(rows)


def _on_cpu(tensors: dict) -> dict:
    """{name: tensor} moved to the CPU, where launch returns the ranks' tensors."""
    return {n: t.detach().cpu() for n, t in tensors.items()}
