"""Notebook 01 §3 (the 2025 nsys_profile question): inside self-attention's forward, the softmax's time against the
two matmuls around it (QKᵀ and PV), each op timed alone at the model's attention shapes, interleaved in one loop,
beside their FLOPs. A profiler table cannot answer this on a GPU: its rows are kernels, and a batched matmul's kernel
is named like every other GEMM.

    parts = attention_parts(get_config("small/cpu"), batch=4, context=32, device="cpu")
    parts.table            # op, median ms, FLOPs, GFLOP/s; parts.ratio: softmax / (QKᵀ + PV), paired per round
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from helpers.model import softmax as staff_softmax
from helpers.results import save_results
from helpers.timing import Ratio, compare, paired_ratio, ratio_columns

SOFTMAX_FLOPS_PER_SCORE = 5  # max, subtract, exp, sum, divide: one each per score element
MEMORY_BOUND_FACTOR = 3  # "bytes set its time" only when the time share's lower bound is 3x the FLOP share or more


@dataclass
class AttentionParts:
    """The three timed ops: their table (one row per op), the paired ratio softmax / (QKᵀ + PV) with its spread, and
    the FLOP ratio it is read against."""

    table: pd.DataFrame
    ratio: Ratio
    flop_ratio: float
    shape: tuple  # (batch, heads, context, head_dim)

    saved: Path | None = None

    def summary(self) -> str:
        """One sentence from the same values as the table; the reading only where the interval supports it."""
        b, h, t, d = self.shape
        head = (
            f"At batch {b} x {h} heads x {t} x d_head {d}, softmax does {self.flop_ratio:.1%} of QKᵀ and PV's FLOPs "
            f"and takes {self.ratio.median:.2f}x their time ({self.ratio})"
        )
        if self.ratio.enough and self.ratio.low > MEMORY_BOUND_FACTOR * self.flop_ratio:
            return head + (
                f": over {MEMORY_BOUND_FACTOR}x its FLOP share. It reads and writes every score once, as the matmuls "
                "do, with a handful of FLOPs each: bytes, not FLOPs, set its time."
            )
        return head + "."

    def rows(self) -> list[dict]:
        """The table as saved rows, the paired ratio as one more row."""
        rows = self.table.reset_index().to_dict(orient="records")
        return rows + [{"op": "softmax / (QKᵀ + PV)", **ratio_columns(self.ratio), "flop_ratio": self.flop_ratio}]


def attention_flops(batch: int, heads: int, context: int, head_dim: int) -> dict[str, float]:
    """FLOPs of QKᵀ, the softmax and PV for one attention forward (a T x T score matrix per head; causal masking
    does not change the dense count)."""
    scores = batch * heads * context * context
    return {"QKᵀ": 2 * scores * head_dim, "softmax": SOFTMAX_FLOPS_PER_SCORE * scores, "PV": 2 * scores * head_dim}


def attention_parts(
    cfg,
    batch: int,
    context: int,
    device="cpu",
    steps: int = 20,
    warmup: int = 3,
    profile: str | None = None,
    **extra,
) -> AttentionParts:
    """QKᵀ, the masked scores' softmax and PV as the model runs them (helpers.model.CausalSelfAttention), each timed
    alone, interleaved (timing.compare: CUDA events on a GPU); saved as 01_attention_parts when `profile` is given,
    with `extra` as provenance."""
    heads, d = cfg.n_heads, cfg.d_model // cfg.n_heads
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, context, d, generator=gen).to(device) for _ in range(3))  # (B, H, T, d)
    mask = torch.ones(context, context, dtype=torch.bool, device=device).tril()  # (T, T)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(~mask, float("-inf"))  # (B, H, T, T)
    soft = staff_softmax if cfg.block_ops == "staff" else torch.softmax  # the staff's exp / sum, or one op
    att = soft(scores, dim=-1)  # (B, H, T, T)
    fns = {
        "QKᵀ": lambda: q @ k.transpose(-2, -1),  # (B, H, T, T)
        "softmax": lambda: soft(scores, dim=-1),  # (B, H, T, T)
        "PV": lambda: att @ v,  # (B, H, T, d)
    }
    comp = compare(fns, steps=steps, warmup=warmup, device=device, baseline="QKᵀ")
    flops = attention_flops(batch, heads, context, d)
    matmuls = [a + b for a, b in zip(comp.samples["QKᵀ"], comp.samples["PV"], strict=True)]
    table = comp.table()[["median_s", "p25_s", "p75_s"]].assign(flops=pd.Series(flops))
    table["GFLOP/s"] = table["flops"] / table["median_s"] / 1e9
    table.index.name = "op"
    parts = AttentionParts(
        table=table,
        ratio=paired_ratio(comp.samples["softmax"], matmuls),
        flop_ratio=flops["softmax"] / (flops["QKᵀ"] + flops["PV"]),
        shape=(batch, heads, context, d),
    )
    if profile is not None:
        parts.saved = save_results(
            parts.rows(), "01_attention_parts", profile=profile, size=cfg.name, batch=batch, context=context, **extra
        )
    return parts
