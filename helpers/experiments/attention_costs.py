"""Notebook 06 §4, what a pass costs: the FlashAttention-2 kernels' FLOPs and bytes at the leaderboard's shape
(helpers.formulas.attention_cost, at the tiles the code launches there), and §4's measured passes as TFLOP/s and a
fraction of the device's peak, ours beside SDPA, with the leaderboard's best entry on the same yardstick.

    costs = kernel_cost_section(ctx)          # one row per kernel: GFLOP, executed, MB, FLOP/byte, floor at peak
    rates = pass_rate_section(ctx, bench)     # §4's fwd / bwd / fwd+bwd rows: ms, TFLOP/s, fraction of peak
"""

from __future__ import annotations

import pandas as pd

from helpers.attention import attention_flops, tiles_for
from helpers.experiments.attention_leaderboard import LEADERBOARD
from helpers.experiments.attention_sections import Setup
from helpers.formulas.attention_cost import kernel_costs
from helpers.formulas.flops import peak_flops
from helpers.published import H100_HBM3_TBPS, MARKS
from helpers.section import Result

YARDSTICK = "NVIDIA H100 80GB HBM3"  # the leaderboard's GPU: its bf16 peak turns FLOPs into a floor in ms
KERNEL_NAMES = {
    "fwd": "forward",
    "delta": "backward: D = rowsum(dO * O)",
    "dkdv": "backward: dK, dV",
    "dq": "backward: dQ",
}


def kernel_cost_section(ctx: Setup, arch: str = "sm_90a") -> Result:
    """Each kernel's matmul FLOPs (kept pairs, and as the tiles compute them), HBM bytes with no L2 reuse and
    FLOP per byte at the leaderboard's shape, with the tiles `arch` launches there; the floor each sets at an
    H100's bf16 peak. values: per kernel GFLOP, and the backward's FLOPs over the forward's."""
    B, H, T, d = (LEADERBOARD[k] for k in ("batch", "heads", "T", "d"))
    cfg = tiles_for(d, LEADERBOARD["dtype"], arch)
    tiles = {k: (getattr(cfg, k).own, getattr(cfg, k).loop) for k in ("fwd", "dkdv", "dq")}
    costs = kernel_costs(B * H, T, T, d, is_causal=LEADERBOARD["is_causal"], tiles=tiles)
    peak = peak_flops(YARDSTICK, "bf16")
    rows = [
        {
            "kernel": KERNEL_NAMES[k],
            "tiles (own x streamed)": "-" if k == "delta" else "{} x {}".format(*tiles[k]),
            "GFLOP": c.flops / 1e9,
            "GFLOP computed": c.flops_executed / 1e9,
            "MB moved": c.bytes / 1e6,
            "FLOP / byte": c.flops / c.bytes,
            "ms at H100 bf16 peak": c.flops / peak * 1e3,
            "ms at H100 HBM bandwidth": c.bytes / (H100_HBM3_TBPS * 1e12) * 1e3,
        }
        for k, c in costs.items()
    ]
    table = pd.DataFrame(rows).set_index("kernel").round(3)
    bwd = sum(c.flops for k, c in costs.items() if k != "fwd")
    ratio = (costs["dkdv"].flops + costs["dq"].flops) / costs["fwd"].flops  # matmuls only: D's rowsum is ~0
    notes = [
        f"leaderboard shape: batch {B} x {H} heads x T {T} x d {d}, bf16, causal; tiles as launched on {arch}",
        f"the backward's matmul kernels do {ratio:.2f}x the forward's FLOPs ({bwd / 1e12:.2f} against "
        f"{costs['fwd'].flops / 1e12:.2f} TFLOP): dK/dV recompute S and P, and dQ recomputes them again, where a "
        "single backward kernel with atomic dQ would not (helpers.attention.kernels says why ours is split)",
        f"at an H100's bf16 dense peak ({peak / 1e12:.0f} TFLOP/s) the whole pass cannot take less than "
        f"{(bwd + costs['fwd'].flops) / peak * 1e3:.2f} ms; {bound_sentence(costs, peak)}",
    ]
    values = {"GFLOP": {k: c.flops / 1e9 for k, c in costs.items()}, "backward_over_forward": ratio}
    return Result(table, notes=notes, values=values)


def bound_sentence(costs: dict, peak: float) -> str:
    """Which of peak FLOPs and HBM bandwidth bounds each matmul kernel by the byte model (every tile from HBM, an
    upper bound on bytes: L2 reuse only moves a kernel towards compute-bound)."""
    ridge = peak / (H100_HBM3_TBPS * 1e12)  # FLOP per byte where the two floors meet
    parts = [
        f"{KERNEL_NAMES[k]} {c.flops / c.bytes:.0f} ({'compute' if c.flops / c.bytes >= ridge else 'bandwidth'})"
        for k, c in costs.items()
        if k != "delta"
    ]
    return (
        f"FLOP per byte against the H100's ridge point of {ridge:.0f} (bf16 peak over {H100_HBM3_TBPS} TB/s): "
        + ", ".join(parts)
        + "; bytes counted with no L2 reuse, so a bandwidth-bound reading here is an upper bound on the traffic"
    )


def pass_rate_section(ctx: Setup, bench: Result) -> Result:
    """§4's rows of ours (flash_triton where it was timed, else flash_pytorch) and SDPA per pass: median ms,
    TFLOP/s and the fraction of this device's dense peak (bf16, tf32 for fp32; unknown off a known GPU), with the
    leaderboard's best entry (fwd+bwd at its shape on an H100) on the same yardstick."""
    rows = bench.values["rows"]
    ours = "flash_triton" if "flash_triton" in set(rows["impl"]) else "flash_pytorch"
    part = rows[rows["impl"].isin([ours, "sdpa"])].copy()
    peaks = {dt: peak_flops(ctx.device_name, "tf32" if dt == "float32" else "bf16") for dt in set(part["dtype"])}
    part["of peak"] = [r.TFLOPs * 1e12 / peaks[r.dtype] if peaks[r.dtype] else float("nan") for r in part.itertuples()]
    table = part.pivot_table(
        index=["dtype", "T", "pass"], columns="impl", values=["ms", "TFLOPs", "of peak"], sort=False
    ).round(4)
    B, H, T, d = (LEADERBOARD[k] for k in ("batch", "heads", "T", "d"))
    flops = attention_flops(B * H, T, T, d, True) + attention_flops(B * H, T, T, d, True, backward=True)
    best = MARKS["leaderboard_2025_best"].value  # ms, fwd+bwd, one H100
    best_rate = flops / (best / 1e3)
    notes = [
        f"ours = {ours}; TFLOP/s by helpers.attention.attention_flops' count (causal: half the pairs)",
        "fraction of peak: "
        + (
            "; ".join(f"{dt} against {p / 1e12:.0f} TFLOP/s" for dt, p in peaks.items() if p)
            or f"no known peak for {ctx.device_name}: the column is empty (a CPU)"
        ),
        f"the 2025 leaderboard's best entry: {best} ms for fwd+bwd at its shape on an H100, {best_rate / 1e12:.0f} "
        f"TFLOP/s by the same count, {best_rate / peak_flops(YARDSTICK, 'bf16'):.0%} of the H100's bf16 peak",
        f"causal attention, median ms · {ctx.where}",
    ]
    assert (part["of peak"].dropna() <= 1.0).all(), part  # a rate above the peak is a timing or counting error
    return Result(table, notes=notes, values={"rows": part, "best_tflops": best_rate / 1e12})


__all__ = ["KERNEL_NAMES", "YARDSTICK", "kernel_cost_section", "pass_rate_section"]
