"""What every section of notebook 01 shares: one pass of a model (optionally under autocast), an out-of-memory guard,
the precision column, a step's estimated seconds for the budget, and the cold/warm split of section 1's rows.

    fn = pass_fn(lm, x, y, "both", torch.bfloat16)          # forward+backward under autocast, as a callable
    result = guarded(fn)                                     # or "OOM" when the GPU ran out of memory
"""

from __future__ import annotations

import contextlib

import pandas as pd
import torch

from helpers import formulas
from helpers.model import lm_loss

MiB = 2**20


NOT_TIMED = "not timed here (budget)"

# Cited reference figures, typed from the seed writeup (one H100, batch 16 × context 128, fp32/TF32). Not ours.
SEED = "004_7287c5c69baef1ef.txt"
SEED_H100 = {
    "both_s": {"small": 2.41e-2, "medium": 5.36e-2, "large": 1.04e-1, "xl": 1.80e-1, "2.7B": 2.13e-1},  # §2.1.1(b)
    "mm share, fwd+bwd": 0.30,
    "mm share, full step": 0.18,  # §2.1.2(d)
    "RMSNorm share": 0.0291,
    "softmax share": 0.0288,  # §2.1.3(b, c), xl
    "peak_full_step_GiB": {"small": 2.81, "medium": 7.19, "large": 13.72, "xl": 23.88, "2.7B": 38.56},  # §2.4.1(b)
    "residual stream 2.7B MiB": 20,  # §2.4.1(d)
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


PASSES = ("forward", "backward", "both")  # what pass_fn times; "step" (both, then AdamW's step) where asked (2026)


def pass_fn(lm, x, y, kind: str, autocast_dtype=None):
    """A callable for one pass of `lm`: "forward" (building the graph), "backward" (re-run on one retained graph),
    "both", or "step" (gradients set to None, forward, backward and AdamW's step, an AdamW made here: a full training
    step, whose in-place update would break a graph "backward" still holds: time it after that one is freed); the
    forward runs under autocast when `autocast_dtype` is given."""

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
    if kind == "step":
        opt = torch.optim.AdamW(lm.parameters())

        def step():
            opt.zero_grad(set_to_none=True)
            loss().backward()
            opt.step()

        return step
    raise ValueError(f"kind={kind!r}: use 'forward', 'backward', 'both' or 'step'")


def step_estimate(size, batch_size: int, context_length: int, cal, bf16: bool = False, fp32_s=None) -> float:
    """Seconds of one forward+backward of `size` (Calibration.step_s of its training FLOPs): fp32_s when measured."""
    return cal.step_s(formulas.train_flops(size, batch_size, context_length), bf16=bf16, fp32_s=fp32_s)


def warm_cold(times: pd.DataFrame, warmup: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The runs that fit, indexed by (size, pass): (cold, without warm-up; warm, after `warmup` steps)."""
    ok = times[times["status"] == "ok"].set_index(["size", "pass", "warm-up"])
    return ok.xs(0, level="warm-up"), ok.xs(warmup, level="warm-up")
