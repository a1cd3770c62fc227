"""Notebook 05 §4: every kind timed step by step in one interleaved loop (speed_worker), and the tables and sentences
built from it: where an iteration's time goes, and each "A vs B" as a paired ratio with its interval.

    per_launch = speed_runs([["unsharded", "sharded", "zero1", "torch_zero"]], model="small/cpu", steps=6, warmup=2,
                            batch_size=8, context_length=64, world=2, backend="gloo", device="cpu")
    print(speed_summary(speed_table(per_launch), per_launch))
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from helpers import launch as L
from helpers.experiments.common import (
    cpu_state,
    make_batches,
    rank_share,
    slowest_rank,
    train_step,
)
from helpers.experiments.sharding_build import build, optimizer_state_bytes
from helpers.timing import Ratio, interleaved, paired_ratio, pairwise_ratios, verdict


@dataclass
class SpeedRun:
    """speed_worker's result on one rank: per kind the per-step phase seconds, the state bytes, equal final weights."""

    samples: dict  # kind -> [{"fwd_bwd", "grad_comm", "step", "step_comm"}]
    state_bytes: dict  # kind -> bytes
    same_weights: dict  # kind -> bool (vs the first kind)


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


def summarize_speed(per_rank: list[SpeedRun]) -> list[dict]:
    """One row per kind: medians over steps of the slowest rank's seconds per iteration, in step(), and communicating
    in step() (each step waits for its slowest rank)."""
    rows = []
    for kind in per_rank[0].samples:
        med = {
            k: float(np.median(slowest_rank([[s[k] for s in r.samples[kind]] for r in per_rank])))
            for k in ("fwd_bwd", "grad_comm", "step", "step_comm")
        }
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
