"""Notebook 06's interleaved comparisons of implementations on one input (compiled vs eager naive, a student's
against ours) and the 2025 leaderboard's configuration, with the published marks beside this machine's times.

    comparison, rows = leaderboard_comparison()   # CUDA: fwd+bwd of flash_triton, sdpa, naive; ms and TFLOP/s
    leaderboard_mark_table(pd.DataFrame(rows), [MARKS["leaderboard_2025_best"]], comparable=True)
"""

from __future__ import annotations

import pandas as pd
import torch

from helpers import attention as A
from helpers.experiments.attention_impls import attention_fn, inputs, pass_steps
from helpers.published import MARKS
from helpers.timing import compare

LEADERBOARD = dict(batch=1, heads=16, T=16384, d=64, dtype=torch.bfloat16, is_causal=True)  # fwd+bwd, one H100
PUBLISHED_MS = {
    "naive (published)": MARKS["leaderboard_2025_naive"].value,  # the 2025 leaderboard, H100, bf16
    "best class entry": MARKS["leaderboard_2025_best"].value,
}  # (helpers.published holds the marks)


def compare_impls(
    impls,
    shape,
    dtype=torch.float32,
    device="cpu",
    is_causal: bool = False,
    pass_="fwd+bwd",
    warmup: int = 3,
    steps: int = 10,
    fns: dict | None = None,
):
    """One pass (fwd | bwd | fwd+bwd) of each impl on the same inputs, interleaved in one loop (timing.compare);
    baseline: the first impl (notebook 06: compiled vs eager naive; the leaderboard; a student's, from fns)."""
    q, k, v, do = inputs(shape, dtype, device)
    calls = {i: pass_steps(attention_fn(i, q, is_causal, fns), q, k, v, do)[pass_] for i in impls}
    return compare(calls, steps=steps, warmup=warmup, device=device)


def leaderboard_comparison(
    impls=("flash_triton", "sdpa", "naive"), device="cuda", warmup: int = 5, steps: int = 20, shape=None, dtype=None
):
    """fwd+bwd of each impl at the leaderboard configuration (or `shape`/`dtype`), interleaved; (Comparison, rows
    with median ms and TFLOP/s)."""
    shape = shape or tuple(LEADERBOARD[k] for k in ("batch", "heads", "T", "d"))
    dtype = dtype or LEADERBOARD["dtype"]
    c = compare_impls(impls, shape, dtype, device, True, "fwd+bwd", warmup, steps)
    B, H, T, d = shape
    flops = A.attention_flops(B * H, T, T, d, True) + A.attention_flops(B * H, T, T, d, True, backward=True)
    t = c.table()
    rows = [
        dict(
            impl=i,
            batch=B,
            heads=H,
            T=T,
            d=d,
            dtype=str(dtype).replace("torch.", ""),
            causal=True,
            device=c.device,
            median_ms=t.loc[i, "median_s"] * 1e3,
            TFLOPs=flops / t.loc[i, "median_s"] / 1e12,
            ratio=t.loc[i, "ratio"],
            ratio_low=t.loc[i, "ratio_low"],
            ratio_high=t.loc[i, "ratio_high"],
            **{"pass": "fwd+bwd"},
        )
        for i in impls
    ]
    return c, rows


# ---- the published 2025 leaderboard marks beside this machine's times (notebook 06) ----


def plot_leaderboard_marks(rows: pd.DataFrame, marks, comparable: bool, title: str = ""):
    """fwd+bwd median ms per implementation (the leaderboard's rows on a GPU; on a CPU the section 4 rows at this
    profile's shape), with the published marks as labelled lines: compared only at the leaderboard's shape."""
    import matplotlib.pyplot as plt

    from helpers.published import draw_mark

    part = rows[rows["pass"] == "fwd+bwd"] if "pass" in rows else rows
    ms = part.groupby("impl")["median_ms"].median().sort_values()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    ax.bar(range(len(ms)), ms.to_numpy(), color="#4a7")
    for m, style in zip(marks, ("--", ":"), strict=False):  # the best and the naive mark, a style each
        draw_mark(ax, m, comparable, style=style)
    ax.set_xticks(range(len(ms)), ms.index)
    ax.set(
        yscale="log", ylabel="fwd+bwd median (ms)", title=title or "causal attention fwd+bwd and the 2025 leaderboard"
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def leaderboard_mark_table(rows: pd.DataFrame, marks, comparable: bool) -> pd.DataFrame:
    """Beside the plot: median ms per implementation and, at the leaderboard's shape, its "% of" each mark's speed."""
    from helpers.published import share_column

    part = rows[rows["pass"] == "fwd+bwd"] if "pass" in rows else rows
    t = part.groupby("impl")["median_ms"].median().to_frame()
    for m in marks:
        t[f"% of {m.label}"] = share_column(t["median_ms"], m, comparable)
    return t
