"""The numerics of `yours`' kernel checks: an output against its float64 reference, with a bound derived from the
dtype (norm_checks and attn_checks use these).

The bound of every output element is (k * u + n * u32) * scale + 2 * dS * scale for attention, where
- u is the unit roundoff of the input dtype (2^-24 fp32, 2^-8 bf16, 2^-11 fp16) and k the roundings a straightforward
  implementation makes in that dtype (each elementwise op once: ROUNDINGS);
- n * u32 is a float32 sum of n terms (the reduction over H, the rows, or the keys), the worst case;
- scale is the same expression evaluated on absolute values in float64 (sum |terms|), so cancellation cannot
  hide an error and an exact zero gets a bound of zero only where every term is zero;
- dS, for attention, is the scores' own error (u * |S| + d * u32 * |q||k| / sqrt(d)), which exp() turns into a
  relative error of at most 2 dS in P.
The float64 reference is computed from the very inputs the implementation got (already rounded to its dtype).
A failure names the tensor, the index, the values, the bound, and the likely mistake when every output matches it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

U32 = torch.finfo(torch.float32).eps / 2
EPS = 1e-5  # the course's RMSNorm epsilon
DTYPE_MISMATCH = "expected the input's dtype"  # in the message of an output of another dtype
ROUNDINGS = {"y": 8, "dx": 16, "dg": 16, "o": 8, "lse": 8, "dq": 16, "dk": 16, "dv": 16}


def unit(dtype: torch.dtype) -> float:
    """Unit roundoff of a floating dtype: half its machine epsilon."""
    return torch.finfo(dtype).eps / 2


def short(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}[dtype]


@dataclass
class Mismatch:
    """The worst element of one tensor against its float64 reference and bound."""

    tensor: str
    index: tuple
    got: float
    want: float
    bound: float

    def __str__(self) -> str:
        err = abs(self.got - self.want)
        times = f"{err / self.bound:.3g}x the bound" if self.bound > 0 and math.isfinite(err) else "not finite"
        return (
            f"{self.tensor}{list(self.index)} = {self.got:.6g}, float64 says {self.want:.6g}: error {err:.3g} "
            f"against a bound of {self.bound:.3g} ({times})"
        )


def worst(tensor: str, got: Tensor, want: Tensor, bound: Tensor) -> Mismatch | None:
    """The element that exceeds its bound the most (a NaN or inf counts first); None when all are within."""
    if got.shape != want.shape:
        raise ShapeError(f"{tensor} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    g = got.detach().double().cpu()
    excess = (g - want).abs() / bound.clamp_min(1e-300)
    excess = torch.where(torch.isfinite(g), excess, torch.full_like(excess, math.inf))
    i = int(excess.argmax())
    if excess.flatten()[i] <= 1:
        return None
    idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), g.shape))
    return Mismatch(tensor, idx, float(g[idx]), float(want[idx]), float(bound[idx]))


class ShapeError(ValueError):
    """An output of the wrong shape or kind."""


class BackwardMissing(Exception):
    """The forward is within its bounds and the backward raises NotImplementedError (a student part-way through)."""


def _grads(out: Tensor, inputs: tuple, grad_out: Tensor) -> tuple:
    """The gradients of `out` with respect to `inputs`; Nones when the backward raises NotImplementedError (the
    caller checks the forward alone, then raises BackwardMissing)."""
    if not out.requires_grad:
        return (None,) * len(inputs)
    try:
        return torch.autograd.grad(out, inputs, grad_out, allow_unused=True)
    except NotImplementedError:
        return ("not implemented",) * len(inputs)


def first_mismatch(got: dict, want: dict, bound: dict) -> Mismatch | None:
    for name in want:
        m = worst(name, got[name], want[name], bound[name])
        if m is not None:
            return m
    return None


def bounds(scales: dict, dtype: torch.dtype, terms: dict, extra: float = 0.0) -> dict:
    """name -> (ROUNDINGS[name] * u + terms[name] * u32 + extra) * scale: each output's derived bound."""
    u = unit(dtype)
    return {k: (ROUNDINGS[k] * u + terms[k] * U32 + extra) * s + 1e-30 for k, s in scales.items()}


def outputs(fn, inputs: tuple, grad_out: Tensor, names: tuple) -> dict:
    """{names[0]: fn(*inputs), and the gradients of inputs under names[1:] when the backward gives them}."""
    out = fn(*inputs)
    if not isinstance(out, Tensor):
        raise ShapeError(f"returned {type(out).__name__}, expected a tensor")
    grads = _grads(out, inputs, grad_out)
    if not all(isinstance(g, Tensor) for g in grads):
        return {names[0]: out}
    return {names[0]: out, **dict(zip(names[1:], grads, strict=True))}


def contiguous_twin(inputs: tuple) -> tuple:
    """The same values, each laid out contiguously (a new leaf when the input was one that requires grad)."""
    return tuple(t.detach().contiguous().requires_grad_(t.requires_grad) for t in inputs)


def layout_differs(got: dict, dense: dict, bound: dict) -> str:
    """'' when each output of a layout case is within twice its rounding bound of the same implementation's output on
    the same values laid out contiguously, else the worst element: the layout is read wrong, whatever else is. Not
    judged ('') where the contiguous outputs are not finite."""
    for name, d in dense.items():
        want = d.detach().double().cpu()
        if name not in got or not torch.isfinite(want).all():
            return ""
        m = worst(name, got[name], want, 2 * bound[name])
        if m is not None:
            return (
                f"{m.tensor}{list(m.index)} = {m.got:.6g}, but {m.want:.6g} on the same values laid out contiguously "
                f"(a difference of {abs(m.got - m.want):.3g}; twice the rounding bound is {m.bound:.3g})"
            )
    return ""


def matches(got: dict, want: dict, bound: dict) -> bool:
    """Every output in `got` within its bound of `want` (the same shape): the whole signature of a variant."""
    return bool(got) and all(
        k in want and got[k].shape == want[k].shape and worst(k, got[k], want[k], bound[k]) is None for k in got
    )


def constant_factor(name: str, got: Tensor, want: Tensor, bound: Tensor) -> str:
    """'dx is 0.5x the right gradient ...' when got is a constant multiple c != 1 of want within c x the bound."""
    g, w = got.detach().double().cpu(), want
    if g.shape != w.shape or not torch.isfinite(g).all() or float((w * w).sum()) == 0:
        return ""
    c = float((g * w).sum() / (w * w).sum())
    if abs(c - 1) < 1e-3 or abs(c) < 1e-6 or worst(name, g, c * w, abs(c) * bound) is not None:
        return ""
    return (
        f"likely mistake: {name} is {c:.4g}x the right value everywhere (a constant factor: a scale missing or extra)"
    )


def saved_tensors(fn) -> tuple[object, list[Tensor]]:
    """fn()'s result and every tensor autograd saved for its backward."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, saved
