"""Notebook 03's reading of the collective benchmarks' rows: sizes as text, the alpha-beta fit (time = alpha +
bytes / beta) per configuration, the plots of time, algbw and busbw, the share of a published mark, and the ratios
of two ops (paired, one launch) or of two configurations (unpaired, separate launches).

    fits = fit_table(df)                        # one AlphaBeta per (backend, device, world_size, op), on p25_s
    ratios = op_ratios(df)                      # each op / all_reduce at one size, paired call by call
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from helpers.formulas import GiB, KiB, MiB
from helpers.timing import MIN_PAIRS, paired_ratio, verdict


def parse_size(text: str) -> int:
    """'512KB' / '16 MiB' / '1GB' / '4096' -> bytes (binary units: the seed's table and the handout's 512KB ... 1GB
    grid are read as KiB ... GiB, which format_size writes)."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": KiB, "M": MiB, "G": GiB}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)


def format_size(size_bytes: int) -> str:
    """Bytes -> '512 KiB', '16 MiB', '1 GiB': binary units, as the sizes are computed (2^19 bytes is 512 KiB)."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.3g} {unit}"
    return f"{size_bytes} B"


# ---- the alpha-beta model: time = alpha + bytes / beta ----


@dataclass
class AlphaBeta:
    """A latency-bandwidth fit: alpha (s), beta (bytes/s), and how far the points are from it."""

    alpha_s: float
    beta_Bps: float
    median_rel_err: float
    max_rel_err: float
    points: int

    def predict(self, size_bytes):
        """Modelled time (s) for `size_bytes`."""
        return self.alpha_s + np.asarray(size_bytes, dtype=float) / self.beta_Bps

    @property
    def crossover_bytes(self) -> float:
        """alpha * beta: below this size the latency term is larger than the bandwidth term."""
        return self.alpha_s * self.beta_Bps


def fit_alpha_beta(size_bytes, seconds) -> AlphaBeta:
    """Least squares on relative error (rows divided by time) of t = alpha + bytes/beta; alpha >= 0."""
    x, t = np.asarray(size_bytes, dtype=float), np.asarray(seconds, dtype=float)
    design = np.stack([np.ones_like(x), x], axis=1) / t[:, None]  # (points, 2), each row / t: relative residuals
    (alpha, inv_beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if alpha < 0:  # latency too small to see: refit through the origin
        alpha, inv_beta = 0.0, float(np.sum(x / t) / np.sum((x / t) ** 2))
    rel = np.abs(alpha + x * inv_beta - t) / t
    return AlphaBeta(float(alpha), float(1 / inv_beta), float(np.median(rel)), float(np.max(rel)), len(t))


def fit_table(df: pd.DataFrame, keys=("backend", "device", "world_size", "op"), col: str = "p25_s") -> pd.DataFrame:
    """One alpha-beta fit per (backend, device, world_size, op) group of a results frame, fitted to column `col`.

    The default is the lower quartile of the call times: on a shared or virtual machine a fraction of calls also wait
    for a descheduled rank (milliseconds), enough to move the median of a few calls from one mode to the other, while
    the lower quartile keeps to the calls that did not wait. Rows saved before p25_s existed are fitted on time_s.
    """
    col = col if col in df else "time_s"
    rows = []
    for group, part in df.groupby(list(keys)):
        fit = fit_alpha_beta(part["size_bytes"], part[col])
        rows.append(
            {
                **dict(zip(keys, group, strict=True)),
                "alpha_us": fit.alpha_s * 1e6,
                "beta_GBps": fit.beta_Bps / 1e9,
                "crossover_bytes": fit.crossover_bytes,
                "median_rel_err": fit.median_rel_err,
                "max_rel_err": fit.max_rel_err,
                "points": fit.points,
                "fitted_to": col,
                "fit": fit,
            }
        )
    return pd.DataFrame(rows)


def plot_collectives(
    df: pd.DataFrame, fits: pd.DataFrame | None = None, op: str = "all_reduce", title: str = "", marks=None
):
    """Log-log time (median, quartile bars) and busbw vs size, one line per (backend, device, world_size); fits dashed.
    marks: published busbw marks drawn on the busbw panel (default: NCCL's on H100 NVLink for all_reduce), compared
    only when NCCL on CUDA was measured."""
    import matplotlib.pyplot as plt

    from helpers.published import MARKS, draw_mark

    marks = ([MARKS["nccl_allreduce_h100"]] if op == "all_reduce" else []) if marks is None else marks

    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4))
    part = df[df["op"] == op]
    for (backend, device, ws), g in part.groupby(["backend", "device", "world_size"]):
        g = g.sort_values("size_bytes")
        label = f"{backend}+{device}, {ws} ranks"
        spread = [g["time_s"] - g["p25_s"], g["p75_s"] - g["time_s"]] if "p25_s" in g else None  # middle half of calls
        color = (
            ax_t.errorbar(g["size_bytes"], g["time_s"], yerr=spread, fmt="o", capsize=2, label=label)
            .lines[0]
            .get_color()
        )
        ax_b.plot(g["size_bytes"], g["busbw_GBps"], "o-", color=color, label=label)
        if fits is not None:
            match = fits[
                (fits.backend == backend) & (fits.device == device) & (fits.world_size == ws) & (fits.op == op)
            ]
            if len(match):
                xs = np.geomspace(g["size_bytes"].min(), g["size_bytes"].max(), 50)
                ax_t.plot(xs, match.iloc[0]["fit"].predict(xs), "--", color=color)
    ax_t.set(
        xscale="log",
        yscale="log",
        xlabel="size (bytes)",
        ylabel="time (s)",
        title=f"{op}: median, quartile bars; dashed: α–β fit",
    )
    nccl = bool(((part["backend"] == "nccl") & (part["device"] == "cuda")).any())
    for m in marks:
        draw_mark(ax_b, m, comparable=nccl)
    ax_b.set(
        xscale="log",
        yscale="log" if marks else "linear",
        xlabel="size (bytes)",
        ylabel="busbw (GB/s)",
        title=f"{op}: bus bandwidth",
    )
    ax_b.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def mark_table(df: pd.DataFrame, mark=None, op: str = "all_reduce") -> pd.DataFrame:
    """Beside the plot: per (backend, device, world_size) the best busbw measured and its "% of mark" (NCCL on CUDA
    only; other backends and devices are not compared with a GPU figure)."""
    from helpers.published import MARKS, share_column

    mark = mark or MARKS["nccl_allreduce_h100"]
    part = df[(df["op"] == op) & (df["wrong"] == 0)]
    best = part.groupby(["backend", "device", "world_size"])["busbw_GBps"].max().reset_index()
    comparable = (best["backend"] == "nccl") & (best["device"] == "cuda")
    best[f"% of mark ({mark.label})"] = [
        share_column([v], mark, c)[0] for v, c in zip(best["busbw_GBps"], comparable, strict=True)
    ]
    return best.set_index(["backend", "device", "world_size"])


# ---- comparisons that know their noise ----


def op_ratios(df: pd.DataFrame, baseline: str = "all_reduce", size_bytes: int | None = None) -> pd.DataFrame:
    """Notebook 03: each op's time over `baseline`'s at one size, per configuration (default size: the largest where
    every op has MIN_PAIRS timed calls, else the largest).

    Both ops ran in one launch, one after the other, so call k of each is paired (paired_ratio: median of the ratios,
    bootstrap interval); the interval covers call-to-call noise, not a drift between the two blocks of calls.
    With fewer than MIN_PAIRS pairs no difference is called measurable.
    """
    if "calls_s" not in df:
        raise ValueError("these rows have no per-call times (calls_s): rerun the benchmark with this version")
    if size_bytes is None:
        enough = df.groupby("size_bytes")["calls_s"].agg(lambda calls: min(map(len, calls)) >= MIN_PAIRS)
        size_bytes = int(enough[enough].index.max() if enough.any() else df["size_bytes"].max())
    keys, rows = ["backend", "device", "world_size"], []
    for cfg, g in df[df["size_bytes"] == size_bytes].groupby(keys):
        base = g[g["op"] == baseline]["calls_s"].iloc[0]
        for r in g[g["op"] != baseline].itertuples():
            k = min(len(r.calls_s), len(base))
            ratio = paired_ratio(r.calls_s[:k], base[:k])
            enough = k >= MIN_PAIRS
            rows.append(
                {
                    **dict(zip(keys, cfg, strict=True)),
                    "size": format_size(size_bytes),
                    "op": r.op,
                    "ratio": ratio.median,
                    "ci_low": ratio.low,
                    "ci_high": ratio.high,
                    "pairs": k,
                    "measurable": enough and ratio.differs,
                    "verdict": verdict(r.op, baseline, ratio)
                    if enough
                    else f"too few paired calls ({k} < {MIN_PAIRS}) to tell {r.op} from {baseline}",
                }
            )
    return pd.DataFrame(rows)


def unpaired_ratios(df: pd.DataFrame, a: tuple, b: tuple = ("nccl", "cuda"), op: str = "all_reduce") -> pd.DataFrame:
    """Notebook 03: (backend, device) a's median time over b's at each (world_size, size) both ran.

    a and b ran in different launches, so their calls are not paired: `apart` is True only where the two quartile
    ranges (p25-p75) do not overlap, the only points where the text names a winner.
    """
    part, keys = df[df["op"] == op], ["world_size", "size_bytes"]
    side = {
        name: part[(part["backend"] == be) & (part["device"] == dev)].set_index(keys)[["time_s", "p25_s", "p75_s"]]
        for name, (be, dev) in (("a", a), ("b", b))
    }
    both = side["a"].merge(side["b"], left_index=True, right_index=True, suffixes=("_a", "_b"))  # inner join
    both["ratio"] = both["time_s_a"] / both["time_s_b"]
    both["apart"] = (both["p25_s_a"] > both["p75_s_b"]) | (both["p75_s_a"] < both["p25_s_b"])
    return both.reset_index()
