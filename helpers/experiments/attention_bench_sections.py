"""Notebook 06's sections 4-6 as one call each: every implementation timed (ms and TFLOP/s, within the device's
bounds), a student's against ours, memory O(T²) against O(T) with its plot, the attention choice inside the model,
and the 2025 leaderboard's configuration with the published marks. Each call runs, checks, saves what the answers
page reads and returns one helpers.section.Result whose notes are made from the same values as its table.

    bench = benchmark(ctx, fns=YOURS)          # §4: median ms per impl; saved as attention_bench
    tflops(ctx, bench)                         # §4: the same rows in TFLOP/s
    memory = memory_curves(ctx)                # §5: saved bytes per T, naive and FlashAttention, and the plot
    board = leaderboard(ctx)                   # the 2025 configuration (timed on a GPU, saved as 06_leaderboard)
"""

from __future__ import annotations

import pandas as pd
import torch

from helpers import attention as A
from helpers.experiments.attention_bench import check_physical_bounds, order_violations, sweep
from helpers.experiments.attention_leaderboard import (
    LEADERBOARD,
    PUBLISHED_MS,
    compare_impls,
    leaderboard_comparison,
    leaderboard_mark_table,
    plot_leaderboard_marks,
)
from helpers.experiments.attention_memory import saved_memory
from helpers.experiments.attention_model import MODEL_TOL, check_model_outputs, compare_models, tiny_model_outputs
from helpers.experiments.attention_sections import Setup
from helpers.experiments.common import log_ticks
from helpers.published import MARKS
from helpers.results import save_results
from helpers.section import Result

# ---- §4 benchmarks: time and TFLOP/s ------------------------------------------------------------------------------


def benchmark(ctx: Setup, fns: dict | None = None) -> Result:
    """§4: causal attention, every implementation of the profile (and `fns`, e.g. a student's) per shape and dtype,
    fwd / bwd / fwd+bwd; TFLOP/s within the device's peak (asserted) and fwd within fwd+bwd (asserted on a GPU, a
    note on a CPU, where a busy machine can slow one pass's timing window); saved as
    attention_bench. values: `rows` (a DataFrame with ms and TFLOPs), `peak_known` (rows checked against a peak)."""
    s, fns = ctx.scale, fns or {}
    tiled = [k for k in ("flash_pytorch", *fns) if k.endswith("pytorch")]  # eager tiles: only up to this T
    impls = s["bench_impls"] + (["flash_triton"] if ctx.triton_timed and "flash_triton" not in s["bench_impls"] else [])
    rows = sweep(
        impls + list(fns),
        s["bench_shapes"],
        s["bench_dtypes"],
        ctx.device,
        True,
        s["warmup"],
        s["steps"],
        max_T=dict.fromkeys(tiled, s["flash_pytorch_max_T"]),
        fns=fns,
    )
    bench = pd.DataFrame(rows).assign(ms=lambda df: df["median_s"] * 1e3)
    saved = save_results(bench, "attention_bench", profile=ctx.profile)  # saved first: a tripped bound keeps the run
    cuda = torch.device(ctx.device).type == "cuda"  # device time: the order is asserted; host time: noted
    known = check_physical_bounds(rows, ctx.device_name, order=cuda)  # TFLOP/s <= peak; fwd <= fwd+bwd
    triton = (
        "Triton kernels compiled for this GPU, timed on every shape"
        if "flash_triton" in impls
        else "Triton is not timed here: it runs in its interpreter on this machine (section 3 checked it)"
    )
    notes = [triton, f"{len(bench)} rows; peak known for {known} rows", f"causal attention, median ms · {ctx.where}"]
    for (impl, *_, T, _d, dt), r in order_violations(rows).iterrows():
        notes.append(
            f"{impl} {dt} T={T}: the fastest forward took {r['fwd'] / r['fwd+bwd']:.1f}x the fastest forward+backward, "
            "impossible for the same work: the machine was busy while its forward was timed (rerun on a quiet one)"
        )
    table = bench.pivot_table(index=["dtype", "T", "pass"], columns="impl", values="ms", sort=False).round(3)
    return Result(table, notes=notes, saved=saved, values={"rows": bench, "peak_known": known})


def tflops(ctx: Setup, bench: Result) -> Result:
    """§4: the benchmark's rows in TFLOP/s (attention_flops, causal half), and naive's fwd+bwd median over each
    one's: from separate loops, so a table, not a ranking (the leaderboard pairs them)."""
    rows = bench.values["rows"]
    table = rows.pivot_table(index=["dtype", "T", "pass"], columns="impl", values="TFLOPs", sort=False).round(4)
    notes = [f"causal attention, TFLOP/s (attention_flops, causal half) · {ctx.where}"]
    t = rows[rows["pass"] == "fwd+bwd"].pivot_table(index=["dtype", "T"], columns="impl", values="median_s")
    for (dt, T), row in t.iterrows():
        others = ", ".join(f"{impl} {row['naive'] / s:.2g}x" for impl, s in row.items() if impl != "naive")
        notes.append(f"{dt} T={T}, fwd+bwd, naive's median / each one's (separate loops, no interval): {others}")
    return Result(table, notes=notes)


def yours_against_ours(ctx: Setup, fns: dict) -> Result:
    """§4: a student's implementations, ours and SDPA in ONE interleaved loop on the first benchmark shape, fwd+bwd:
    paired ratios against ours, a winner only outside the noise. values: `ratios` {label: Ratio}."""
    s = ctx.scale
    ours = "flash_triton" if ctx.triton_timed else "flash_pytorch"
    labels = [*fns, "sdpa"]
    shape, dtype = s["bench_shapes"][0], s["bench_dtypes"][-1]
    cmp = compare_impls([ours, *labels], shape, dtype, ctx.device, True, "fwd+bwd", s["warmup"], s["steps"], fns=fns)
    where = f"causal {shape} {str(dtype).removeprefix('torch.')}, fwd+bwd · {ctx.where}"
    notes = [cmp.verdict(label) for label in labels] + [where]
    return Result(cmp.table().round(5), notes=notes, values={"ratios": {x: cmp.ratio(x) for x in labels}})


# ---- §5 memory: O(T²) against O(T) ---------------------------------------------------------------------------


def _memory_plot(rows: pd.DataFrame, seq_lens, where: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for impl, part in rows.groupby("impl"):
        ax.plot(part["T"], part["saved_bytes"] / 2**20, marker="o", label=impl)
    ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel="MiB saved for backward")
    ax.set_title(f"extra memory · {where}")
    log_ticks(ax, seq_lens)
    ax.legend()
    fig.tight_layout()
    return fig


def memory_curves(ctx: Setup) -> Result:
    """§5: one forward each of naive and FlashAttentionPyTorch per T, causal, fp32: bytes live before backward and
    the peak, beyond q, k, v, against the closed forms (asserted byte for byte); the log-log plot. values: `rows`,
    `mismatched` (0), `growth` {impl: saved bytes at the longest T over the shortest}, `T_ratio`."""
    B, H, d = ctx.scale["memory_shape"]
    seq_lens = ctx.scale["memory_seq_lens"]
    rows = pd.DataFrame(
        [
            saved_memory(impl, (B, H, T, d), torch.float32, ctx.device, True)
            for impl in ("naive", "flash_pytorch")
            for T in seq_lens
        ]
    )
    mismatched = int((rows.saved_bytes != rows.formula_bytes).sum())
    assert mismatched == 0, rows  # byte-exact, both implementations
    by = rows.pivot_table(index="T", columns="impl", values="saved_bytes")
    growth = (by.iloc[-1] / by.iloc[0]).to_dict()
    T_ratio = by.index[-1] / by.index[0]
    notes = [
        f"T x{T_ratio:.0f}: naive keeps {growth['naive']:.1f}x more, "
        f"FlashAttention {growth['flash_pytorch']:.1f}x more",
        f"memory live before backward and peak during forward, beyond q, k, v; batch {B}, {H} head, d {d}, fp32, "
        f"causal · {ctx.where}",
    ]
    mib = rows.assign(**{"saved MiB": rows.saved_bytes / 2**20, "peak MiB": rows.peak_bytes / 2**20})
    table = mib.pivot_table(index="T", columns="impl", values=["saved MiB", "peak MiB"]).round(3)
    return Result(
        table,
        figure=_memory_plot(rows, seq_lens, ctx.where),
        notes=notes,
        values=dict(rows=rows, mismatched=mismatched, growth=growth, T_ratio=T_ratio),
    )


# ---- §6 inside the model, and the leaderboard ------------------------------------------------------------------


def model_outputs(ctx: Setup, impls=("naive", "sdpa", "flash_pytorch", "flash_triton")) -> Result:
    """§6: the tiny model's logits and every gradient with each attention against naive's, within MODEL_TOL."""
    check_model_outputs(tiny_model_outputs(list(impls), ctx.device), ref="naive")
    note = f"tiny model: logits and gradients of {', '.join(impls[1:])} = naive's ({MODEL_TOL}) · {ctx.where}"
    return Result(notes=[note])


def model_steps(ctx: Setup) -> Result:
    """§6: one forward+backward step per model size the card holds (attention_sections.fit_card) with each attention,
    interleaved (baseline naive); verdicts inside the noise say so. values: `ratios` {(size, impl): Ratio against
    naive}."""
    s = ctx.scale
    tables, notes, ratios = {}, [], {}
    for size in s["model_sizes"]:
        cmp = compare_models(
            size, s["model_impls"], ctx.device, s["model_batch"], s["model_dtype"], s["warmup"], s["model_steps"]
        )
        tables[size] = cmp.table()
        for impl in s["model_impls"][1:]:
            notes.append(f"{size}: {cmp.verdict(impl)}")
            ratios[(size, impl)] = cmp.ratio(impl)
    notes.append(f"batch {s['model_batch']}, autocast {s['model_dtype']} · {ctx.where}")
    notes += s.get("left_out", [])  # the sizes this GPU could not hold (attention_sections.fit_card)
    return Result(pd.concat(tables, names=["size"]).round(4), notes=notes, values={"ratios": ratios})


def leaderboard(ctx: Setup) -> Result:
    """The 2025 leaderboard configuration: its FLOPs and naive's P; on a GPU flash_triton, sdpa and naive timed in
    one interleaved loop (saved as 06_leaderboard). values: `rows` (the timed rows; [] on a CPU)."""
    cfg = LEADERBOARD
    bh = cfg["batch"] * cfg["heads"]
    flops = sum(A.attention_flops(bh, cfg["T"], cfg["T"], cfg["d"], True, backward=b) for b in (False, True))
    p_bytes = A.score_matrix_bytes(bh, cfg["T"], cfg["T"], cfg["dtype"])
    published = ", ".join(f"{k} {v:g} ms" for k, v in PUBLISHED_MS.items())
    notes = [
        f"leaderboard: {flops / 1e12:.2f} TFLOP per fwd+bwd (causal half); naive's P alone is "
        f"{p_bytes / 2**30:.1f} GiB; published: {published}"
    ]
    if ctx.profile != "gpu":
        notes.append(f"not timed on {ctx.where}: run this notebook or `python -m helpers bench attention` on a GPU")
        return Result(notes=notes, values={"rows": []})
    cmp, rows = leaderboard_comparison(device=ctx.device, steps=ctx.scale["model_steps"])
    notes += [cmp.verdict(impl, "flash_triton") for impl in ("sdpa", "naive")]
    lb = pd.DataFrame(rows)
    saved = save_results(lb.assign(pairs=ctx.scale["model_steps"]), "06_leaderboard", profile=ctx.profile)
    table = lb.set_index("impl")[["median_ms", "TFLOPs", "ratio", "ratio_low", "ratio_high"]].round(3)
    return Result(table, notes=notes, saved=saved, values={"rows": rows})


def leaderboard_marks(ctx: Setup, board: Result, bench: Result) -> Result:
    """The published 2025 marks beside this machine's fwd+bwd times: the leaderboard's rows on a GPU, the §4 rows
    at the longest T on a CPU; compared ("% of" a mark) only at the leaderboard's shape on an H100."""
    marks = [MARKS["leaderboard_2025_best"], MARKS["leaderboard_2025_naive"]]
    at_board = ctx.profile == "gpu" and "H100" in ctx.device_name
    if board.values["rows"]:
        rows = pd.DataFrame(board.values["rows"])
    else:
        b = bench.values["rows"]
        rows = b[b["T"] == b["T"].max()].assign(median_ms=b["ms"])
    fig = plot_leaderboard_marks(rows, marks, at_board, title=f"fwd+bwd · {ctx.where}")
    return Result(leaderboard_mark_table(rows, marks, at_board).round(3), figure=fig)
