"""Notebook 01 §4: mixed precision: fp32 and each autocast dtype timed in one interleaved loop per size, the dtypes
autocast gives each tensor of a toy model, why norms stay in fp32, and the handout's accumulation demo.

    accumulation_demo()                                     # 0.01 summed 1000 times in four precisions
    amp, comps = compare_precisions(["small/cpu"], 4, 32, [torch.bfloat16], warmup=2, steps=6)
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from helpers.experiments.benchmarking_common import (
    NOT_TIMED,
    guarded,
    pass_fn,
    precision_name,
    step_estimate,
    warm_cold,
)
from helpers.model import build_model, random_batch
from helpers.timing import compare, pairwise_ratios


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

    def run(size):  # one model of `size`: every precision's forward+backward in one interleaved loop
        lm = build_model(size, device=device)
        x, y = random_batch(lm.cfg, batch_size, context_length, device=device)
        return compare(
            {precision_name(d): pass_fn(lm, x, y, "both", d) for d in [None, *dtypes]},
            steps=steps,
            warmup=warmup,
            device=device,
        )

    for size in sizes:
        comp = guarded(functools.partial(run, size))
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
    """Largest relative error of mean(x²) over d values computed in fp32, bf16 and fp16 (vs fp64): why norms stay
    fp32."""
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
