"""Notebook 07 §1: is FSDP's gradient the one process's on the whole batch? Each rank trains on its rows
(equivalence_worker); one process recomputes the gradients from the same weights (reference_grads) and a bound
derived from the sums' magnitudes (bound) says how far apart rounding may put them (equivalence_table)."""

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
