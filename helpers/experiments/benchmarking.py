"""Notebook 01's experiments: a step's time per model size with and without warm-up (here), where the time goes
(profiler tables and stacks, here; softmax against attention's matmuls, benchmarking_attention), mixed precision
(benchmarking_precision), memory (benchmarking_memory) and FLOPs/MFU (here); what the sections share is in
benchmarking_common. Every name is importable from here. Table builders return DataFrames, plots return the figure,
summaries return text; the notebook and tests/test_{profiling,memory}.py call them.

    times = time_sizes(SIZES, 4, 64, runs=[dict(warmup=0, steps=3), dict(warmup=2, steps=4)])   # one row per pass
    print(warmup_summary(times, warmup=2, cold_steps=3))    # what the first (cold) step costs
    accumulation_demo()                                     # 0.01 summed 1000 times in four precisions
    traces = step_traces(lm, opt, x, y)                     # {"forward": MemoryTrace, "full step": MemoryTrace}
    breakdown_table(traces["full step"], lm, opt, x, y)     # analytic vs measured bytes live at the peak
    flops_table({"small": 0.024}, 16, 128, "NVIDIA H100 80GB HBM3", "tf32")   # FLOPs, FLOP/s, MFU per size
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from helpers import formulas
from helpers.experiments.benchmarking_attention import AttentionParts, attention_flops, attention_parts
from helpers.experiments.benchmarking_common import (
    NOT_TIMED,
    PASSES,
    SEED,
    SEED_H100,
    MiB,
    forward_step,
    guarded,
    pass_fn,
    precision_name,
    step_estimate,
    warm_cold,
)
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
    profiled_config,
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
from helpers.experiments.gpu_plans_bytes import card_note, in_place_of, step_peak_bytes
from helpers.model import build_model, random_batch, sizes_for
from helpers.profiling import class_shares
from helpers.timing import Timing, benchmark, compare, paired_ratio, ratio_columns

__all__ = [  # what notebook 01, the tests and helpers.course import from here
    "ACCUMULATION_CASES",
    "ACTIVATIONS_ROW",
    "AttentionParts",
    "CPU_CONTEXT",
    "EDITIONS",
    "EditionPlan",
    "FLOPS_FORMAT",
    "NOT_TIMED",
    "PASSES",
    "PEAK_FIXED_S",
    "PROFILES",
    "SEED",
    "SEED_H100",
    "TRACK_OVERHEAD",
    "MiB",
    "MixedPrecisionToyModel",
    "accumulation_demo",
    "attention_flops",
    "attention_parts",
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
    "profiled_config",
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
CPU_CONTEXT = 4  # the cpu profile runs an edition's contexts ÷ 4, as its presets are a quarter of the width


@dataclass(frozen=True)
class EditionPlan:
    """What notebook 01 measures for one edition's handout: its batch and context (the gpu profile's; the cpu one runs
    context ÷ CPU_CONTEXT), the passes its benchmarking_script times, the model memory_profiling profiles and at which
    contexts (None: every size at the batch's context, as 2024 asks), and the size profiled in sections 2, 3 and 5."""

    edition: str
    batch: int
    context: int
    kinds: tuple[str, ...] = PASSES
    memory_size: str | None = None
    memory_contexts: tuple[int, ...] = ()
    profile_size: str = "xl"  # the gpu profile's; the cpu profile profiles its edition's medium/cpu

    def suffix(self) -> str:
        """The edition's size-name suffix (model.EDITION_SIZES): "" for 2024, "-2026" after."""
        return "" if self.edition == "2024" else f"-{self.edition}"

    def for_profile(self, profile: str) -> dict:
        """Batch, context, profiled size, memory size and contexts as `profile` runs them."""
        cpu = profile == "cpu"
        scale = (lambda t: t // CPU_CONTEXT) if cpu else (lambda t: t)
        memory = self.memory_size and (f"{self.memory_size}/cpu" if cpu else self.memory_size)
        return dict(
            batch=PROFILES[profile]["batch"] if self.edition == "2024" else self.batch,
            context=PROFILES[profile]["context"] if self.edition == "2024" else scale(self.context),
            profile_size=f"medium{self.suffix()}/cpu" if cpu else self.profile_size,
            memory_size=memory,
            memory_contexts=tuple(scale(t) for t in self.memory_contexts),
        )

    def profiled_on(self, profile: str, gpu_bytes: float | None = None) -> tuple[str, list[str]]:
        """The size sections 2, 3 and 5 profile (not guarded) on a card of gpu_bytes, and the note saying what the card
        left out ([] where nothing): the profile's size, or where the card cannot hold its full step with AdamW
        (gpu_plans_bytes.step_peak_bytes at the edition's batch and context), the edition's largest smaller size that
        it holds (its smallest if none: the fit summary then warns). None: no card known, the profile's size."""
        e = self.for_profile(profile)
        size, B, T = e["profile_size"], e["batch"], e["context"]
        instead = in_place_of(size, sizes_for(profile, self.edition), lambda s: step_peak_bytes(s, B, T), gpu_bytes)
        if instead == size:
            return size, []
        note = card_note(f"{size}'s profiled step (AdamW, batch {B} × {T})", step_peak_bytes(size, B, T), gpu_bytes,
                         f"{instead} profiled in its place (sections 2, 3 and 5)")  # fmt: skip
        return instead, [note]


EDITIONS = {  # each handout's benchmarking_script and memory_profiling settings
    "2024": EditionPlan("2024", batch=16, context=128),  # the seed's H100 runs: 16 × 128
    # 2025: batch 4 (§1.1.2); benchmarking_script names no context: 128, the first of nsys_profile's 128-1024; memory
    # profiling: the 2.7B at 128, 256 and 512
    "2025": EditionPlan(
        "2025", 4, 128, memory_size="2.7B-2025", memory_contexts=(128, 256, 512), profile_size="xl-2025"
    ),
    # 2026: batch 4 at context 512 (§2.1.2); the script times the optimizer step too; memory: the xl at 128 and 2048.
    # Its xl has the 2.7B's shape: profiled with AdamW at 4 × 512 it needs ~75 GB of an 80 GB H100, so large is profiled
    "2026": EditionPlan(
        "2026",
        4,
        512,
        PASSES + ("step",),
        memory_size="xl-2026",
        memory_contexts=(128, 2048),
        profile_size="large-2026",
    ),
}


# --- 1 · timing one model per size ----------------------------------------------------------------


def time_size(
    size,
    batch_size: int,
    context_length: int,
    warmup: int,
    steps: int,
    device=None,
    kinds=PASSES,
    autocast_dtype=None,
) -> list[dict]:
    """One row per pass of `size`: timing stats and the first sample, or status "OOM".

    Warm runs (warmup > 0) time every pass on ONE model, interleaved in one loop (forward, backward, both, then
    reversed), so load hits all alike and forward <= forward+backward can be checked on paired samples: the forward
    row carries its time over "both"'s, paired per round (ratio columns); "step" (with AdamW) follows in a loop of
    its own on the same model. Cold runs (warmup 0) build a fresh model per
    pass, so each pass's first call is that model's first."""

    def build():
        lm = build_model(size, device=device)
        return lm, *random_batch(lm.cfg, batch_size, context_length, device=device)

    def cold(kind):  # {kind: Timing}
        fn = pass_fn(*build(), kind, autocast_dtype)
        return benchmark(fn, warmup=0, steps=steps, device=device, label=f"{size} {kind}")

    def warm():  # {kind: Timing}: forward, backward and both from one interleaved loop, then the full step
        lm, x, y = build()
        fns = {kind: pass_fn(lm, x, y, kind, autocast_dtype) for kind in kinds if kind != "step"}
        comp = compare(fns, steps=steps, warmup=warmup, device=device)
        del fns  # frees the graph "backward" re-runs: AdamW's in-place update below would invalidate it
        samples = dict(comp.samples)
        if "step" in kinds:  # on the same model, after: no second copy of it on the card
            samples["step"] = compare(
                {"step": pass_fn(lm, x, y, "step", autocast_dtype)}, steps, warmup, device
            ).samples["step"]
        return {kind: Timing(samples[kind], warmup, comp.device, f"{size} {kind}") for kind in kinds}

    if warmup:
        timings = guarded(warm)
        timings = {kind: "OOM" for kind in kinds} if timings == "OOM" else timings
    else:
        timings = {kind: guarded(functools.partial(cold, kind)) for kind in kinds}
    rows = []
    for kind in kinds:
        t = timings[kind]
        row = {"size": size, "pass": kind, "warm-up": warmup, "precision": precision_name(autocast_dtype)}
        if t == "OOM":
            row.update({"mean_s": None, "median_s": None, "std_s": None, "status": "OOM"})
        else:
            row.update(
                {**t.as_row(), "p25_s": float(np.percentile(t.samples, 25)), "first_s": t.samples[0], "status": "ok"}
            )
            if not warmup:  # what 1 and 2 warm-up steps would have timed: the mean of the steps after them
                row.update({f"after_{w}_s": float(np.mean(t.samples[w:])) for w in (1, 2) if len(t.samples) > w})
            both = timings.get("both")
            if warmup and kind != "both" and both not in (None, "OOM"):
                row.update({f"{k}_vs_both": v for k, v in ratio_columns(paired_ratio(t.samples, both.samples)).items()})
        rows.append(row)
    return rows


def time_sizes(sizes, batch_size: int, context_length: int, runs: list[dict], device=None) -> pd.DataFrame:
    """time_size for every size and every run (a dict of its keyword arguments: warmup, steps, kinds,
    autocast_dtype)."""
    return pd.DataFrame(
        [
            row
            for size in sizes
            for run in runs
            for row in time_size(size, batch_size, context_length, device=device, **run)
        ]
    )


def plan_timing(
    budget,
    sizes,
    batch_size: int,
    context_length: int,
    warmup: int,
    steps: int,
    cold_steps: int,
    run=None,
    kinds=PASSES,
):
    """Section 1's sizes within the budget (the smallest always): per size a cold run of each pass (forward 1/3 of a
    step, backward 2/3 plus the forward of its graph, both 1, step about 1.2: AdamW's elementwise update) and a warm
    interleaved run of them."""
    per_round = 2 + 1.2 * ("step" in kinds)  # forward + backward + both (+ step), in forward+backward steps

    def cost(size):
        t = step_estimate(size, batch_size, context_length, budget.calibration)
        return (cold_steps + warmup + steps) * per_round * t + 2 * t / 3

    return budget.fit(sizes, cost, what="section 1 timing at", keep_first=True, run=run)


def plot_timing(times: pd.DataFrame, warmup: int, title: str = ""):
    """Mean ± std per size, one panel per pass, cold (no warm-up) and warm; returns the figure."""
    kinds = [k for k in (*PASSES, "step") if k in set(times["pass"])]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.4 * len(kinds), 3.5))
    for ax, kind in zip(axes, kinds, strict=True):
        for w, marker in ((0, "o"), (warmup, "s")):
            sel = times[(times["pass"] == kind) & (times["warm-up"] == w) & (times["status"] == "ok")]
            ax.errorbar(
                sel["size"],
                sel["mean_s"] * 1e3,
                yerr=sel["std_s"] * 1e3,
                marker=marker,
                capsize=3,
                label=f"warm-up {w}",
            )
        ax.set(title=kind, xlabel="model size", ylabel="mean time (ms) ± std", yscale="log")
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def warmup_summary(times: pd.DataFrame, warmup: int, cold_steps: int) -> str:
    """What the first step without warm-up costs against warm steps, and whether that stands above the noise."""
    cold, warm = warm_cold(times, warmup)
    first_ratio = cold["first_s"] / warm["median_s"]
    std_ratio = (cold["std_s"] / cold["mean_s"]) / (warm["std_s"] / warm["mean_s"])
    worst, noise = first_ratio.idxmax(), (warm["std_s"] / warm["mean_s"]).median()
    rest = ((cold["mean_s"] * cold_steps - cold["first_s"]) / (cold_steps - 1) / warm["mean_s"]).median()
    text = (
        f"Without warm-up the first step costs {first_ratio.median():.1f}x the warm median (median over sizes and "
        f"passes; worst {first_ratio.max():.1f}x for {worst[0]} {worst[1]}); the cold mean is "
        f"{(cold['mean_s'] / warm['mean_s']).median():.2f}x the warm mean and its relative spread "
        f"{std_ratio.median():.1f}x the warm one.\nLeaving out the first step, cold runs are {rest:.2f}x the warm "
        f"mean; warm runs vary by {noise:.0%} (std/mean, median).\n"
    )
    if first_ratio.median() <= 1 + 2 * noise:
        return text + (
            "Here the first-step cost is within the step-to-step noise: the machine was busy (other processes "
            "share its cores), so re-run this section on a quiet machine to see it clearly."
        )
    text += "So the first call pays a one-time cost. "
    if abs(rest - 1) <= 2 * noise:
        return text + (
            f"Without it, the cold runs' steps are {rest:.2f}x the warm mean, inside the warm runs' "
            f"±{2 * noise:.0%} (2 std/mean): no measurable difference between cold and warm steps here."
        )
    return text + (
        f"Without it, the cold runs' steps are still {rest:.2f}x the warm mean, outside the warm runs' "
        f"±{2 * noise:.0%} (2 std/mean): more than the first call differs between the two runs on this "
        "machine (load changed between them, or later calls still warm up), so no 'same cost' is claimed."
    )


def check_forward_le_both(times: pd.DataFrame, warmup: int) -> str:
    """Assert forward <= forward+backward per size for the warm runs, on paired samples: the two are timed in one
    interleaved loop on one model, so the median of forward_i / both_i over rounds compares steps that shared the
    machine's load (separate loops flipped under load). Returns the sentence saying so."""
    fwd = warm_cold(times, warmup)[1].xs("forward", level="pass")
    bad = fwd[fwd["ratio_low_vs_both"] > 1]  # measurably slower: the paired ratio's 95% interval above 1
    assert bad.empty, f"forward measurably slower than forward+backward (paired ratios) for {list(bad.index)}"
    return (
        f"forward <= forward+backward for every size: forward takes {fwd['ratio_vs_both'].min():.2f}x to "
        f"{fwd['ratio_vs_both'].max():.2f}x of forward+backward (median of ratios paired per round, "
        f"{int(fwd['pairs_vs_both'].min())}+ pairs)"
    )


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
