"""Notebook 05 §1-2: each kind trained on the same batches (equivalence_worker) and checkpointed (checkpoint_worker),
and the tables of what they return: same weights and gradients as unsharded, the collectives' bytes vs the formulas.

    per_rank = launch(partial(equivalence_worker, model="small/cpu", kinds=list(KINDS), steps=3, batch_size=8,
                              context_length=64), 2)             # per rank: {kind: KindRun}
    table = equivalence_table(per_rank)                          # same weights / same gradients, state, calls
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch

from helpers import formulas as F
from helpers.comm import count_collectives
from helpers.experiments.common import (
    cpu_state,
    make_batches,
    rank_share,
    train_step,
)
from helpers.experiments.sharding_build import build, forward_backward, optimizer_state_bytes
from helpers.formulas import MiB
from helpers.model import count_parameters
from helpers.sharding import Zero1Optimizer, _rank_world


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
