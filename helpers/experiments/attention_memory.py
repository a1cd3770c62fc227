"""Notebook 06's memory: the bytes one forward leaves live for backward (beyond q, k, v) and its peak, measured by
helpers.memory.track, beside the closed form (naive keeps the T x T probabilities, FlashAttention only L).

    saved_memory("flash_pytorch", (2, 1, 512, 64))          # bytes live before backward, measured and closed form
"""

from __future__ import annotations

import math

import torch

from helpers import attention as A
from helpers.experiments.attention_impls import attention_fn, inputs, is_oom


def saved_bytes_formula(impl: str, shape, dtype=torch.float32, is_causal: bool = False) -> int:
    """Bytes a forward leaves live for backward beyond q, k, v: naive keeps P (one score matrix), the output and
    (causal) a bool mask; FlashAttention keeps the output and L (fp32, one number per query row)."""
    B, H, T, d = shape
    out = B * H * T * d * dtype.itemsize
    if impl == "naive":
        return A.score_matrix_bytes(B * H, T, T, dtype) + out + (T * T if is_causal else 0)
    if impl in ("flash_pytorch", "flash_triton"):
        return out + B * H * T * torch.promote_types(dtype, torch.float32).itemsize
    raise ValueError(f"no closed form for {impl!r}; known: naive, flash_pytorch, flash_triton")


def saved_memory(impl: str, shape, dtype=torch.float32, device="cpu", is_causal: bool = False) -> dict:
    """Run one forward under helpers.memory.track; the bytes live before backward (beyond q, k, v) and the peak,
    measured, beside saved_bytes_formula (notebook 06 sections 1 and 5)."""
    from helpers.memory import track

    B, H, T, d = shape
    row = dict(
        impl=impl,
        batch=B,
        heads=H,
        T=T,
        d=d,
        dtype=str(dtype).replace("torch.", ""),
        causal=is_causal,
        formula_bytes=saved_bytes_formula(impl, shape, dtype, is_causal),
        score_matrix_bytes=A.score_matrix_bytes(B * H, T, T, dtype),
    )
    try:
        q, k, v, _ = inputs(shape, dtype, device)
        fn = attention_fn(impl, q, is_causal)
        trace = track(lambda: fn(q, k, v), existing=(q, k, v), device=device)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
        if not is_oom(err):
            raise
        return dict(row, oom=True, saved_bytes=math.nan, peak_bytes=math.nan)
    return dict(
        row,
        oom=False,
        saved_bytes=trace.current_bytes - trace.baseline_bytes,
        peak_bytes=trace.peak_bytes - trace.baseline_bytes,
    )
