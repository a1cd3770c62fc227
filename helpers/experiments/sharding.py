"""Notebook 05's experiments with helpers.sharding, one module per section, all importable from here: the kinds and
their builder (sharding_build), equivalence and checkpoints (sharding_equivalence), memory at each point
(sharding_memory), speed (sharding_speed), and the sections the notebook's cells call, each returning one Result,
with the profiles and the speed plan (sharding_sections); here the partition and ZeRO tables, and
`python -m helpers bench sharding`. Workers take keyword arguments and return dataclasses; ranks return, the parent
prints. The tests call the same functions.

    model, grad_sync, opt = build("sharded", "small/cpu")          # kinds: KINDS and "torch_zero"
    per_rank = launch(partial(equivalence_worker, model="small/cpu", kinds=list(KINDS), steps=3, batch_size=8,
                              context_length=64), 2)             # per rank: {kind: KindRun}
    table = equivalence_table(per_rank)                          # same weights / same gradients, state, calls
    per_rank = launch(partial(run_all, [partial(memory_worker, model="xl/cpu", kinds=["unsharded", "sharded"],
                                                batch_size=8, context_length=128, steps=2)]), 2)
    mem = memory_frame(per_rank); breakdown = memory_breakdown(per_rank)   # measured vs formulas.live_bytes

    python -m helpers bench sharding [--model small/cpu --steps 30]  # vs torch's ZeroRedundancyOptimizer, gloo, 2 ranks
"""

from __future__ import annotations

import functools

import pandas as pd

from helpers import formulas as F
from helpers import launch as L
from helpers.experiments.common import bench_parser, make_batches, make_model
from helpers.experiments.sharding_build import (
    KINDS,
    OPTIMIZERS,
    build,
    forward_backward,
    optimizer_state_bytes,
    param_groups,
    run_all,
)
from helpers.experiments.sharding_equivalence import (
    Checkpoint,
    KindRun,
    _by_op,
    _same,
    averaged_grads,
    checkpoint_worker,
    collectives_table,
    equivalence_table,
    equivalence_worker,
)
from helpers.experiments.sharding_memory import (
    CALC_TOL,
    PEAK_TOL,
    MemoryPoint,
    MemoryRun,
    _memory_runs,
    _storage_bytes,
    calculator_table,
    memory_breakdown,
    memory_frame,
    memory_summary,
    memory_table,
    memory_worker,
    whole_tensor_slack,
)
from helpers.experiments.sharding_sections import (
    CHECK_KINDS,
    MEMORY_KINDS,
    PROFILES,
    CheckResult,
    MemoryResult,
    Setting,
    SpeedResult,
    breakdown_section,
    collectives_section,
    config_for,
    correctness_section,
    memory_section,
    plan_speed_steps,
    ratios_section,
    setting,
    speed_section,
)
from helpers.experiments.sharding_speed import (
    SPEED_NAMES,
    SpeedRun,
    compare_text,
    iteration_samples,
    paired_iterations,
    ratio_rows,
    speed_runs,
    speed_summary,
    speed_table,
    speed_worker,
    summarize_speed,
)
from helpers.formulas import zero_memory
from helpers.sharding import _rank_world

__all__ = [  # what notebook 05, the tests, helpers.course and the fsdp experiments import from here
    "CALC_TOL",
    "CHECK_KINDS",
    "KINDS",
    "MEMORY_KINDS",
    "OPTIMIZERS",
    "PEAK_TOL",
    "PROFILES",
    "SPEED_NAMES",
    "CheckResult",
    "Checkpoint",
    "KindRun",
    "MemoryPoint",
    "MemoryResult",
    "MemoryRun",
    "Setting",
    "SpeedRun",
    "SpeedResult",
    "_by_op",
    "_memory_runs",
    "_rank_world",
    "_same",
    "_storage_bytes",
    "averaged_grads",
    "bench_main",
    "breakdown_section",
    "build",
    "calculator_table",
    "checkpoint_worker",
    "collectives_section",
    "config_for",
    "collectives_table",
    "compare_text",
    "correctness_section",
    "equivalence_table",
    "equivalence_worker",
    "forward_backward",
    "iteration_samples",
    "make_batches",
    "make_model",
    "memory_breakdown",
    "memory_frame",
    "memory_section",
    "memory_summary",
    "memory_table",
    "memory_worker",
    "optimizer_state_bytes",
    "paired_iterations",
    "param_groups",
    "partition_balance",
    "plan_speed_steps",
    "ratio_rows",
    "ratios_section",
    "run_all",
    "setting",
    "speed_runs",
    "speed_section",
    "speed_summary",
    "speed_table",
    "speed_worker",
    "summarize_speed",
    "whole_tensor_slack",
    "zero_plot",
    "zero_table",
]


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
            loads = [sum(s for s, r in zip(sizes, owner, strict=True) if r == k) for k in range(world)]
            rows.append({"model": name, "partition": how, "worst rank / (Ψ/N)": max(loads) / (sum(sizes) / world)})
        # largest first to the least-loaded rank: the rank that ends worst got its last tensor while it was the least
        # loaded (≤ Ψ/N), so it ends within one tensor of the mean: worst ≤ Ψ/N + largest
        rows.append(
            {"model": name, "partition": "bound, by bytes", "worst rank / (Ψ/N)": 1 + world * max(sizes) / sum(sizes)}
        )
    return pd.DataFrame(rows).pivot(index="model", columns="partition", values="worst rank / (Ψ/N)").loc[models]


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
