"""Notebook 01 §1: a step's time per model size, cold (no warm-up, a fresh model per pass) and warm (the three passes
interleaved on one model), what the first step costs, and the helpers every section shares (one pass of a model, an
out-of-memory guard, the precision column, a step's estimated seconds for the budget).

    times = time_sizes(SIZES, 4, 64, runs=[dict(warmup=0, steps=3), dict(warmup=2, steps=4)])   # one row per pass
    print(warmup_summary(times, warmup=2, cold_steps=3))    # what the first (cold) step costs
"""

from __future__ import annotations

import contextlib
import functools

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from helpers import formulas
from helpers.model import build_model, lm_loss, random_batch
from helpers.timing import Timing, benchmark, compare, paired_ratio, ratio_columns

MiB = 2**20


NOT_TIMED = "not timed here (budget)"


def forward_step(lm, x, autocast_dtype=None):
    """Forward pass only, no graph (inference), optionally under autocast."""
    ctx = torch.autocast(x.device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with torch.no_grad(), ctx:
        return lm(x)


def guarded(fn):
    """fn(), or the string "OOM" when the GPU runs out of memory (the cache is emptied so the run goes on)."""
    try:
        return fn()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return "OOM"


def precision_name(autocast_dtype) -> str:
    """The precision column of every table here: fp32, or "autocast bfloat16" / "autocast float16"."""
    return "fp32" if autocast_dtype is None else f"autocast {str(autocast_dtype)[6:]}"


def pass_fn(lm, x, y, kind: str, autocast_dtype=None):
    """A callable for one pass of `lm`: "forward" (building the graph), "backward" (re-run on one retained graph)
    or "both"; the forward runs under autocast when `autocast_dtype` is given."""

    def loss():
        ctx = torch.autocast(x.device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
        with ctx:
            return lm_loss(lm(x), y)

    if kind == "forward":
        return loss
    if kind == "backward":
        graph = loss()  # one graph: backward alone is timed
        return lambda: graph.backward(retain_graph=True)
    if kind == "both":
        return lambda: loss().backward()
    raise ValueError(f"kind={kind!r}: use 'forward', 'backward' or 'both'")


def time_size(
    size,
    batch_size: int,
    context_length: int,
    warmup: int,
    steps: int,
    device=None,
    kinds=("forward", "backward", "both"),
    autocast_dtype=None,
) -> list[dict]:
    """One row per pass of `size`: timing stats and the first sample, or status "OOM".

    Warm runs (warmup > 0) time every pass on ONE model, interleaved in one loop (forward, backward, both, then
    reversed), so load hits all alike and forward <= forward+backward can be checked on paired samples: the forward
    row carries its time over "both"'s, paired per round (ratio columns). Cold runs (warmup 0) build a fresh model per
    pass, so each pass's first call is that model's first."""

    def build():
        lm = build_model(size, device=device)
        return lm, *random_batch(lm.cfg, batch_size, context_length, device=device)

    def cold(kind):  # {kind: Timing}
        fn = pass_fn(*build(), kind, autocast_dtype)
        return benchmark(fn, warmup=0, steps=steps, device=device, label=f"{size} {kind}")

    def warm():  # {kind: Timing}, every kind's samples from one interleaved loop
        lm, x, y = build()
        comp = compare(
            {kind: pass_fn(lm, x, y, kind, autocast_dtype) for kind in kinds}, steps=steps, warmup=warmup, device=device
        )
        return {kind: Timing(s, warmup, comp.device, f"{size} {kind}") for kind, s in comp.samples.items()}

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


def step_estimate(size, batch_size: int, context_length: int, cal, bf16: bool = False, fp32_s=None) -> float:
    """Seconds of one forward+backward of `size` (Calibration.step_s of its training FLOPs): fp32_s when measured."""
    return cal.step_s(formulas.train_flops(size, batch_size, context_length), bf16=bf16, fp32_s=fp32_s)


def plan_timing(
    budget, sizes, batch_size: int, context_length: int, warmup: int, steps: int, cold_steps: int, run=None
):
    """Section 1's sizes within the budget (the smallest always): per size a cold run of each pass (forward 1/3 of a
    step, backward 2/3 plus the forward of its graph, both 1) and a warm interleaved run of the three."""

    def cost(size):
        t = step_estimate(size, batch_size, context_length, budget.calibration)
        return cold_steps * 2 * t + t / 3 + (warmup + steps) * 2 * t + t / 3

    return budget.fit(sizes, cost, what="section 1 timing at", keep_first=True, run=run)


def plot_timing(times: pd.DataFrame, warmup: int, title: str = ""):
    """Mean ± std per size, one panel per pass, cold (no warm-up) and warm; returns the figure."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
    for ax, kind in zip(axes, ("forward", "backward", "both"), strict=True):
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


def warm_cold(times: pd.DataFrame, warmup: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The runs that fit, indexed by (size, pass): (cold, without warm-up; warm, after `warmup` steps)."""
    ok = times[times["status"] == "ok"].set_index(["size", "pass", "warm-up"])
    return ok.xs(0, level="warm-up"), ok.xs(warmup, level="warm-up")


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
