"""The kernel topics of `yours`: a student's RMSNorm and FlashAttention-2 against float64, with bounds derived from
the dtype, and timed beside ours and PyTorch's.

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

What counts is what each edition's handout and tests promise (../shared/curricula.md, "The contract"): RMSNorm in fp32
on (..., H) with eps 1e-5; FlashAttention-2 in fp32 on 3-D (batch, T, d) with T and d powers of two, at least 16, N_q
and N_k possibly different; the PyTorch version may ignore is_causal. Everything else (bf16, non-contiguous views,
lengths that are not tile multiples, 4-D inputs, an enforced causal mask in the PyTorch version) is a probe "beyond
the handout": reported, never in the exit status. A Triton case this environment cannot run (no GPU for a wrapper
that asks for CUDA, a Triton without block pointers, a case the companion's own kernel fails here) is "needs a GPU" or
"needs another Triton", not a failure.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from helpers.course.yours import Options
from helpers.course.yours import adapters as A
from helpers.course.yours.report import (ERROR, FAIL, NEEDS_GPU, NEEDS_TRITON, NOT_IMPLEMENTED, PASS, SKIPPED, Check,
                                         TopicResult)
from helpers.timing import MIN_PAIRS, compare, ratio_columns, verdict

U32 = torch.finfo(torch.float32).eps / 2
EPS = 1e-5  # the course's RMSNorm epsilon
ROUNDINGS = {"y": 8, "dx": 16, "dg": 16, "o": 8, "lse": 8, "dq": 16, "dk": 16, "dv": 16}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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
        return (f"{self.tensor}{list(self.index)} = {self.got:.6g}, float64 says {self.want:.6g}: error {err:.3g} "
                f"against a bound of {self.bound:.3g} ({times})")


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


# ---- RMSNorm --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NormCase:
    """One RMSNorm input: shape, dtype, memory layout, and the rows' scale (small: mean(x^2) below eps)."""
    shape: tuple
    dtype: torch.dtype = torch.float32
    transposed: bool = False  # x is a non-contiguous view (the transpose of a contiguous tensor)
    scale: float = 1.0

    def __str__(self) -> str:
        extra = (", non-contiguous" if self.transposed else "") + (f", |x| ~ {self.scale:g}" if self.scale != 1 else "")
        return f"{short(self.dtype)} {'x'.join(map(str, self.shape))}{extra}"


# 2024 handout and tests (rmsnorm, rmsnorm_triton): fp32, x of shape (..., H) with any H (the tests use 10 x 20 x 50),
# g of shape (H,), eps = 1e-5 inside the square root. The Triton examples assert contiguous inputs and fit a row in
# one block: wider rows, views and 16-bit dtypes are probes beyond that.
NORM_CONTRACT = {
    "forward and both gradients vs float64, fp32 (..., H)": [NormCase((10, 20, 50)), NormCase((3, 5, 1000)),
                                                             NormCase((7, 33))],
    "eps = 1e-5 inside the square root (rows with mean(x^2) below eps)": [NormCase((4, 96), scale=1e-3)],
}
NORM_BEYOND = {
    "bf16 and fp16": [NormCase((3, 1000), torch.bfloat16), NormCase((3, 1000), torch.float16)],
    "non-contiguous input (a transposed view)": [NormCase((6, 72), transposed=True)],
    "a row wider than 4096": [NormCase((4, 4100))],
}
NORM_PROPERTIES = {**NORM_CONTRACT, **NORM_BEYOND}


def norm_inputs(case: NormCase, seed: int = 0, device="cpu") -> tuple[Tensor, Tensor, Tensor]:
    """x (case.shape, maybe a transposed view), g (H,), dy: drawn in fp32 on the CPU, cast and moved to `device`;
    x and g require grad."""
    gen = torch.Generator().manual_seed(seed)
    shape = case.shape[::-1] if case.transposed else case.shape
    x = (case.scale * torch.randn(*shape, generator=gen)).to(device, case.dtype)
    x = (x.t() if case.transposed else x).requires_grad_()  # (..., H)
    g = (1 + 0.5 * torch.randn(case.shape[-1], generator=gen)).to(device, case.dtype).requires_grad_()  # (H,)
    dy = torch.randn(*case.shape, generator=gen).to(device, case.dtype)  # (..., H)
    return x, g, dy


def norm_float64(x: Tensor, g: Tensor, dy: Tensor, eps: float = EPS, *, eps_outside: bool = False,
                 sum_not_mean: bool = False, no_gain: bool = False) -> tuple[dict, dict]:
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
    dx = r * dyg - x * r ** 3 * (dyg * x).mean(-1, keepdim=True)  # (..., H)
    dg = (dy * x * r).reshape(-1, H).sum(0)  # (H,)
    scales = {"y": y.abs(), "dx": r * dyg.abs() + x.abs() * r ** 3 * (dyg * x).abs().mean(-1, keepdim=True),
              "dg": (dy * x * r).abs().reshape(-1, H).sum(0)}
    return {"y": y, "dx": dx, "dg": dg}, scales


def norm_bounds(x: Tensor, scales: dict, dtype: torch.dtype) -> dict:
    H, rows = x.shape[-1], x.numel() // x.shape[-1]
    return bounds(scales, dtype, {"y": H, "dx": 2 * H, "dg": rows})


NORM_MISTAKES = [  # (what the mistake is, norm_float64's keywords that reproduce it)
    ("eps added outside the square root: 1 / (sqrt(mean(x^2)) + eps)", dict(eps_outside=True)),
    ("sum of squares instead of their mean (divide by H)", dict(sum_not_mean=True)),
    ("the gain g is not applied", dict(no_gain=True)),
]
SMALLER_EPS = (0.0, 1e-6, 1e-8, 1e-12)  # eps missing or smaller than the course's 1e-5


def matches(got: dict, want: dict, bound: dict) -> bool:
    """Every output in `got` within its bound of `want` (the same shape): the whole signature of a variant."""
    return bool(got) and all(k in want and got[k].shape == want[k].shape and worst(k, got[k], want[k], bound[k]) is None
                             for k in got)


def constant_factor(name: str, got: Tensor, want: Tensor, bound: Tensor) -> str:
    """'dx is 0.5x the right gradient ...' when got is a constant multiple c != 1 of want within c x the bound."""
    g, w = got.detach().double().cpu(), want
    if g.shape != w.shape or not torch.isfinite(g).all() or float((w * w).sum()) == 0:
        return ""
    c = float((g * w).sum() / (w * w).sum())
    if abs(c - 1) < 1e-3 or abs(c) < 1e-6 or worst(name, g, c * w, abs(c) * bound) is not None:
        return ""
    return f"likely mistake: {name} is {c:.4g}x the right value everywhere (a constant factor: a scale missing or extra)"


def norm_mistake(got: dict, x, g, dy) -> str:
    """The likely mistake when every output matches a known wrong formula (within the same bounds), else ''."""
    for label, kwargs in NORM_MISTAKES:
        want, scales = norm_float64(x, g, dy, **kwargs)
        if matches(got, want, norm_bounds(x, scales, x.dtype)):
            return f"likely mistake: {label}"
    eps = [e for e in SMALLER_EPS if matches(got, *_with_bounds(x, norm_float64(x, g, dy, e)))]
    if len(eps) == 1:
        return ("likely mistake: no eps, 1 / sqrt(mean(x^2))" if eps[0] == 0 else
                f"likely mistake: eps = {eps[0]:g}") + " (the course's eps is 1e-5, inside the square root)"
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
        return f"{case}: y is {y.dtype}, expected the input's dtype {x.dtype}"
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


# ---- FlashAttention-2 -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttnCase:
    """One attention input: (batch, Tq, d) as the handout's skeleton has it, or (batch, heads, Tq, d) with heads."""
    Tq: int
    Tk: int
    d: int
    is_causal: bool
    dtype: torch.dtype = torch.float32
    batch: int = 2
    heads: int = 0  # 0: 3-D inputs

    def __str__(self) -> str:
        lead = f"{self.batch}x{self.heads}" if self.heads else f"batch {self.batch}"
        return (f"{short(self.dtype)} {lead}, Tq={self.Tq}, Tk={self.Tk}, d={self.d}"
                f"{', causal' if self.is_causal else ''}")


# 2025/2026 handouts and tests (flash_forward, flash_backward): fp32, 3-D (batch, N, d), N and d powers of two and at
# least 16 (the tests: 4 x 128 x 64), N_q and N_k may differ, is_causal may be ignored by the PyTorch version; the
# Triton version masks causally (flash_forward (c)), with N_q = N_k there. Exactly one (batch, N_q) logsumexp is
# saved (the tests look for it).
ATTN_PYTORCH_CONTRACT = {
    "output and gradients vs float64, fp32 (batch, N, d)": [AttnCase(128, 128, 64, False, batch=4),
                                                            AttnCase(16, 16, 16, False)],
    "N_q != N_k (powers of two)": [AttnCase(64, 128, 32, False), AttnCase(128, 64, 32, False)],
    "head dims 16 to 128": [AttnCase(32, 32, 128, False)],
}
ATTN_CAUSAL_RUNS = {  # the PyTorch version: is_causal=True must run; the mask may be ignored
    "is_causal=True runs (the mask may be ignored)": [AttnCase(16, 16, 16, True), AttnCase(128, 128, 64, True)],
}
ATTN_TRITON_CONTRACT = {  # small batches: the CPU's interpreter runs every program in Python
    "output and gradients vs float64, fp32 (batch, N, d)": [AttnCase(128, 128, 64, False, batch=1)],
    "N_q != N_k (powers of two)": [AttnCase(64, 128, 32, False, batch=1)],
    "causal mask (query i sees keys j <= i)": [AttnCase(128, 128, 32, True, batch=1)],
    "head dims 16 to 128": [AttnCase(64, 64, 16, True, batch=1), AttnCase(32, 32, 128, False, batch=1)],
}
ATTN_BEYOND = {  # probes past the handout: tails, 4-D, bf16
    "lengths that are not tile multiples": [AttnCase(37, 37, 16, False, batch=1), AttnCase(48, 80, 32, False, batch=1),
                                            AttnCase(100, 100, 16, True, batch=1)],
    "4-D (batch, heads, N, d)": [AttnCase(32, 32, 32, True, batch=1, heads=2)],
    "bf16": [AttnCase(32, 32, 32, True, torch.bfloat16, batch=1)],
}
ATTN_PYTORCH_BEYOND = {"causal mask applied (optional for the PyTorch version)": [AttnCase(16, 16, 16, True),
                                                                                  AttnCase(128, 128, 64, True)],
                       **ATTN_BEYOND}
ATTN_PROPERTIES = {**ATTN_PYTORCH_CONTRACT, **ATTN_TRITON_CONTRACT, **ATTN_BEYOND}  # every case a correct one passes
LSE_CASE = AttnCase(64, 64, 32, False)


def attn_inputs(case: AttnCase, seed: int = 0, device="cpu") -> tuple[Tensor, ...]:
    """q, k, v (requiring grad) and do, drawn in fp32 on the CPU, then cast and moved to `device`."""
    gen = torch.Generator().manual_seed(seed)
    lead = (case.batch, case.heads) if case.heads else (case.batch,)

    def draw(T, grad=True):
        t = torch.randn(*lead, T, case.d, generator=gen).to(device, case.dtype)  # (*lead, T, d)
        return t.requires_grad_(grad)
    return draw(case.Tq), draw(case.Tk), draw(case.Tk), draw(case.Tq, grad=False)


def attn_float64(q, k, v, do, is_causal: bool, *, shift: int = 0, scaled: bool = True,
                 keys: int | None = None) -> tuple[dict, dict, float]:
    """o, lse, dq, dk, dv in float64 (closed forms of FA-2's backward), their scales, and the scores' worst error.
    shift moves the causal diagonal (query i sees keys j <= i + shift); scaled=False drops 1/sqrt(d); keys=n uses
    only the first n keys (their gradients stay zero beyond)."""
    q, k, v, do = (t.detach().double().cpu() for t in (q, k, v, do))
    Tk = k.shape[-2]
    if keys is not None:
        k, v = k[..., :keys, :], v[..., :keys, :]
    d = q.shape[-1]
    c = d ** -0.5 if scaled else 1.0
    s = q @ k.transpose(-2, -1) * c  # (..., Tq, Tk)
    if is_causal:
        mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril(shift).logical_not()  # (Tq, Tk) True: hidden
        s = s.masked_fill(mask, -math.inf)
    lse = torch.logsumexp(s, -1)  # (..., Tq)
    p = torch.exp(s - lse[..., None])  # (..., Tq, Tk)
    o = p @ v  # (..., Tq, d)
    dp = do @ v.transpose(-2, -1)  # (..., Tq, Tk)
    delta = (do * o).sum(-1, keepdim=True)  # (..., Tq, 1)
    ds = p * (dp - delta)  # (..., Tq, Tk)
    want = {"o": o, "lse": lse, "dq": ds @ k * c, "dk": ds.transpose(-2, -1) @ q * c, "dv": p.transpose(-2, -1) @ do}
    ads = p * (do.abs() @ v.abs().transpose(-2, -1) + (do * o).abs().sum(-1, keepdim=True))  # (..., Tq, Tk)
    scales = {"o": p @ v.abs(), "lse": torch.ones_like(lse) + lse.abs(), "dq": ads @ k.abs() * c,
              "dk": ads.transpose(-2, -1) @ q.abs() * c, "dv": p.transpose(-2, -1) @ do.abs()}
    if keys is not None and keys < Tk:  # the keys left out get zero gradients (and a zero scale)
        for name in ("dk", "dv"):
            pad = torch.zeros(*want[name].shape[:-2], Tk - keys, d, dtype=torch.float64)
            want[name], scales[name] = torch.cat([want[name], pad], -2), torch.cat([scales[name], pad], -2)
    s_abs = (q.abs() @ k.abs().transpose(-2, -1)) * c  # (..., Tq, Tk) sum of |terms| of each score
    finite = s.isfinite()
    return want, scales, (float(s.abs().where(finite, 0).amax()), float((d * s_abs).where(finite, 0).amax()))


def attn_bounds(scales: dict, case: AttnCase, score_err: tuple[float, float]) -> dict:
    """Derived bounds: roundings and float32 sums, plus the scores' error carried through exp (2 dS, relative);
    score_err = (max |S|, max d * sum|q||k|/sqrt(d)) from attn_float64."""
    s_max, s_abs_d = score_err
    dS = unit(case.dtype) * s_max + U32 * s_abs_d
    n = {"o": case.Tk, "lse": case.Tk, "dq": case.Tk + case.d, "dk": case.Tq + case.d, "dv": case.Tq}
    return bounds(scales, case.dtype, n, extra=2 * dS)


def attn_mistake(got: dict, q, k, v, do, case: AttnCase) -> str:
    """The likely mistake when every output in `got` (o, and dq, dk, dv when there) matches a known wrong variant
    within the same bounds, else ''."""
    variants = [("no 1/sqrt(d) scaling of the scores", dict(is_causal=case.is_causal, scaled=False))]
    if case.Tk > case.Tq:
        variants.append(("keys beyond the first N_q are ignored (the key loop must run over N_k, not N_q)",
                         dict(is_causal=case.is_causal, keys=case.Tq)))
    if case.is_causal:
        variants += [("the causal mask is shifted by one: query i also sees key i+1", dict(is_causal=True, shift=1)),
                     ("is_causal is ignored (no mask applied)", dict(is_causal=False))]
    for label, kwargs in variants:
        want, scales, err = attn_float64(q, k, v, do, **kwargs)
        if matches(got, want, attn_bounds(scales, case, err)):
            return f"likely mistake: {label}"
    if case.is_causal and not torch.isfinite(got["o"].detach()[..., 0, :]).all():
        return "likely mistake: the causal mask hides the diagonal (query 0 sees no key: NaN)"
    want, scales, err = attn_float64(q, k, v, do, case.is_causal)
    bound = attn_bounds(scales, case, err)
    wrong = [n for n in got if got[n].shape == want[n].shape and worst(n, got[n], want[n], bound[n]) is not None]
    return constant_factor(wrong[0], got[wrong[0]], want[wrong[0]], bound[wrong[0]]) if len(wrong) == 1 else ""


def saved_tensors(fn) -> tuple[object, list[Tensor]]:
    """fn()'s result and every tensor autograd saved for its backward."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, saved


def check_attn_function(apply, case: AttnCase, device="cpu", *, mask_optional: bool = False) -> str:
    """'' when o = apply(q, k, v, is_causal) and dq, dk, dv are within the bounds, else what differed.
    mask_optional: a causal case may also match the unmasked result (the PyTorch version may ignore is_causal)."""
    q, k, v, do = attn_inputs(case, device=device)
    o = apply(q, k, v, case.is_causal)
    if not isinstance(o, Tensor):
        raise ShapeError(f"apply(q, k, v, is_causal) returned {type(o).__name__}, expected the output tensor")
    if o.dtype != q.dtype:
        return f"{case}: o is {o.dtype}, expected the input's dtype {q.dtype}"
    grads = _grads(o, (q, k, v), do)
    got = {"o": o} if not all(isinstance(g, Tensor) for g in grads) else dict(zip(("o", "dq", "dk", "dv"), (o, *grads)))
    results = [_attn_differs(got, grads, q, k, v, do, case)]
    if mask_optional and results[0]:
        results.append(_attn_differs(got, grads, q, k, v, do, replace(case, is_causal=False)))
    return "" if not all(results) else results[0]


def _attn_differs(got: dict, grads, q, k, v, do, case: AttnCase) -> str:
    want, scales, err = attn_float64(q, k, v, do, case.is_causal)
    bound = attn_bounds(scales, case, err)
    want.pop("lse")
    m = worst("o", got["o"], want["o"], bound["o"])  # the forward first: its error explains the gradients'
    if m is not None:  # the forward's own signature names the mistake (the gradients follow from it)
        return f"{case}: {m}. {attn_mistake({'o': got['o']}, q, k, v, do, case)}".strip()
    if isinstance(grads[0], str):
        raise BackwardMissing(f"{case}: forward within its bounds")
    if len(got) == 1:
        return f"{case}: no gradient for {'qkv'[[gr is None for gr in grads].index(True)]} (is backward returning it?)"
    try:
        m = first_mismatch(got, want, bound)
    except ShapeError as exc:
        return f"{case}: {exc}"
    return "" if m is None else f"{case}: {m}. {attn_mistake(got, q, k, v, do, case)}".strip()


def check_lse_saved(apply, case: AttnCase = LSE_CASE, device="cpu") -> str:
    """Exactly one logsumexp (shape (batch, N_q), as the course's tests look for it) saved for backward, equal to
    float64's L."""
    q, k, v, do = attn_inputs(case, device=device)
    _, saved = saved_tensors(lambda: apply(q, k, v, case.is_causal))
    rows = [t for t in saved if tuple(t.shape) == tuple(q.shape[:-1])]
    if len(rows) != 1:
        return (f"{case}: {len(rows)} tensors of shape {tuple(q.shape[:-1])} saved for backward, expected exactly one "
                "(the logsumexp L = m + log(l)); " + ("saving m and l separately?" if len(rows) == 2 else
                                                      "backward must rebuild P from L"))
    want, scales, err = attn_float64(q, k, v, do, case.is_causal)
    m = worst("L", rows[0], want["lse"], attn_bounds(scales, case, err)["lse"])
    return "" if m is None else f"{case}: the saved (..., Tq) tensor is not the logsumexp of the scores: {m}"


def check_nothing_square_saved(apply, case: AttnCase = LSE_CASE, device="cpu") -> str:
    """Nothing (Tq, Tk)-sized saved for backward: the handout saves L, Q, K, V, O (beyond what the tests check)."""
    q, k, v, _ = attn_inputs(case, device=device)
    _, saved = saved_tensors(lambda: apply(q, k, v, case.is_causal))
    square = [tuple(t.shape) for t in saved if t.dim() >= 2 and tuple(t.shape[-2:]) == (case.Tq, case.Tk)]
    return f"{case}: a tensor of shape {square[0]} is saved for backward: O(T^2) memory; save L instead" if square else ""


# ---- Triton where it can run -------------------------------------------------------------------------------------

try:
    import triton
    import triton.language as tl
except ImportError:  # e.g. macOS: no Triton, so no Triton implementation can be judged here
    triton = None

if triton is not None:

    @triton.jit
    def _block_pointer_row_sums(x_ptr, y_ptr, n_rows, D: tl.constexpr, TILE: tl.constexpr):
        """The handout's style: a (TILE, D) tile through tl.make_block_ptr and tl.advance, summed along D."""
        pid = tl.program_id(0)
        x_block = tl.make_block_ptr(x_ptr, shape=(n_rows, D), strides=(D, 1), offsets=(pid * TILE, 0),
                                    block_shape=(TILE, D), order=(1, 0))
        y_block = tl.make_block_ptr(y_ptr, shape=(n_rows,), strides=(1,), offsets=(pid * TILE,), block_shape=(TILE,),
                                    order=(0,))
        x = tl.load(x_block, boundary_check=(0, 1), padding_option="zero")  # (TILE, D)
        tl.store(y_block, tl.sum(x, axis=1), boundary_check=(0,))
        x_block = tl.advance(x_block, (TILE, 0))  # what a key loop does; unused after




def block_pointer_probe(device: str) -> str:
    """'' when this Triton runs a kernel written in the handout's block-pointer style on `device`, else why not."""
    if triton is None:
        return "no Triton installed"
    try:
        x = torch.arange(40 * 16, dtype=torch.float32, device=device).reshape(40, 16)  # (40, 16)
        y = torch.empty(40, device=device)  # (40,)
        _block_pointer_row_sums[(3,)](x, y, 40, D=16, TILE=16)
        return "" if torch.allclose(y.cpu(), x.sum(1).cpu()) else "a block-pointer kernel gives wrong sums here"
    except Exception as exc:  # noqa: BLE001 - whatever this Triton says is the reason
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'block pointers unsupported'}"


@dataclass
class TritonRuntime:
    """What this environment's Triton can run: the device its kernels take inputs on, whether block pointers work,
    and, per case, whether the companion's own kernel passes it here (the proof a student's kernel is judged by)."""
    device: str
    block_pointers: str  # '' when they work, else why not
    ours: object  # the companion's Function.apply for this topic
    check: object  # check(apply, case, device) -> '' | what differed
    seen: dict = None

    def cannot_run(self, case) -> str:
        """'' when our kernel passes `case` here, else why this environment cannot judge a kernel on it."""
        if self.seen is None:
            self.seen = {}
        if case not in self.seen:
            try:
                detail = self.check(self.ours, case, self.device)
            except Exception as exc:  # noqa: BLE001
                detail = f"{type(exc).__name__}: {exc}"
            self.seen[case] = detail
        return self.seen[case]


def triton_runtime(topic: str) -> TritonRuntime:
    """The proof for a kernel topic: our Triton Function and its check, on the device Triton runs on here."""
    from helpers.attention import FlashAttentionTriton
    from helpers.rmsnorm import RMSNormTritonFunction

    device = "cuda" if torch.cuda.is_available() else "cpu"
    ours, check = ((RMSNormTritonFunction.apply, check_norm_function) if topic == "rmsnorm" else
                   (FlashAttentionTriton.apply, check_attn_function))
    return TritonRuntime(device, block_pointer_probe(device), ours, check)


GPU_WORDS = ("cuda", "gpu", "cannot be accessed from triton")  # "Pointer argument cannot be accessed from Triton"
BLOCK_POINTER_WORDS = ("make_block_ptr", "block_ptr", "tl.advance", "tensor descriptor", "tensor_descriptor")


def unrunnable(exc: BaseException, runtime: TritonRuntime) -> tuple[str, str] | None:
    """(NEEDS_GPU | NEEDS_TRITON, why) when a student's Triton code raised because this environment cannot run it:
    a wrapper that asks for CUDA tensors on a machine without one, or block pointers this Triton lacks."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    text = (f"{type(exc).__name__} {exc} " + " ".join(f.line or "" for f in frames)).lower()
    if runtime.block_pointers and (isinstance(exc, NotImplementedError) or any(w in text for w in BLOCK_POINTER_WORDS)):
        import triton as _triton

        return NEEDS_TRITON, (f"needs a Triton with block pointers: this environment's Triton {_triton.__version__} "
                              f"cannot run them ({runtime.block_pointers}); run with --python your assignment's "
                              ".venv/bin/python, where `uv sync` installs the course's Triton")
    if not torch.cuda.is_available():
        line = (frames[-1].line or "").lower() if frames else ""
        if any(w in str(exc).lower() for w in GPU_WORDS) or (isinstance(exc, AssertionError) and
                                                            any(w in line for w in ("cuda", "device", "gpu"))):
            return NEEDS_GPU, (f"needs a GPU: your code asks for CUDA tensors ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else line.strip()}), as the course's Triton "
                               "tests run on one; nothing is wrong with that")
    return None


# ---- running a topic: inside a launched worker (student code never runs in the driver) ---------------------------

def _function_class(adapter: A.Adapter, name: str):
    """The autograd.Function subclass an adapter returns, NOT_IMPLEMENTED, or ShapeError naming what came back."""
    cls = A.call(adapter.fns[name])
    if cls is A.NOT_IMPLEMENTED:
        return cls
    if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)):
        raise ShapeError(f"{name}() returned {cls!r}, expected a torch.autograd.Function subclass (the class itself, "
                         "not an instance)")
    return cls


@dataclass
class Suite:
    """Properties ({name: cases}) checked by check(apply, case, device); beyond: past the handout's promises."""
    properties: dict
    check: object
    beyond: bool = False


def _function_checks(adapter: A.Adapter, suites: list[Suite], runtime: TritonRuntime | None = None
                     ) -> tuple[object, list[Check]]:
    """An adapter that returns an autograd.Function: (its apply or None, the checks); a wrong return kind is an
    ERROR, NotImplementedError 'not implemented'. runtime: judge a Triton implementation only where ours runs."""
    topic, impl = adapter.topic, adapter.impl
    try:
        cls = _function_class(adapter, A.ADAPTERS[topic][impl][0])
    except Exception as exc:  # noqa: BLE001 - the student's getter raised or returned the wrong kind
        return None, [Check(topic, impl, "returns an autograd.Function", ERROR, str(exc))]
    if cls is A.NOT_IMPLEMENTED:
        return None, [Check(topic, impl, "implemented", NOT_IMPLEMENTED)]
    device = runtime.device if runtime else "cpu"
    checks = [c for suite in suites
              for c in _run_properties(topic, impl, suite.properties,
                                       lambda case, check=suite.check: check(cls.apply, case, device),
                                       beyond=suite.beyond, runtime=runtime)]
    if any(c.detail == FORWARD_ONLY for c in checks):  # a student part-way through: the forward still counts
        checks.append(Check(topic, impl, "backward implemented", NOT_IMPLEMENTED,
                            "backward raises NotImplementedError: the gradients were not checked"))
    return cls.apply, checks


def _run_properties(topic: str, impl: str, properties: dict, check, *, beyond: bool = False,
                    runtime: TritonRuntime | None = None) -> list[Check]:
    """One Check per property: the first failing case's detail, or pass; an exception in student code is ERROR;
    a case this environment cannot run (runtime) makes the property NEEDS_GPU / NEEDS_TRITON, not a failure."""
    out, forward_only = [], ""
    for prop, cases in properties.items():
        failed, cannot = None, None  # (status, detail): the first case that fails; the first that cannot run here
        for case in cases:
            try:
                detail = check(case)
                status = FAIL if detail else PASS
            except ShapeError as exc:
                status, detail = FAIL, f"{case}: {exc}"
            except BackwardMissing as exc:
                status, detail = PASS, ""
                forward_only = str(exc)
            except Exception as exc:  # noqa: BLE001 - the student's code raised: say what and where
                why = unrunnable(exc, runtime) if runtime else None
                if why:
                    cannot = cannot or (why[0], f"{case}: {why[1]}")
                    continue
                status, detail = ERROR, f"{case}: raised {type(exc).__name__}: {exc} (at {A.where(exc)})"
            why = runtime.cannot_run(case) if runtime and status != PASS else ""  # judged only where ours runs
            if why:
                cannot = cannot or (NEEDS_GPU, f"{case}: needs a GPU: this environment cannot run it (the companion's "
                                               f"own Triton kernel fails it here too: {why[:300]})")
                continue
            if status != PASS:
                failed = (status, detail)
                break
        status, detail = failed or cannot or (PASS, FORWARD_ONLY if forward_only else "")
        out.append(Check(topic, impl, prop, status, detail, beyond=beyond))
    return out


FORWARD_ONLY = "forward only: the backward is not implemented"


def _named(module, topic: str, res: TopicResult, only=None):
    """(adapter, its constructor's name) for each implementation of `topic` the file names (those in `only`, when
    given); a SKIPPED check in `res` for each it does not (another edition's)."""
    for adapter in A.implementations(module, topic):
        if only is not None and adapter.impl not in only:
            continue
        name = A.ADAPTERS[topic][adapter.impl][0]
        absent = _absent_or_missing(topic, adapter, name)
        if absent:
            res.checks.append(absent)
        else:
            yield adapter, name


def _absent_or_missing(topic: str, adapter: A.Adapter, name: str) -> Check | None:
    if not adapter.ok or name not in adapter.fns:
        return Check(topic, adapter.impl, "adapter present", SKIPPED, f"no {name} in the file (another edition's)")
    return None


def _fwd_bwd(apply, *inputs, grad_out):
    """A callable: apply(*inputs) and its backward with grad_out (what every timing row measures)."""
    leaves = [t for t in inputs if isinstance(t, Tensor) and t.requires_grad]
    return lambda: torch.autograd.grad(apply(*inputs), leaves, grad_out)


def timing_rows(topic: str, calls: dict, *, baseline: str, opts: Options, shape: str) -> list[dict]:
    """Every call timed in ONE interleaved loop; a row each: median, the paired ratio to `baseline`, the verdict."""
    comp = compare(calls, steps=max(opts.steps, MIN_PAIRS), warmup=opts.warmup, baseline=baseline)
    rows = []
    for label, samples in comp.samples.items():
        who, impl = label.split(":", 1)
        r = comp.ratio(label)
        rows.append({"topic": topic, "measure": "fwd+bwd time", "who": who, "impl": impl, "shape": shape,
                     "value": float(torch.tensor(samples).median()), "unit": "s", "device": comp.device,
                     "baseline": baseline, **ratio_columns(r),
                     "verdict": "" if label == baseline else verdict(label, baseline, r)})
    return rows


def saved_bytes(fn, inputs) -> int:
    """Bytes autograd keeps for fn(*inputs)'s backward beyond the inputs themselves (unique storages)."""
    _, saved = saved_tensors(lambda: fn(*inputs))
    own = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, Tensor)}
    kept = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}
    return sum(n for ptr, n in kept.items() if ptr not in own)


def memory_rows(topic: str, fns: dict, inputs, *, shape: str, formula: int | None) -> list[dict]:
    """Bytes each implementation saves for backward beyond its inputs, beside the closed form (FlashAttention: O, L)."""
    rows = [{"topic": topic, "measure": "saved for backward", "who": label.split(":", 1)[0],
             "impl": label.split(":", 1)[1], "shape": shape, "value": saved_bytes(f, inputs), "unit": "B"}
            for label, f in fns.items()]
    if formula is not None:
        rows.append({"topic": topic, "measure": "saved for backward", "who": "formula",
                     "impl": "FlashAttention-2: O and L", "shape": shape, "value": formula, "unit": "B"})
    return rows


def _passed(checks: list[Check], impl: str) -> bool:
    """Every check of `impl` within the handout passed: it is timed."""
    mine = [c for c in checks if c.impl == impl and not c.beyond]
    return bool(mine) and all(c.status == PASS for c in mine)


def _timed(res: TopicResult, timing) -> None:
    """Add timing()'s rows to res; an exception while timing is its own row, beside the checks already made (the
    timing shapes go past the handout's: it never changes the exit status)."""
    try:
        res.rows += timing()
    except Exception as exc:  # noqa: BLE001 - one failure hides nothing else
        res.checks.append(Check(res.topic, "-", "timing runs", ERROR,
                                f"raised {type(exc).__name__}: {exc} (at {A.where(exc)})", beyond=True))


def _applies(module, topic: str, impls) -> dict:
    """{impl: Function.apply} of the named implementations (already checked in another launch), for timing."""
    out = {}
    for adapter in A.implementations(module, topic):
        name = A.ADAPTERS[topic][adapter.impl][0]
        if adapter.impl in impls and adapter.ok and name.startswith("get_"):  # not the 2024 backward functions
            cls = _function_class(adapter, name)
            out[adapter.impl] = cls.apply
    return out


def rmsnorm_worker(adapters_path: str, opts: Options, impls=None, timed_impls=None) -> TopicResult:
    """The file's RMSNorm implementations checked (those in `impls`; None: all), then, when opts.timed, timed beside
    ours and PyTorch's: those that passed here, or `timed_impls` when given (checked in another launch). A launched
    rank: student code never runs in the driver."""
    from helpers.rmsnorm import RMSNormPyTorchFunction, RMSNormTritonFunction

    module, res, yours = A.load(adapters_path), TopicResult("rmsnorm"), {}
    suites = [Suite(NORM_CONTRACT, check_norm_function), Suite(NORM_BEYOND, check_norm_function, beyond=True)]
    for adapter, name in _named(module, "rmsnorm", res, impls):
        if adapter.impl in ("backward_g", "backward_x"):
            res.checks += _backward_checks(adapter, name)
            continue
        runtime = triton_runtime("rmsnorm") if adapter.impl == "triton" else None
        apply, checks = _function_checks(adapter, suites, runtime)
        res.checks += checks
        if apply is not None and _passed(checks, adapter.impl):
            yours[adapter.impl] = apply
    if timed_impls is not None:
        yours = _applies(module, "rmsnorm", timed_impls)
    rows, H = (1024, 1024) if opts.profile == "cpu" else (50_000, 4096)
    dtype = torch.float32 if opts.profile == "cpu" else torch.bfloat16
    if opts.timed:
        ours = {"pytorch": RMSNormPyTorchFunction.apply, "triton": RMSNormTritonFunction.apply}
        _timed(res, lambda: norm_timing(yours, rows=rows, H=H, dtype=dtype, opts=opts, ours=ours))
    return res


def _backward_checks(adapter: A.Adapter, name: str) -> list[Check]:
    """The 2024 edition's rmsnorm_backward_g/x_pytorch(dy, x, g) against float64 on the tests' shapes."""
    which = "dg" if adapter.impl == "backward_g" else "dx"
    fn = adapter.fns[name]
    probe = _probe(lambda: fn(*_tiny_norm_args()))
    if probe:
        return [Check("rmsnorm", adapter.impl, "implemented", *probe)]
    cases = next(iter(NORM_CONTRACT.values()))
    return _run_properties("rmsnorm", adapter.impl, {f"{which} vs float64, fp32 (..., H)": cases},
                           lambda c: check_norm_backward(fn, which, c))


def _tiny_norm_args():
    x, g, dy = norm_inputs(NormCase((2, 8)))
    return dy, x.detach(), g.detach()


def _probe(fn) -> tuple[str, str] | None:
    """(status, detail) when calling fn says 'not implemented' or raises; None when it returns."""
    try:
        return (NOT_IMPLEMENTED, "") if A.call(fn) is A.NOT_IMPLEMENTED else None
    except Exception as exc:  # noqa: BLE001
        return ERROR, f"raised {type(exc).__name__}: {exc} (at {A.where(exc)})"


def norm_timing(yours: dict, *, rows: int, H: int, dtype, opts: Options, ours: dict) -> list[dict]:
    """fwd+bwd of yours, ours and PyTorch's (F.rms_norm; compiled when opts.compiled) on (rows, H), interleaved.
    Triton implementations are timed on a GPU only (the CPU's interpreter measures Python, not the kernel)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, H, generator=gen).to(device, dtype).requires_grad_()  # (rows, H)
    g = (1 + 0.1 * torch.randn(H, generator=gen)).to(device, dtype).requires_grad_()  # (H,)
    dy = torch.randn(rows, H, generator=gen).to(device, dtype)  # (rows, H)
    fns = {f"ours:{k}": f for k, f in ours.items()}
    fns.update({f"yours:{k}": f for k, f in yours.items()})
    fns["pytorch:F.rms_norm"] = lambda x, g: F.rms_norm(x, (x.shape[-1],), g, EPS)
    if opts.compiled:
        fns["pytorch:compiled"] = torch.compile(lambda x, g: F.rms_norm(x, (x.shape[-1],), g, EPS), dynamic=False)
    if device == "cpu":
        fns = {k: f for k, f in fns.items() if not k.endswith("triton")}
    calls = {k: _fwd_bwd(f, x, g, grad_out=dy) for k, f in fns.items()}
    shape = f"{short(dtype)} {rows}x{H}"
    eager = {k: f for k, f in fns.items() if not k.endswith("compiled")}
    return (timing_rows("rmsnorm", calls, baseline="ours:pytorch", opts=opts, shape=shape)
            + memory_rows("rmsnorm", eager, (x, g), shape=shape, formula=None))


def attention_worker(adapters_path: str, opts: Options, impls=None, timed_impls=None) -> TopicResult:
    """The file's FlashAttention-2 implementations checked (those in `impls`; None: all), then, when opts.timed,
    timed beside ours and SDPA (those that passed, or `timed_impls`). A launched rank."""
    from helpers.attention import FlashAttentionPyTorch, FlashAttentionTriton

    module, res, yours = A.load(adapters_path), TopicResult("attention"), {}
    lse = Suite({"exactly one (batch, N_q) logsumexp saved for backward": [LSE_CASE]}, check_lse_saved)
    square = Suite({"nothing N_q x N_k saved for backward": [LSE_CASE]}, check_nothing_square_saved, beyond=True)
    for adapter, name in _named(module, "attention", res, impls):
        if adapter.impl == "triton":
            suites = [Suite(ATTN_TRITON_CONTRACT, check_attn_function), lse, Suite(ATTN_BEYOND, check_attn_function,
                                                                                   beyond=True), square]
        else:
            runs = functools.partial(check_attn_function, mask_optional=True)
            suites = [Suite(ATTN_PYTORCH_CONTRACT, check_attn_function), Suite(ATTN_CAUSAL_RUNS, runs), lse,
                      Suite(ATTN_PYTORCH_BEYOND, check_attn_function, beyond=True), square]
        runtime = triton_runtime("attention") if adapter.impl == "triton" else None
        apply, checks = _function_checks(adapter, suites, runtime)
        res.checks += checks
        if apply is not None and _passed(checks, adapter.impl):
            yours[adapter.impl] = apply
    if timed_impls is not None:
        yours = _applies(module, "attention", timed_impls)
    ours = {"pytorch": FlashAttentionPyTorch.apply, "triton": FlashAttentionTriton.apply}
    if opts.timed:
        _timed(res, lambda: attn_timing(yours, opts=opts, ours=ours))
    return res


def attn_timing(yours: dict, *, opts: Options, ours: dict) -> list[dict]:
    """fwd+bwd of yours, ours and SDPA, interleaved, on 3-D inputs as the handout's skeleton takes them: on a GPU at
    the 2025 leaderboard's work (bf16, causal, 16 heads x 16384 x 64, the heads as the batch) without the tiled
    PyTorch versions (a million eager launches each: minutes), baseline our Triton; on a CPU a small fp32 shape
    without Triton (the interpreter times Python), baseline our PyTorch version."""
    gpu = torch.cuda.is_available() and opts.profile == "gpu"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    case = (AttnCase(16384, 16384, 64, True, torch.bfloat16, batch=16) if gpu
            else AttnCase(128, 128, 64, False, torch.float32, batch=4))  # the PyTorch version may ignore is_causal
    q, k, v, do = attn_inputs(case, device=device)
    fns = {f"ours:{k_}": f for k_, f in ours.items()}
    fns.update({f"yours:{k_}": f for k_, f in yours.items()})
    fns["pytorch:sdpa"] = lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c)
    drop = "pytorch" if gpu else "triton" if device == "cpu" else None
    fns = {k_: f for k_, f in fns.items() if not (drop and k_.endswith(drop))}
    calls = {k_: _fwd_bwd(f, q, k, v, case.is_causal, grad_out=do) for k_, f in fns.items()}
    formula = case.batch * case.Tq * case.d * case.dtype.itemsize + case.batch * case.Tq * 4  # O, and L in fp32
    baseline = "ours:triton" if gpu else "ours:pytorch"
    return (timing_rows("attention", calls, baseline=baseline, opts=opts, shape=str(case))
            + memory_rows("attention", fns, (q, k, v, case.is_causal), shape=str(case), formula=formula))
