"""Notebook 01's experiments, one module per section, all importable from here: a step's time per model size with and
without warm-up (benchmarking_timing), mixed precision (benchmarking_precision), memory (benchmarking_memory); here
the profiles, where the time goes (profiler tables and stacks) and FLOPs/MFU. Table builders return DataFrames, plots
return the figure, summaries return text; the notebook and tests/test_{profiling,memory}.py call them.

    times = time_sizes(SIZES, 4, 64, runs=[dict(warmup=0, steps=3), dict(warmup=2, steps=4)])   # one row per pass
    print(warmup_summary(times, warmup=2, cold_steps=3))    # what the first (cold) step costs
    accumulation_demo()                                     # 0.01 summed 1000 times in four precisions
    traces = step_traces(lm, opt, x, y)                     # {"forward": MemoryTrace, "full step": MemoryTrace}
    breakdown_table(traces["full step"], lm, opt, x, y)     # analytic vs measured bytes live at the peak
    flops_table({"small": 0.024}, 16, 128, "NVIDIA H100 80GB HBM3", "tf32")   # FLOPs, FLOP/s, MFU per size
"""

from __future__ import annotations

import math

import pandas as pd

from helpers import formulas
from helpers.experiments.benchmarking_memory import (
    ACTIVATIONS_ROW,
    PEAK_FIXED_S,
    TRACK_OVERHEAD,
    breakdown_table,
    offloaded,
    peak_rows,
    peak_summary,
    plan_peaks,
    planned_peaks,
    plot_timelines,
    step_peaks,
    step_traces,
)
from helpers.experiments.benchmarking_precision import (
    ACCUMULATION_CASES,
    MixedPrecisionToyModel,
    accumulation_demo,
    accumulation_text,
    autocast_dtype_table,
    autocast_dtypes,
    compare_precisions,
    mean_square_errors,
    plan_precision,
    planned_precisions,
    precision_ratios,
    same_quantity_note,
    speedup_lines,
    speedup_table,
)
from helpers.experiments.benchmarking_timing import (
    NOT_TIMED,
    MiB,
    check_forward_le_both,
    forward_step,
    guarded,
    pass_fn,
    plan_timing,
    plot_timing,
    precision_name,
    step_estimate,
    time_size,
    time_sizes,
    warm_cold,
    warmup_summary,
)
from helpers.profiling import class_shares

__all__ = [  # what notebook 01, the tests and helpers.course import from here
    "ACCUMULATION_CASES",
    "ACTIVATIONS_ROW",
    "FLOPS_FORMAT",
    "NOT_TIMED",
    "PEAK_FIXED_S",
    "PROFILES",
    "TRACK_OVERHEAD",
    "MiB",
    "MixedPrecisionToyModel",
    "accumulation_demo",
    "accumulation_text",
    "autocast_dtype_table",
    "autocast_dtypes",
    "breakdown_table",
    "check_forward_le_both",
    "class_share_table",
    "compare_precisions",
    "flame_rows",
    "flops_summary",
    "flops_table",
    "forward_step",
    "guarded",
    "mean_square_errors",
    "offloaded",
    "pass_fn",
    "peak_rows",
    "peak_summary",
    "plan_peaks",
    "plan_precision",
    "plan_timing",
    "planned_peaks",
    "planned_precisions",
    "plot_timelines",
    "plot_timing",
    "precision_name",
    "precision_ratios",
    "profile_rows",
    "profile_summary",
    "same_quantity_note",
    "speedup_lines",
    "speedup_table",
    "stage_shares",
    "step_estimate",
    "step_peaks",
    "step_traces",
    "time_size",
    "time_sizes",
    "warm_cold",
    "warmup_summary",
]

PROFILES = {  # notebook 01 per profile: batch x context, warm-up and timed steps, no-warm-up steps, the profiled size
    # the gpu batch at a quarter of its context, as the presets are a quarter of its width: T/d and activations per
    # parameter stay the reference's (notebook 00); 6 steps: timing.MIN_PAIRS
    "cpu": dict(batch=16, context=32, warmup=2, steps=6, cold_steps=3, profile_size="medium/cpu"),
    "gpu": dict(batch=16, context=128, warmup=5, steps=10, cold_steps=10, profile_size="xl"),  # the seed profiled xl
}


# --- 2, 3 · profiler tables and stacks ------------------------------------------------------------


def class_share_table(profs: dict) -> pd.DataFrame:
    """Share of profiled time per op class (matmul, elementwise/other), one row per profiled step."""
    return pd.DataFrame({name: class_shares(p) for name, p in profs.items()}).T


def profile_summary(tables: dict[str, pd.DataFrame], shares: pd.DataFrame) -> str:
    """The most expensive op of each profiled step, and how the matmuls' share moves from forward to the full step."""
    lines = [
        f"{name}: the most expensive op is {t.iloc[0]['op']} with {t.iloc[0]['share']:.1%} of the time, "
        f"{t.iloc[0]['ms/step']:.2f} ms and {t.iloc[0]['calls/step']:g} calls per step"
        for name, t in tables.items()
    ]
    mm = shares["matmul"]
    lines.append(
        f"Matrix multiplies take {mm['forward']:.0%} of a forward pass, {mm['forward+backward']:.0%} of "
        f"forward+backward and {mm['full step']:.0%} of the full step: the optimizer step, all elementwise, "
        f"moves {mm['forward+backward'] - mm['full step']:.0%} of the time away from matmuls."
    )
    return "\n".join(lines)


def profile_rows(tables: dict[str, pd.DataFrame], shares: pd.DataFrame) -> pd.DataFrame:
    """Every profiled step's op table in one tidy frame (column "run"), each row with its step's matmul share: what
    notebook 01 saves as 01_profile."""
    return pd.concat(
        [t.assign(run=name, matmul_share=shares.loc[name, "matmul"]) for name, t in tables.items()], ignore_index=True
    )


def stage_shares(stacks) -> pd.Series:
    """Share of the profiled step per stage (the stacks' roots: forward, backward, optimizer step)."""
    part = pd.Series({s[0]: 0.0 for s, _ in stacks})
    for s, v in stacks:
        part[s[0]] += v
    return (part / part.sum()).rename("share of the step")


def flame_rows(stacks, parts: dict[str, tuple[float, int]]) -> list[dict]:
    """Notebook 01 §3's shares as rows: each named part (its share, how many layers or calls) and each stage."""
    return [
        {"part": name, "kind": "part", "share": share, "count": count} for name, (share, count) in parts.items()
    ] + [
        {"part": stage, "kind": "stage", "share": share, "count": None} for stage, share in stage_shares(stacks).items()
    ]


# --- 6 · FLOPs and utilisation --------------------------------------------------------------------

FLOPS_FORMAT = {
    "matmul params N": "{:,}",
    "attention share": "{:.1%}",
    "GFLOPs/step": "{:.2f}",
    "fwd+bwd s": "{:.4f}",
    "achieved GFLOP/s": "{:.1f}",
    "MFU": "{:.1%}",
}


def flops_table(
    seconds: dict, batch_size: int, context_length: int, device_name: str, precision: str = "fp32"
) -> pd.DataFrame:
    """Per size (a key of `seconds`, its fwd+bwd time): training FLOPs, achieved FLOP/s and MFU against the peak."""
    rows = []
    for size, secs in seconds.items():
        f = formulas.forward_flops(size, batch_size, context_length)
        total = formulas.train_flops(size, batch_size, context_length)
        rows.append(
            {
                "size": size,
                "matmul params N": formulas.matmul_params(size),
                "attention share": f["attention"] / sum(f.values()),
                "GFLOPs/step": total / 1e9,
                "fwd+bwd s": secs,
                "achieved GFLOP/s": total / secs / 1e9,
                "MFU": formulas.mfu(total, secs, device_name, precision) or math.nan,
            }
        )  # nan: no peak known
    return pd.DataFrame(rows).set_index("size")


def flops_summary(flops: pd.DataFrame, device_name: str, precision: str) -> str:
    """The best achieved FLOP/s and MFU, or why MFU is not defined on this device."""
    peak = formulas.peak_flops(device_name, precision)
    best = flops["achieved GFLOP/s"].idxmax()
    return f"up to {flops['achieved GFLOP/s'].max():.1f} GFLOP/s ({best}), " + (
        f"MFU up to {flops['MFU'].max():.1%} of the {precision} peak {peak / 1e12:g} TFLOP/s"
        if peak
        else f"MFU is not defined here: no peak FLOP/s is known for '{device_name}' (the table covers NVIDIA GPUs)"
    )
