"""Notebook 04's experiments with helpers.ddp, one module per section, all importable from here: correctness against
one process (ddp_equivalence), speed (ddp_speed), overlap (ddp_overlap), the bucket-size model vs the sweep
(ddp_buckets), `python -m helpers bench ddp` (ddp_bench), and the sections the notebook's cells call, each returning
one Result, with the profiles and the speed plan (ddp_sections). The tests call the same functions.

    s = setting("cpu", "auto")                      # what the notebook's cells call: one Result per section
    speed = speed_section(s)

    checks = check_equivalence("toy", toy_variants(), backend="gloo", device="cpu")   # one row per variant
    raw, speed = speed_table(["small/cpu"], sweep_model="small/cpu", buckets_mb=[1, 25], steps=10, warmup=3,
                             batch_size=8, context_length=64, backend="gloo", device="cpu")
    overlap = overlap_table(raw["small/cpu"], ["naive", "per_parameter"], traced=True)
    sweep, fit = bucket_sweep(speed, "small/cpu", alpha_s=1e-4, beta_Bps=1e9)   # measured vs modelled step time

    python -m helpers bench ddp [--model small/cpu --bucket-mb 1 --steps 30]   # DDPBucketed vs torch DDP, gloo, 2 ranks
"""

from __future__ import annotations

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
from helpers.experiments.ddp_sections import (
    PROFILES,
    SEED_BUCKETS_MB,
    BucketResult,
    Setting,
    SpeedResult,
    alpha_beta_section,
    backward_section,
    bucket_section,
    config_for,
    correctness_section,
    optimum_is_minimal,
    overlap_section,
    plan_speed,
    ratios_section,
    setting,
    speed_section,
    speed_variants,
)
from helpers.experiments.ddp_speed import (
    SPEED_VARIANTS,
    SpeedRun,
    StepIntervals,
    backward_lines,
    fastest_text,
    paired_variants,
    ratio_rows,
    shown_labels,
    speed_lines,
    speed_pivot,
    speed_table,
    speed_worker,
    step_intervals,
    summarize_speed,
    sweep_variants,
    traced_steps,
)

__all__ = [  # what notebook 04, the tests and helpers.course import from here
    "EPS32",
    "EQUIVALENCE",
    "PROFILES",
    "SEED_BUCKETS_MB",
    "SPEED_VARIANTS",
    "BenchRun",
    "BucketModel",
    "BucketResult",
    "EquivalenceRun",
    "GradientCheck",
    "Setting",
    "SpeedResult",
    "SpeedRun",
    "StepIntervals",
    "alpha_beta",
    "alpha_beta_section",
    "assert_equivalent",
    "backward_lines",
    "backward_section",
    "bench_main",
    "bench_worker",
    "bucket_mb_for",
    "bucket_section",
    "bucket_sweep",
    "check_equivalence",
    "correctness_section",
    "describe_bucket_model",
    "equivalence_rows",
    "equivalence_worker",
    "fastest_text",
    "gradient_bound",
    "gradient_checks",
    "make_batches",
    "make_model",
    "make_optimizer",
    "optimum_is_minimal",
    "overlap_fraction",
    "overlap_section",
    "overlap_table",
    "paired_variants",
    "plan_speed",
    "plot_bucket_sweep",
    "plot_timelines",
    "ratio_rows",
    "ratios_section",
    "reference_gradients",
    "reference_training",
    "config_for",
    "speed_variants",
    "setting",
    "shown_labels",
    "shown_variants",
    "speed_lines",
    "speed_pivot",
    "speed_section",
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
