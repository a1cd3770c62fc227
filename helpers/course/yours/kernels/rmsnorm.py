"""RMSNorm checks (the 2024 edition): a student's Function against float64 with derived bounds, the likely mistakes
recognised by their whole signature, and which inputs the handout promises.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from helpers.course.yours.kernels.numerics import (
    DTYPE_MISMATCH,
    EPS,
    BackwardMissing,
    ShapeError,
    _grads,
    bounds,  # noqa: F401
    constant_factor,
    contiguous_twin,
    first_mismatch,
    matches,
    outputs,
    short,
    worst,
)


@dataclass(frozen=True)
class NormCase:
    """One RMSNorm input: shape, dtype, memory layout, and the rows' scale (small: mean(x^2) below eps)."""

    shape: tuple
    dtype: torch.dtype = torch.float32
    transposed: bool = False  # x is a non-contiguous view (the transpose of a contiguous tensor)
    scale: float = 1.0
    sliced: bool = False  # x is x_wide[..., :H] of a wider tensor: rows further apart than H
    expanded: bool = False  # dy is one row expanded over the others (stride 0), as autograd may pass it

    def __str__(self) -> str:
        extra = (", non-contiguous" if self.transposed else "") + (f", |x| ~ {self.scale:g}" if self.scale != 1 else "")
        extra += (", x sliced from wider rows" if self.sliced else "") + (", dy expanded (stride 0)" * self.expanded)
        return f"{short(self.dtype)} {'x'.join(map(str, self.shape))}{extra}"


# 2024 handout and tests (rmsnorm, rmsnorm_triton): fp32, x of shape (..., H) with any H (the tests use 10 x 20 x 50;
# "your implementation should support arbitrary tensors"), g of shape (H,), eps = 1e-5 inside the square root; the
# benchmarks (pytorch_layernorm, rmsnorm_forward_benchmarking, rmsnorm_benchmarking) run rows of H = 1024 to 8192, so
# those widths are promised too (a row wider than one block of the kernel included). Views and 16-bit dtypes are
# probes beyond that: the handout's Triton example asserts contiguous inputs and allocates fp32.
NORM_CONTRACT = {
    "forward and both gradients vs float64, fp32 (..., H)": [
        NormCase((10, 20, 50)),
        NormCase((3, 5, 1000)),
        NormCase((7, 33)),
    ],
    "the benchmark's widths, H = 1024 to 8192": [
        NormCase((3, 1024)),
        NormCase((2, 3, 2048)),
        NormCase((3, 4096)),
        NormCase((2, 8192)),
    ],
    # mean(x^2) ~ 1e-6: eps = 1e-5 scales y by 1/sqrt(1.1e-5), eps = 1e-6 by 1/sqrt(2e-6), 2.3x apart
    "eps = 1e-5 inside the square root (rows with mean(x^2) below eps)": [NormCase((4, 96), scale=1e-3)],
}
# The autograd contract: a Function's backward gets whatever gradient autograd passes (y.sum().backward(): one value
# expanded, stride 0) and callers pass views; a wrapper may refuse a layout with a clear error (the handout's example
# asserts contiguity: reported as information), never be silently wrong on it.
NORM_LAYOUTS = {
    "an expanded upstream gradient (stride 0, as y.sum().backward() passes)": [NormCase((3, 4, 96), expanded=True)],
    "non-contiguous and sliced inputs (a transposed view; x[..., :H] of wider rows)": [
        NormCase((6, 72), transposed=True),
        NormCase((5, 96), sliced=True),
    ],
}
NORM_GPU_CONTRACT = {  # the benchmark's own sizes on a GPU (the gpu profile): 50,000 rows; the widest rows
    "the benchmark's sizes (50,000 rows; H to 8192)": [NormCase((50_000, 1024)), NormCase((4096, 8192))],
}
NORM_BEYOND = {
    "bf16 and fp16": [NormCase((3, 1000), torch.bfloat16), NormCase((3, 1000), torch.float16)],
    "a row wider than the benchmark's 8192": [NormCase((2, 10000))],
}
NORM_PROPERTIES = {**NORM_CONTRACT, **NORM_BEYOND}


def norm_inputs(case: NormCase, seed: int = 0, device="cpu") -> tuple[Tensor, Tensor, Tensor]:
    """x (case.shape, maybe a transposed view), g (H,), dy: drawn in fp32 on the CPU, cast and moved to `device`;
    x and g require grad."""
    gen = torch.Generator().manual_seed(seed)
    shape = case.shape[::-1] if case.transposed else (*case.shape[:-1], case.shape[-1] + 8 * case.sliced)
    x = (case.scale * torch.randn(*shape, generator=gen)).to(device, case.dtype)
    x = x.t() if case.transposed else x[..., : case.shape[-1]] if case.sliced else x
    x = x.requires_grad_()  # (..., H)
    g = (1 + 0.5 * torch.randn(case.shape[-1], generator=gen)).to(device, case.dtype).requires_grad_()  # (H,)
    dy = torch.randn(*case.shape, generator=gen).to(device, case.dtype)  # (..., H)
    dy = dy[(0,) * (dy.dim() - 1)].expand(case.shape) if case.expanded else dy  # (..., H), stride 0 but the last
    return x, g, dy


def norm_float64(
    x: Tensor,
    g: Tensor,
    dy: Tensor,
    eps: float = EPS,
    *,
    eps_outside: bool = False,
    sum_not_mean: bool = False,
    no_gain: bool = False,
) -> tuple[dict, dict]:
    """y, dx, dg in float64 from the same inputs (closed forms), and their scales (the same on |terms|).
    eps_outside / sum_not_mean / no_gain give the outputs of those mistakes (autograd on their forward), to
    recognise them."""
    x, g, dy = (t.detach().double().cpu() for t in (x, g, dy))
    H = x.shape[-1]
    if eps_outside or sum_not_mean or no_gain:
        xv, gv = x.clone().requires_grad_(), g.clone().requires_grad_()
        ms = (xv * xv).sum(-1, keepdim=True) / (1 if sum_not_mean else H)  # (..., 1)
        r = 1 / (ms.sqrt() + eps) if eps_outside else torch.rsqrt(ms + eps)  # (..., 1)
        y = xv * r * (1 if no_gain else gv)  # (..., H)
        dx, dg = torch.autograd.grad(y, (xv, gv), dy, allow_unused=True)
        dg = torch.zeros_like(g) if dg is None else dg
        return {"y": y.detach(), "dx": dx, "dg": dg}, norm_float64(x, g, dy, eps)[1]
    ms = (x * x).sum(-1, keepdim=True) / H  # (..., 1)
    r = torch.rsqrt(ms + eps)  # (..., 1)
    y = x * r * g  # (..., H)
    dyg = dy * g  # (..., H)
    dx = r * dyg - x * r**3 * (dyg * x).mean(-1, keepdim=True)  # (..., H)
    dg = (dy * x * r).reshape(-1, H).sum(0)  # (H,)
    scales = {
        "y": y.abs(),
        "dx": r * dyg.abs() + x.abs() * r**3 * (dyg * x).abs().mean(-1, keepdim=True),
        "dg": (dy * x * r).abs().reshape(-1, H).sum(0),
    }
    return {"y": y, "dx": dx, "dg": dg}, scales


def norm_bounds(x: Tensor, scales: dict, dtype: torch.dtype) -> dict:
    H, rows = x.shape[-1], x.numel() // x.shape[-1]
    return bounds(scales, dtype, {"y": H, "dx": 2 * H, "dg": rows})


def norm_layout_outputs(apply, case: NormCase, device="cpu") -> tuple:
    """For suites.layout_check: (a call giving the layout case's y, dx, dg; the same implementation's outputs on the
    same values laid out contiguously, run now; their bounds)."""
    x, g, dy = norm_inputs(case, device=device)
    names = ("y", "dx", "dg")
    dense = outputs(apply, contiguous_twin((x, g)), dy.contiguous(), names)
    _, scales = norm_float64(x, g, dy)
    return (lambda: outputs(apply, (x, g), dy, names)), dense, norm_bounds(x, scales, case.dtype)


NORM_MISTAKES = [  # (what the mistake is, norm_float64's keywords that reproduce it)
    ("eps added outside the square root: 1 / (sqrt(mean(x^2)) + eps)", dict(eps_outside=True)),
    ("sum of squares instead of their mean (divide by H)", dict(sum_not_mean=True)),
    ("the gain g is not applied", dict(no_gain=True)),
]
SMALLER_EPS = (0.0, 1e-6, 1e-8, 1e-12)  # eps missing or smaller than the course's 1e-5


def norm_mistake(got: dict, x, g, dy) -> str:
    """The likely mistake when every output matches a known wrong formula (within the same bounds), else ''."""
    for label, kwargs in NORM_MISTAKES:
        want, scales = norm_float64(x, g, dy, **kwargs)
        if matches(got, want, norm_bounds(x, scales, x.dtype)):
            return f"likely mistake: {label}"
    eps = [e for e in SMALLER_EPS if matches(got, *_with_bounds(x, norm_float64(x, g, dy, e)))]
    if len(eps) == 1:
        return (
            "likely mistake: no eps, 1 / sqrt(mean(x^2))" if eps[0] == 0 else f"likely mistake: eps = {eps[0]:g}"
        ) + " (the course's eps is 1e-5, inside the square root)"
    if eps:
        return "likely mistake: eps missing or smaller than the course's 1e-5 (these rows cannot tell which)"
    want, bound = _with_bounds(x, norm_float64(x, g, dy))
    if "dg" in got and got["dg"].shape != want["dg"].shape:
        return "likely mistake: dg is not summed over the rows (it must have g's shape)"
    wrong = [k for k in got if got[k].shape == want[k].shape and worst(k, got[k], want[k], bound[k]) is not None]
    if len(wrong) == 1:
        return constant_factor(wrong[0], got[wrong[0]], want[wrong[0]], bound[wrong[0]])
    return ""


def _with_bounds(x: Tensor, want_scales: tuple[dict, dict]) -> tuple[dict, dict]:
    want, scales = want_scales
    return want, norm_bounds(x, scales, x.dtype)


def check_norm_function(apply, case: NormCase, device="cpu") -> str:
    """'' when y = apply(x, g) and its gradients are within the bounds, else what differed."""
    x, g, dy = norm_inputs(case, device=device)
    y = apply(x, g)
    if not isinstance(y, Tensor):
        raise ShapeError(f"apply(x, g) returned {type(y).__name__}, expected a tensor")
    if y.dtype != x.dtype:
        return f"{case}: y is {y.dtype}, {DTYPE_MISMATCH} {x.dtype}"
    want, scales = norm_float64(x, g, dy)
    bound = norm_bounds(x, scales, case.dtype)
    m = worst("y", y, want["y"], bound["y"])  # the forward first: its error explains the gradients'
    dx, dg = _grads(y, (x, g), dy)
    got = {"y": y} if not isinstance(dx, Tensor) or not isinstance(dg, Tensor) else {"y": y, "dx": dx, "dg": dg}
    if m is not None:  # the forward's own signature names the mistake (the gradients follow from it)
        return f"{case}: {m}. {norm_mistake({'y': y}, x, g, dy)}".strip()
    if isinstance(dx, str):
        raise BackwardMissing(f"{case}: forward within its bounds")
    if dx is None or dg is None:
        return f"{case}: no gradient for {'x' if dx is None else 'g'} (is backward returning it?)"
    try:
        m = first_mismatch(got, want, bound)
    except ShapeError as exc:
        return f"{case}: {exc}. {norm_mistake(got, x, g, dy)}".strip()
    return "" if m is None else f"{case}: {m}. {norm_mistake(got, x, g, dy)}".strip()


def check_norm_backward(fn, which: str, case: NormCase) -> str:
    """The 2024 edition's standalone backward functions: fn(dy, x, g) -> dg (which='dg') or dx, against float64."""
    x, g, dy = norm_inputs(case)
    got = fn(dy, x.detach(), g.detach())
    if not isinstance(got, Tensor):
        raise ShapeError(f"returned {type(got).__name__}, expected a tensor")
    want, scales = norm_float64(x, g, dy)
    bound = norm_bounds(x, scales, case.dtype)[which]
    m = worst(which, got, want[which], bound)
    return "" if m is None else f"{case}: {m}. {norm_mistake({which: got}, x, g, dy)}".strip()
