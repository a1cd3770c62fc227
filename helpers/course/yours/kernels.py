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
A failure names the tensor, the index, the values, the bound, and the likely mistake when the error matches one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from helpers.course.yours import Options
from helpers.course.yours import adapters as A
from helpers.course.yours.report import ERROR, FAIL, NOT_IMPLEMENTED, PASS, SKIPPED, Check, TopicResult
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


NORM_PROPERTIES = {  # property -> the cases that check it (widths not powers of two; 4100 is wider than a 4096 block)
    "forward and both gradients vs float64, fp32": [NormCase((3, 5, 1000)), NormCase((4, 4100)), NormCase((7, 33))],
    "the same in bf16 and fp16": [NormCase((3, 1000), torch.bfloat16), NormCase((3, 1000), torch.float16)],
    "non-contiguous input (a transposed view)": [NormCase((6, 72), transposed=True)],
    "eps inside the square root (rows with mean(x^2) below eps)": [NormCase((4, 96), scale=1e-3)],
}


def norm_inputs(case: NormCase, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """x (case.shape, maybe a transposed view), g (H,), dy: drawn in fp32 and cast; x and g require grad."""
    gen = torch.Generator().manual_seed(seed)
    shape = case.shape[::-1] if case.transposed else case.shape
    x = (case.scale * torch.randn(*shape, generator=gen)).to(case.dtype)
    x = (x.t() if case.transposed else x).requires_grad_()  # (..., H)
    g = (1 + 0.5 * torch.randn(case.shape[-1], generator=gen)).to(case.dtype).requires_grad_()  # (H,)
    dy = torch.randn(*case.shape, generator=gen).to(case.dtype)  # (..., H)
    return x, g, dy


def norm_float64(x: Tensor, g: Tensor, dy: Tensor, eps: float = EPS, *, eps_outside: bool = False,
                 sum_not_mean: bool = False) -> tuple[dict, dict]:
    """y, dx, dg in float64 from the same inputs (closed forms), and their scales (the same on |terms|).
    eps_outside / sum_not_mean give the result of those mistakes, to recognise them."""
    x, g, dy = (t.detach().double() for t in (x, g, dy))
    H = x.shape[-1]
    ms = (x * x).sum(-1, keepdim=True) / (1 if sum_not_mean else H)  # (..., 1)
    r = 1 / (ms.sqrt() + eps) if eps_outside else torch.rsqrt(ms + eps)  # (..., 1)
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


def norm_mistake(got: dict, x, g, dy) -> str:
    """The likely mistake when the outputs match a known wrong formula (within the same bounds), else ''."""
    for label, kwargs in (("eps added outside the square root: 1 / (sqrt(mean(x^2)) + eps)", dict(eps_outside=True)),
                          ("sum of squares instead of their mean (divide by H)", dict(sum_not_mean=True))):
        want, scales = norm_float64(x, g, dy, **kwargs)
        if "y" in got and worst("y", got["y"], want["y"], norm_bounds(x, scales, x.dtype)["y"]) is None:
            return f"likely mistake: {label}"
    want, scales = norm_float64(x, g, dy)
    if "y" in got and got["y"].shape == want["y"].shape:
        no_g = want["y"] / g.detach().double()
        if worst("y", got["y"], no_g, norm_bounds(x, scales, x.dtype)["y"]) is None:
            return "likely mistake: the gain g is not applied"
    if "dg" in got and got["dg"].shape != want["dg"].shape:
        return "likely mistake: dg is not summed over the rows (it must have g's shape)"
    return ""


def check_norm_function(apply, case: NormCase) -> str:
    """'' when y = apply(x, g) and its gradients are within the bounds, else what differed."""
    x, g, dy = norm_inputs(case)
    y = apply(x, g)
    if not isinstance(y, Tensor):
        raise ShapeError(f"apply(x, g) returned {type(y).__name__}, expected a tensor")
    if y.dtype != x.dtype:
        return f"{case}: y is {y.dtype}, expected the input's dtype {x.dtype}"
    want, scales = norm_float64(x, g, dy)
    bound = norm_bounds(x, scales, case.dtype)
    m = worst("y", y, want["y"], bound["y"])  # the forward first: its error explains the gradients'
    if m is not None:
        return f"{case}: {m}. {norm_mistake({'y': y}, x, g, dy)}".strip()
    dx, dg = torch.autograd.grad(y, (x, g), dy, allow_unused=True)
    if dx is None or dg is None:
        return f"{case}: no gradient for {'x' if dx is None else 'g'} (is backward returning it?)"
    got = {"y": y, "dx": dx, "dg": dg}
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
    m = worst(which, got, want[which], norm_bounds(x, scales, case.dtype)[which])
    return "" if m is None else f"{case}: {m}"


# ---- FlashAttention-2 -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttnCase:
    """One attention input: (batch, heads, Tq, Tk, d), dtype, causal."""
    Tq: int
    Tk: int
    d: int
    is_causal: bool
    dtype: torch.dtype = torch.float32
    batch: int = 1
    heads: int = 2

    def __str__(self) -> str:
        return (f"{short(self.dtype)} {self.batch}x{self.heads}, Tq={self.Tq}, Tk={self.Tk}, d={self.d}"
                f"{', causal' if self.is_causal else ''}")


ATTN_PROPERTIES = {  # lengths not multiples of any tile (16..128); d from 16 to 128; Tq != Tk
    "output and gradients vs float64, not causal, Tq != Tk": [AttnCase(48, 80, 32, False), AttnCase(37, 37, 16, False)],
    "causal mask (query i sees keys j <= i)": [AttnCase(100, 100, 16, True), AttnCase(67, 67, 64, True)],
    "head dims 16 to 128": [AttnCase(40, 40, 128, False), AttnCase(33, 33, 64, True)],
    "bf16": [AttnCase(50, 50, 32, True, torch.bfloat16)],
}
LSE_CASE = AttnCase(50, 70, 32, False)


def attn_inputs(case: AttnCase, seed: int = 0) -> tuple[Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    B, H = case.batch, case.heads
    q = torch.randn(B, H, case.Tq, case.d, generator=gen).to(case.dtype).requires_grad_()  # (B, H, Tq, d)
    k = torch.randn(B, H, case.Tk, case.d, generator=gen).to(case.dtype).requires_grad_()  # (B, H, Tk, d)
    v = torch.randn(B, H, case.Tk, case.d, generator=gen).to(case.dtype).requires_grad_()  # (B, H, Tk, d)
    do = torch.randn(B, H, case.Tq, case.d, generator=gen).to(case.dtype)  # (B, H, Tq, d)
    return q, k, v, do


def attn_float64(q, k, v, do, is_causal: bool, *, shift: int = 0, scaled: bool = True) -> tuple[dict, dict, float]:
    """o, lse, dq, dk, dv in float64 (closed forms of FA-2's backward), their scales, and the scores' worst error.
    shift moves the causal diagonal (query i sees keys j <= i + shift); scaled=False drops 1/sqrt(d)."""
    q, k, v, do = (t.detach().double() for t in (q, k, v, do))
    d = q.shape[-1]
    c = d ** -0.5 if scaled else 1.0
    s = q @ k.transpose(-2, -1) * c  # (..., Tq, Tk)
    mask = None
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


def attn_mistake(o: Tensor, q, k, v, do, case: AttnCase) -> str:
    """The likely mistake when o matches a known wrong variant (within the same bounds), else ''."""
    variants = [("no 1/sqrt(d) scaling of the scores", dict(is_causal=case.is_causal, scaled=False))]
    if case.is_causal:
        variants += [("the causal mask is shifted by one: query i also sees key i+1", dict(is_causal=True, shift=1)),
                     ("the causal mask is shifted by one: query i does not see key i", dict(is_causal=True, shift=-1)),
                     ("is_causal is ignored (no mask applied)", dict(is_causal=False))]
    for label, kwargs in variants:
        if kwargs.get("shift") == -1:  # row 0 then sees nothing: NaN where the mistake is made
            continue
        want, scales, err = attn_float64(q, k, v, do, **kwargs)
        if worst("o", o, want["o"], attn_bounds(scales, case, err)["o"]) is None:
            return f"likely mistake: {label}"
    if case.is_causal and not torch.isfinite(o.detach()[..., 0, :]).all():
        return "likely mistake: the causal mask hides the diagonal (query 0 sees no key: NaN)"
    return ""


def saved_tensors(fn) -> tuple[object, list[Tensor]]:
    """fn()'s result and every tensor autograd saved for its backward."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, saved


def check_attn_function(apply, case: AttnCase) -> str:
    """'' when o = apply(q, k, v, is_causal) and dq, dk, dv are within the bounds, else what differed."""
    q, k, v, do = attn_inputs(case)
    o = apply(q, k, v, case.is_causal)
    if not isinstance(o, Tensor):
        raise ShapeError(f"apply(q, k, v, is_causal) returned {type(o).__name__}, expected the output tensor")
    if o.dtype != q.dtype:
        return f"{case}: o is {o.dtype}, expected the input's dtype {q.dtype}"
    want, scales, err = attn_float64(q, k, v, do, case.is_causal)
    bound = attn_bounds(scales, case, err)
    want.pop("lse")
    m = worst("o", o, want["o"], bound["o"])  # the forward first: its error explains the gradients'
    if m is not None:
        return f"{case}: {m}. {attn_mistake(o, q, k, v, do, case)}".strip()
    grads = torch.autograd.grad(o, (q, k, v), do, allow_unused=True)
    if any(gr is None for gr in grads):
        return f"{case}: no gradient for {'qkv'[[gr is None for gr in grads].index(True)]} (is backward returning it?)"
    got = {"o": o, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
    try:
        m = first_mismatch(got, want, bound)
    except ShapeError as exc:
        return f"{case}: {exc}"
    return "" if m is None else f"{case}: {m}. {attn_mistake(o, q, k, v, do, case)}".strip()


def check_lse_saved(apply, case: AttnCase = LSE_CASE) -> str:
    """Exactly one logsumexp (shape (..., Tq)) saved for backward, equal to float64's L; nothing (Tq, Tk)-sized."""
    q, k, v, do = attn_inputs(case)
    _, saved = saved_tensors(lambda: apply(q, k, v, case.is_causal))
    rows = [t for t in saved if tuple(t.shape) == tuple(q.shape[:-1])]
    square = [tuple(t.shape) for t in saved if t.dim() >= 2 and tuple(t.shape[-2:]) == (case.Tq, case.Tk)]
    if square:
        return f"{case}: a tensor of shape {square[0]} is saved for backward: O(T^2) memory; save L instead"
    if len(rows) != 1:
        return (f"{case}: {len(rows)} tensors of shape {tuple(q.shape[:-1])} saved for backward, expected exactly one "
                "(the logsumexp L = m + log(l)); " + ("saving m and l separately?" if len(rows) == 2 else
                                                      "backward must rebuild P from L"))
    want, scales, err = attn_float64(q, k, v, do, case.is_causal)
    m = worst("L", rows[0], want["lse"], attn_bounds(scales, case, err)["lse"])
    return "" if m is None else f"{case}: the saved (..., Tq) tensor is not the logsumexp of the scores: {m}"


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


def _function_checks(adapter: A.Adapter, suites) -> tuple[object, list[Check]]:
    """An adapter that returns an autograd.Function: (its apply or None, the checks), each suite a ({property:
    cases}, check(apply, case)) pair; a wrong return kind is an ERROR, NotImplementedError 'not implemented'."""
    topic, impl = adapter.topic, adapter.impl
    try:
        cls = _function_class(adapter, A.ADAPTERS[topic][impl][0])
    except Exception as exc:  # noqa: BLE001 - the student's getter raised or returned the wrong kind
        return None, [Check(topic, impl, "returns an autograd.Function", ERROR, str(exc))]
    if cls is A.NOT_IMPLEMENTED:
        return None, [Check(topic, impl, "implemented", NOT_IMPLEMENTED)]
    checks = [c for properties, check in suites
              for c in _run_properties(topic, impl, properties, lambda case, check=check: check(cls.apply, case))]
    return cls.apply, checks


def _run_properties(topic: str, impl: str, properties: dict, check) -> list[Check]:
    """One Check per property: the first failing case's detail, or pass; an exception in student code is ERROR."""
    out = []
    for prop, cases in properties.items():
        detail, status = "", PASS
        for case in cases:
            try:
                detail = check(case)
            except ShapeError as exc:
                detail, status = f"{case}: {exc}", FAIL
            except Exception as exc:  # noqa: BLE001 - the student's code raised: say what and where
                detail, status = f"{case}: raised {type(exc).__name__}: {exc} (at {A.where(exc)})", ERROR
            if detail:
                status = status if status != PASS else FAIL
                break
        out.append(Check(topic, impl, prop, status, detail))
    return out


def _named(module, topic: str, res: TopicResult):
    """(adapter, its constructor's name) for each implementation of `topic` the file names; a SKIPPED check in `res`
    for each it does not (another edition's)."""
    for adapter in A.implementations(module, topic):
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


def rmsnorm_worker(adapters_path: str, opts: Options) -> TopicResult:
    """Every RMSNorm implementation of the file checked, then timed beside ours and PyTorch's (a launched rank)."""
    from helpers.rmsnorm import RMSNormPyTorchFunction, RMSNormTritonFunction

    module, res, yours = A.load(adapters_path), TopicResult("rmsnorm"), {}
    for adapter, name in _named(module, "rmsnorm", res):
        if adapter.impl in ("backward_g", "backward_x"):
            which = "dg" if adapter.impl == "backward_g" else "dx"
            fn = adapter.fns[name]
            probe = _probe(lambda: fn(*_tiny_norm_args()))
            if probe:
                res.checks.append(Check("rmsnorm", adapter.impl, "implemented", *probe))
                continue
            props = {f"{which} vs float64": NORM_PROPERTIES["forward and both gradients vs float64, fp32"][:2]}
            res.checks += _run_properties("rmsnorm", adapter.impl, props,
                                          lambda c: check_norm_backward(fn, which, c))
            continue
        apply, checks = _function_checks(adapter, [(NORM_PROPERTIES, check_norm_function)])
        res.checks += checks
        if apply is not None:
            yours[adapter.impl] = apply
    rows, H = (1024, 1024) if opts.profile == "cpu" else (50_000, 4096)
    dtype = torch.float32 if opts.profile == "cpu" else torch.bfloat16
    if opts.timed:
        res.rows += norm_timing(yours, rows=rows, H=H, dtype=dtype, opts=opts,
                                ours={"pytorch": RMSNormPyTorchFunction.apply, "triton": RMSNormTritonFunction.apply})
    return res


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


def attention_worker(adapters_path: str, opts: Options) -> TopicResult:
    """Every FlashAttention-2 implementation of the file checked, then timed beside ours and SDPA (a launched rank)."""
    from helpers.attention import FlashAttentionPyTorch, FlashAttentionTriton

    module, res, yours = A.load(adapters_path), TopicResult("attention"), {}
    for adapter, name in _named(module, "attention", res):
        lse = {"exactly one logsumexp saved for backward, nothing T x T": [LSE_CASE]}
        apply, checks = _function_checks(adapter, [(ATTN_PROPERTIES, check_attn_function), (lse, check_lse_saved)])
        res.checks += checks
        if apply is not None:
            yours[adapter.impl] = apply
    ours = {"pytorch": FlashAttentionPyTorch.apply, "triton": FlashAttentionTriton.apply}
    if opts.timed:
        res.rows += attn_timing(yours, opts=opts, ours=ours)
    return res


def attn_timing(yours: dict, *, opts: Options, ours: dict) -> list[dict]:
    """fwd+bwd of yours, ours and SDPA, interleaved: on a GPU at the 2025 leaderboard's shape (bf16, causal,
    1x16x16384x64), on a CPU at a small fp32 one; Triton only on a GPU."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and opts.profile == "gpu":
        case = AttnCase(16384, 16384, 64, True, torch.bfloat16, batch=1, heads=16)
    else:
        case = AttnCase(128, 128, 64, True, torch.float32, batch=1, heads=4)
    q, k, v, do = (t.detach().to(device).requires_grad_(t.requires_grad) for t in attn_inputs(case))
    fns = {f"ours:{k_}": f for k_, f in ours.items()}
    fns.update({f"yours:{k_}": f for k_, f in yours.items()})
    fns["pytorch:sdpa"] = lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c)
    if device == "cpu":
        fns = {k_: f for k_, f in fns.items() if not k_.endswith("triton")}
    calls = {k_: _fwd_bwd(f, q, k, v, case.is_causal, grad_out=do) for k_, f in fns.items()}
    B, H = case.batch, case.heads
    formula = B * H * case.Tq * case.d * case.dtype.itemsize + B * H * case.Tq * 4  # O, and L in fp32
    return (timing_rows("attention", calls, baseline="ours:pytorch", opts=opts, shape=str(case))
            + memory_rows("attention", fns, (q, k, v, case.is_causal), shape=str(case), formula=formula))
