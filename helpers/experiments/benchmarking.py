"""Notebook 01's experiments: a step's time per model size (with and without warm-up), where the time goes, mixed
precision (speed, dtypes, accumulation), memory (tracked and analytic) and FLOPs/MFU. Table builders return
DataFrames, plots return the figure, summaries return text; the notebook and tests/test_{profiling,memory}.py call them.

    times = time_sizes(SIZES, 4, 64, runs=[dict(warmup=0, steps=3), dict(warmup=2, steps=4)])   # one row per pass
    print(warmup_summary(times, warmup=2, cold_steps=3))    # what the first (cold) step costs
    accumulation_demo()                                     # 0.01 summed 1000 times in four precisions
    traces = step_traces(lm, opt, x, y)                     # {"forward": MemoryTrace, "full step": MemoryTrace}
    breakdown_table(traces["full step"], lm, opt, x, y)     # analytic vs measured bytes live at the peak
    flops_table({"small": 0.024}, 16, 128, "NVIDIA H100 80GB HBM3", "tf32")   # FLOPs, FLOP/s, MFU per size
"""

from __future__ import annotations

import contextlib
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from helpers import formulas
from helpers.experiments.common import train_step
from helpers.memory import MemoryTrace, model_state, track
from helpers.model import build_model, lm_loss, random_batch
from helpers.profiling import class_shares
from helpers.timing import Timing, benchmark, compare, paired_ratio, pairwise_ratios, ratio_columns

MiB = 2**20
NOT_TIMED = "not timed here (budget)"
PROFILES = {  # notebook 01 per profile: batch x context, warm-up and timed steps, no-warm-up steps, the profiled size
    # the gpu batch at a quarter of its context, as the presets are a quarter of its width: T/d and activations per
    # parameter stay the reference's (notebook 00); 6 steps: timing.MIN_PAIRS
    "cpu": dict(batch=16, context=32, warmup=2, steps=6, cold_steps=3, profile_size="medium/cpu"),
    "gpu": dict(batch=16, context=128, warmup=5, steps=10, cold_steps=10, profile_size="xl"),  # the seed profiled xl
}


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


# --- 1 · timing one model per size ----------------------------------------------------------------


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
        timings = {kind: guarded(lambda: cold(kind)) for kind in kinds}
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
    """time_size for every size and every run (a dict of its keyword arguments: warmup, steps, kinds, autocast_dtype)."""
    return pd.DataFrame(
        [
            row
            for size in sizes
            for run in runs
            for row in time_size(size, batch_size, context_length, device=device, **run)
        ]
    )


# --- the cpu profile's time budget (helpers.budget): what each section costs, and its plan ---------------------

TRACK_OVERHEAD = 1.5  # memory.track's dispatch mode runs Python per op; PEAK_FIXED_S: the model, first calls. Planning
PEAK_FIXED_S = 1.0  # estimates from one run (step_peaks on one thread: small/cpu 1.5 s, large/cpu 3.0x a step)


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


def plan_precision(
    budget, sizes, batch_size: int, context_length: int, warmup: int, steps: int, fp32_s: dict, run=None
):
    """Section 4's sizes within the budget (the smallest always: the question is answered at one size at least): per
    size `warmup + steps` rounds of fp32 and bf16 forward+backward (fp32 as measured in section 1, bf16 from the
    calibration). A size left out gets no verdict (timing.MIN_PAIRS), only NOT_TIMED."""

    def cost(size):
        args = (size, batch_size, context_length, budget.calibration)
        return (warmup + steps) * (
            step_estimate(*args, fp32_s=fp32_s.get(size)) + step_estimate(*args, bf16=True, fp32_s=fp32_s.get(size))
        )

    return budget.fit(sizes, cost, what="mixed precision at", keep_first=True, run=run)


def plan_peaks(budget, sizes, batch_size: int, context_length: int, fp32_s: dict, bf16: bool, run=None):
    """Section 5's peak sizes (fp32, or bf16 autocast) within the budget, the smallest always: per size a model built
    and three tracked steps (AdamW's state, forward, full step)."""

    def cost(size):
        t = step_estimate(size, batch_size, context_length, budget.calibration, bf16=bf16, fp32_s=fp32_s.get(size))
        return PEAK_FIXED_S + 3 * TRACK_OVERHEAD * t

    return budget.fit(
        sizes, cost, what="autocast memory peaks at" if bf16 else "memory peaks at", keep_first=True, run=run
    )


def plot_timing(times: pd.DataFrame, warmup: int, title: str = ""):
    """Mean ± std per size, one panel per pass, cold (no warm-up) and warm; returns the figure."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
    for ax, kind in zip(axes, ("forward", "backward", "both")):
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


# --- 4 · mixed precision --------------------------------------------------------------------------


def compare_precisions(
    sizes, batch_size: int, context_length: int, dtypes, warmup: int, steps: int, device=None, skipped=()
):
    """Per size ONE model whose forward+backward runs in fp32 and under each autocast dtype in one interleaved loop
    (fp32, bf16, fp16, then reversed, ...): rows (size, precision, median_s, p25_s, status) and {size: Comparison}.
    `skipped` sizes (left out by the budget) get rows with status NOT_TIMED and no times."""
    rows, comps = [], {}
    for size in skipped:
        rows += [
            {
                "size": size,
                "precision": precision_name(d),
                "pass": "both",
                "warm-up": warmup,
                "median_s": None,
                "p25_s": None,
                "steps": 0,
                "status": NOT_TIMED,
                "device": str(device),
            }
            for d in [None, *dtypes]
        ]
    for size in sizes:

        def run():
            lm = build_model(size, device=device)
            x, y = random_batch(lm.cfg, batch_size, context_length, device=device)
            return compare(
                {precision_name(d): pass_fn(lm, x, y, "both", d) for d in [None, *dtypes]},
                steps=steps,
                warmup=warmup,
                device=device,
            )

        comp = guarded(run)
        for d in [None, *dtypes]:
            s = None if comp == "OOM" else comp.samples[precision_name(d)]
            rows.append(
                {
                    "size": size,
                    "precision": precision_name(d),
                    "pass": "both",
                    "warm-up": warmup,
                    "median_s": None if s is None else float(np.median(s)),
                    "p25_s": None if s is None else float(np.percentile(s, 25)),
                    "steps": steps,
                    "status": "OOM" if s is None else "ok",
                    "device": str(device),
                }
            )
        if comp != "OOM":
            comps[size] = comp
    return pd.DataFrame(rows), comps


def planned_precisions(plan, dtypes, warmup: int, device=None):
    """compare_precisions' (rows, {size: Comparison}) of a plan that ran them size by size (plan.results), joined,
    with NOT_TIMED rows for the sizes it left out."""
    skipped = compare_precisions([], 0, 0, dtypes, warmup, 0, device, skipped=plan.dropped)[0]
    return (
        pd.concat([rows for rows, _ in plan.results] + [skipped], ignore_index=True),
        {size: comp for _, comps in plan.results for size, comp in comps.items()},
    )


def speedup_table(amp: pd.DataFrame, sizes) -> pd.DataFrame:
    """Median seconds per size and precision (rows of compare_precisions), plus each autocast dtype's speed-up over
    fp32 (ratio of the medians of one interleaved loop)."""
    table = amp.pivot(index="size", columns="precision", values="median_s").reindex(list(sizes)).astype(float)
    for col in table.columns.drop("fp32"):
        table[f"speed-up {col[9:]}"] = table["fp32"] / table[col]
    return table


def precision_ratios(comps: dict) -> list[dict]:
    """Every pair of precisions per size (compare_precisions' Comparisons), paired per round: 01_precision_ratios."""
    return [row for size, comp in comps.items() for row in pairwise_ratios(comp.samples, size=size, **{"pass": "both"})]


def speedup_lines(comps: dict, skipped=()) -> str:
    """Per size and autocast dtype: its time over fp32's, paired per round with its interval, a winner only outside
    the noise; each size the budget left out says so."""
    return "\n".join(
        [
            f"{size}: " + "; ".join(comp.verdict(label, "fp32") for label in comp.samples if label != "fp32")
            for size, comp in comps.items()
        ]
        + [f"{size}: {NOT_TIMED}" for size in skipped]
    )


def same_quantity_note(times: pd.DataFrame, amp: pd.DataFrame, warmup: int) -> str:
    """Section 1's warm fp32 forward+backward median against section 4's fp32 column: two runs of one quantity."""
    s1 = warm_cold(times, warmup)[1].xs("both", level="pass")["median_s"]
    s4 = amp[(amp["precision"] == "fp32") & (amp["status"] == "ok")].set_index("size")["median_s"]
    both = pd.concat([s1.rename("s1"), s4.rename("s4")], axis=1).dropna()
    if both.empty:
        return "No size was timed in both section 1 and this section (budget): nothing to set side by side."
    ratio = both["s4"] / both["s1"]
    return (
        f"The fp32 column is this section's own interleaved loop (fp32 and autocast alternate on one model), so "
        f"each speed-up compares steps taken side by side; section 1 timed fp32 alone, on another model, earlier. "
        f"The two fp32 medians of one quantity differ by {ratio.min():.2f}x to {ratio.max():.2f}x over sizes: "
        f"the load on this machine between the runs. Section 6's FLOPs table uses section 1's timing."
    )


class MixedPrecisionToyModel(nn.Module):
    """The handout's mixed-precision toy model: fc1 -> ReLU -> LayerNorm -> fc2."""

    def __init__(self, in_features: int = 10, out_features: int = 5):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x):  # (B, in) -> (B, out)
        return self.fc2(self.ln(self.relu(self.fc1(x))))


def autocast_dtypes(model: nn.Module, x, y, device_type: str = "cpu", dtype=torch.bfloat16) -> dict[str, str]:
    """Dtypes of parameters, fc1's output, the norm's output, logits, loss and grads under autocast, via hooks."""
    seen = {"parameters": str({p.dtype for p in model.parameters()}.pop())}
    hooks = [
        model.fc1.register_forward_hook(lambda m, i, o: seen.__setitem__("fc1 output", str(o.dtype))),
        model.ln.register_forward_hook(lambda m, i, o: seen.__setitem__("norm output", str(o.dtype))),
    ]
    try:
        with torch.autocast(device_type, dtype=dtype):
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y)
        seen["logits"], seen["loss"] = str(logits.dtype), str(loss.dtype)
        loss.backward()
    finally:
        for h in hooks:
            h.remove()
    seen["gradients"] = str({p.grad.dtype for p in model.parameters()}.pop())
    return seen


def autocast_dtype_table(dtypes, device) -> pd.DataFrame:
    """autocast_dtypes of a fresh toy model and batch (8 rows) for each autocast dtype, one column each."""
    device = torch.device(device)
    cols = {}
    for dtype in dtypes:
        toy = MixedPrecisionToyModel().to(device)
        x, y = torch.randn(8, 10, device=device), torch.randint(5, (8,), device=device)  # (B, in), (B,)
        cols[f"autocast {str(dtype)[6:]} on {device.type}"] = autocast_dtypes(toy, x, y, device.type, dtype)
    return pd.DataFrame(cols)


def mean_square_errors(device=None, rows: int = 64, d: int = 4096) -> dict[str, float]:
    """Largest relative error of mean(x²) over d values computed in fp32, bf16 and fp16 (vs fp64): why norms stay fp32."""
    xs = torch.randn(rows, d, device=device) * 3 + 1  # (rows, d)
    ref = xs.double().pow(2).mean(-1)  # (rows,)
    return {
        str(dt)[6:]: ((xs.to(dt).pow(2).mean(-1).double() - ref).abs() / ref).max().item()
        for dt in (torch.float32, torch.bfloat16, torch.float16)
    }


ACCUMULATION_CASES = {  # label: (accumulator dtype, dtype of the 0.01 added, upcast it to fp32 before adding)
    "(a) fp32 += fp32": (torch.float32, torch.float32, False),
    "(b) fp16 += fp16": (torch.float16, torch.float16, False),
    "(c) fp32 += fp16": (torch.float32, torch.float16, False),
    "(d) fp32 += fp16 upcast": (torch.float32, torch.float16, True),
}


def accumulation_demo(n: int = 1000, value: float = 0.01) -> pd.DataFrame:
    """The handout's mixed_precision_accumulation: `value` summed n times per case in ACCUMULATION_CASES (on CPU)."""
    rows = []
    for label, (acc_dtype, value_dtype, upcast) in ACCUMULATION_CASES.items():
        s = torch.tensor(0.0, dtype=acc_dtype)
        for _ in range(n):
            x = torch.tensor(value, dtype=value_dtype)
            s += x.type(torch.float32) if upcast else x
        rows.append({"case": label, "value": s.item(), "abs error": abs(s.item() - n * value)})
    return pd.DataFrame(rows).set_index("case")


def accumulation_text(table: pd.DataFrame, n: int = 1000, value: float = 0.01) -> str:
    """Why (b) drifts (the fp16 spacing where it ends) and why (c), (d) keep the error of `value` stored in fp16
    (table: accumulation_demo(n, value))."""
    eps, end = torch.finfo(torch.float16).eps, table.loc["(b) fp16 += fp16", "value"]
    ulp = eps * 2 ** math.floor(math.log2(end))  # spacing of fp16 numbers in [2^k, 2^(k+1)) is eps·2^k
    step = (torch.tensor(end, dtype=torch.float16) + torch.tensor(value, dtype=torch.float16)).item() - end
    v16 = torch.tensor(value, dtype=torch.float16).item()
    stall = 2 ** (math.floor(math.log2(2 * v16 / eps)) + 1)  # first binade where half a spacing exceeds v16
    return (
        f"fp16 accumulation ends at {end:.10g}, where fp16 numbers are {ulp:g} = 2^{math.log2(ulp):g} apart "
        f"(eps {eps:g} × 2^{math.floor(math.log2(end))}): adding {value} there moves the sum by {step:g}, not "
        f"{value}; from {stall:g} on, half a spacing exceeds {value} and the sum would stop moving at all.\n"
        f"In fp16, {value} is stored as {v16!r} (error {v16 - value:+.3g}); {n} of them add "
        f"{n * (v16 - value):+.3g}: the fp32 accumulators (c) and (d) are off by exactly that."
    )


# --- 5 · memory -----------------------------------------------------------------------------------


def step_traces(lm, opt, x, y, autocast_dtype=None, device=None) -> dict[str, MemoryTrace]:
    """Traces of forward-only and of a steady-state step (opt's state exists; grads are set to None first)."""
    lm.zero_grad(set_to_none=True)
    state = model_state(lm, opt, x, y)
    return {
        "forward": track(lambda: forward_step(lm, x, autocast_dtype), existing=state, model=lm, device=device),
        "full step": track(
            lambda: train_step(lm, opt, x, y, autocast_dtype=autocast_dtype), existing=state, model=lm, device=device
        ),
    }


def step_peaks(size, batch_size: int, context_length: int, autocast_dtype=None, device=None) -> dict[str, MemoryTrace]:
    """step_traces of a fresh model of `size` after one step has created its AdamW state."""
    lm = build_model(size, device=device)
    opt = torch.optim.AdamW(lm.parameters())
    x, y = random_batch(lm.cfg, batch_size, context_length, device=device)
    train_step(lm, opt, x, y, autocast_dtype=autocast_dtype)  # creates the AdamW state
    return step_traces(lm, opt, x, y, autocast_dtype, device)


def plot_timelines(traces: dict[str, MemoryTrace], title: str = ""):
    """Live tensor memory (MiB) per event (op or free), one line per trace; returns the figure."""
    fig, ax = plt.subplots(figsize=(10, 3.5))
    for name, tr in traces.items():
        events, live = zip(*tr.timeline)
        ax.plot(events, [v / MiB for v in live], label=name)
    ax.set(xlabel="event (op or free)", ylabel="live tensor memory (MiB)", title=title)
    ax.legend()
    return fig


@contextlib.contextmanager
def offloaded(model: nn.Module, optimizer=None, to: str = "cpu"):
    """Move a model (parameters, gradients, buffers) and its optimizer's state to `to` for the duration, then back,
    so the runs inside have the card to themselves (section 5 keeps the profiled model for later cells)."""
    home = next(model.parameters()).device
    if home.type == torch.device(to).type:
        yield
        return
    moved = [
        (s, k)
        for s in (optimizer.state.values() if optimizer else [])
        for k, v in s.items()
        if torch.is_tensor(v) and v.device == home
    ]  # AdamW's fp32 `step` counters stay on the CPU
    model.to(to)  # parameters keep their identity, so the optimizer's references stay valid
    for s, k in moved:
        s[k] = s[k].to(to)
    if home.type == "cuda":
        torch.cuda.empty_cache()
    try:
        yield
    finally:
        model.to(home)
        for s, k in moved:
            s[k] = s[k].to(home)


def peak_rows(sizes, batch_size: int, context_length: int, dtypes, device=None, fp32: bool = True) -> pd.DataFrame:
    """Peak MiB of forward-only and of the full step per size and precision (fp32 unless fp32=False, then each
    autocast dtype)."""
    rows = []
    for size in sizes:
        for dtype in [None, *dtypes] if fp32 else dtypes:
            traces = guarded(lambda: step_peaks(size, batch_size, context_length, dtype, device))
            for kind in ("forward", "full step"):
                tr = None if traces == "OOM" else traces[kind]
                rows.append(
                    {
                        "size": size,
                        "precision": precision_name(dtype),
                        "pass": kind,
                        "peak_MiB": None if tr is None else tr.peak_bytes / MiB,
                        "allocator_peak_MiB": None
                        if tr is None or tr.allocator_peak_bytes is None
                        else tr.allocator_peak_bytes / MiB,
                        "status": "OOM" if tr is None else "ok",
                        "device": str(device),
                    }
                )
            del traces
    return pd.DataFrame(rows)


def planned_peaks(budget, sizes, batch_size: int, context_length: int, fp32_s: dict, dtypes, device=None):
    """Section 5: the fp32 and the autocast peaks of the sizes each plan fits in the budget: (rows, the table of
    peak MiB by size x (pass, precision), the plans' notes on what they left out)."""
    plans = [
        plan_peaks(
            budget,
            sizes,
            batch_size,
            context_length,
            fp32_s,
            bf16=bf16,
            run=lambda size, bf16=bf16: peak_rows(
                [size], batch_size, context_length, dtypes if bf16 else [], device, fp32=not bf16
            ),
        )
        for bf16 in (False, True)
    ]
    peaks = pd.concat([r for plan in plans for r in plan.results], ignore_index=True)
    table = peaks.pivot_table(index="size", columns=["pass", "precision"], values="peak_MiB", sort=False).reindex(sizes)
    return peaks, table, [plan.note for plan in plans if plan.note]


def peak_summary(peak_table: pd.DataFrame) -> str:
    """Full-step peak of each autocast dtype vs fp32, and full step vs forward in fp32, as ranges over sizes."""
    full, fwd = peak_table["full step"], peak_table["forward"]
    lines = [
        f"{col}: full-step peak {(full[col] / full['fp32']).min():.2f}x to {(full[col] / full['fp32']).max():.2f}x fp32"
        for col in full.columns.drop("fp32")
    ]
    ratio = full["fp32"] / fwd["fp32"]
    return "\n".join(lines + [f"full step / forward (fp32): {ratio.min():.1f}x to {ratio.max():.1f}x"])


ACTIVATIONS_ROW = "activations (+ loss gradients at the peak)"  # breakdown_table's row of everything else


def breakdown_table(trace: MemoryTrace, lm, opt, x, y) -> pd.DataFrame:
    """MiB per kind of tensor: the whole step and what is live at its peak (analytic), against the tracker's peak."""
    B, T = x.shape
    whole, analytic = formulas.step_breakdown(lm.cfg, B, T), formulas.peak_breakdown(lm.cfg, B, T)
    measured = trace.categorize(
        **{
            "parameters": lm.parameters(),
            "buffers": lm.buffers(),
            "optimizer state": [t for s in opt.state.values() for t in s.values()],
            "gradients": [p.grad for p in lm.parameters()],
            "token ids": [x, y],
        }
    )
    kinds = ["parameters", "buffers", "token ids", "optimizer state", "gradients"]
    table = (
        pd.DataFrame(
            {
                "whole step (analytic)": [whole[k] for k in kinds] + [whole["activations"]],
                "live at the peak (analytic)": [analytic[k] for k in kinds]
                + [analytic["activations"] + analytic["loss gradients (B·T·V ×2)"]],
                "live at the peak (measured)": [measured[k] for k in kinds] + [measured["activations & other"]],
            },
            index=kinds + [ACTIVATIONS_ROW],
        )
        / MiB
    )
    table.loc["total"] = table.sum()
    return table


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
