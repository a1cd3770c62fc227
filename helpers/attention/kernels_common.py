"""What the FlashAttention-2 kernels share (helpers.attention.kernels, .kernels_backward): Triton itself (or None),
the log2 constants of the exp2 trick, and `_dot`, the one tl.dot they all call."""

from __future__ import annotations

import os

from helpers.env import import_triton

triton, tl = import_triton()  # (None, None) e.g. on macOS: the PyTorch paths still work

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): L = ln(2) * (m2 + log2(l)) for a max m2 in log2 units


if triton is not None:
    _INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")
    _LOG2E = tl.constexpr(LOG2E)
    _LN2 = tl.constexpr(LN2)

    @triton.jit
    def _dot(a, b, acc, PRECISION: tl.constexpr):
        """tl.dot accumulating in fp32; the interpreter gets fp32 copies, since its tl.dot multiplies bf16 bit
        patterns as integers (triton-lang/triton#11584). bf16 products are exact in fp32, so nothing changes."""
        if _INTERPRETED:
            a, b = a.to(tl.float32), b.to(tl.float32)
        return tl.dot(a, b, acc, input_precision=PRECISION)
