"""Notebook 04's experiments with helpers.ddp, one module per section, all importable from here: correctness against
one process (ddp_equivalence), speed (ddp_speed), overlap (ddp_overlap), the bucket-size model vs the sweep
(ddp_buckets) and `python -m helpers bench ddp` (ddp_bench); here the profiles and the speed plan. The tests call the
same functions.

    checks = check_equivalence("toy", toy_variants(), backend="gloo", device="cpu")   # one row per variant
    raw, speed = speed_table(["small/cpu"], sweep_model="small/cpu", buckets_mb=[1, 25], steps=10, warmup=3,
                             batch_size=8, context_length=64, backend="gloo", device="cpu")
    overlap = overlap_table(raw["small/cpu"], ["naive", "per_parameter"], traced=True)
    sweep, fit = bucket_sweep(speed, "small/cpu", alpha_s=1e-4, beta_Bps=1e9)   # measured vs modelled step time

    python -m helpers bench ddp [--model small/cpu --bucket-mb 1 --steps 30]   # DDPBucketed vs torch DDP, gloo, 2 ranks
"""

from __future__ import annotations

from helpers import formulas
from helpers.experiments.common import make_batches, make_model, make_optimizer
from helpers.experiments.ddp_bench import BenchRun, bench_main, bench_worker
from helpers.experiments.ddp_buckets import (
    BucketModel,
    alpha_beta,
    bucket_sweep,
    describe_bucket_model,
    plot_bucket_sweep,
    sweep_display,
    sweep_optimum_text,
)
from helpers.experiments.ddp_equivalence import (
    EPS32,
    EQUIVALENCE,
    EquivalenceRun,
    GradientCheck,
    assert_equivalent,
    bucket_mb_for,
    check_equivalence,
    equivalence_rows,
    equivalence_worker,
    gradient_bound,
    gradient_checks,
    reference_gradients,
    reference_training,
    toy_variants,
    transformer_variants,
    worst_element,
)
from helpers.experiments.ddp_overlap import overlap_fraction, overlap_table, plot_timelines, shown_variants
from helpers.experiments.ddp_speed import (
    SPEED_VARIANTS,
    SpeedRun,
    StepIntervals,
    backward_lines,
    fastest_text,
    paired_variants,
    ratio_rows,
    speed_lines,
    speed_pivot,
    speed_table,
    speed_worker,
    step_intervals,
    summarize_speed,
    sweep_variants,
    traced_steps,
)
from helpers.model import count_parameters

__all__ = [  # what notebook 04, the tests and helpers.course import from here
    "EPS32",
    "EQUIVALENCE",
    "PROFILES",
    "SPEED_VARIANTS",
    "BenchRun",
    "BucketModel",
    "EquivalenceRun",
    "GradientCheck",
    "SpeedRun",
    "StepIntervals",
    "alpha_beta",
    "assert_equivalent",
    "backward_lines",
    "bench_main",
    "bench_worker",
    "bucket_mb_for",
    "bucket_sweep",
    "check_equivalence",
    "describe_bucket_model",
    "equivalence_rows",
    "equivalence_worker",
    "fastest_text",
    "gradient_bound",
    "gradient_checks",
    "make_batches",
    "make_model",
    "make_optimizer",
    "overlap_fraction",
    "overlap_table",
    "paired_variants",
    "plan_speed",
    "plot_bucket_sweep",
    "plot_timelines",
    "ratio_rows",
    "reference_gradients",
    "reference_training",
    "shown_variants",
    "speed_lines",
    "speed_pivot",
    "speed_table",
    "speed_worker",
    "step_intervals",
    "summarize_speed",
    "sweep_display",
    "sweep_optimum_text",
    "sweep_variants",
    "toy_variants",
    "traced_steps",
    "transformer_variants",
    "worst_element",
]


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

    def round_s(extra):  # one round of every variant, plus `extra` swept bucket sizes of the sweep model
        return sum(n * variant_step(m) for m, n in variants.items()) + extra * variant_step(sweep_model)

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
