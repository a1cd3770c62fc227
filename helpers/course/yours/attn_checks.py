"""FlashAttention-2 checks (2025/2026 editions): a student's Function against float64 closed forms of FA-2's backward,
the logsumexp it saves, and which inputs the handout promises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from helpers.course.yours.numerics import (
    U32,
    BackwardMissing,
    ShapeError,
    _grads,
    bounds,
    constant_factor,
    first_mismatch,
    matches,
    saved_tensors,
    short,
    unit,
    worst,
)

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
        return (
            f"{short(self.dtype)} {lead}, Tq={self.Tq}, Tk={self.Tk}, d={self.d}{', causal' if self.is_causal else ''}"
        )


# 2025/2026 handouts and tests (flash_forward, flash_backward): fp32, 3-D (batch, N, d), N and d powers of two and at
# least 16 (the tests: 4 x 128 x 64), N_q and N_k may differ, is_causal may be ignored by the PyTorch version; the
# Triton version masks causally (flash_forward (c)), with N_q = N_k there. Exactly one (batch, N_q) logsumexp is
# saved (the tests look for it).
ATTN_PYTORCH_CONTRACT = {
    "output and gradients vs float64, fp32 (batch, N, d)": [
        AttnCase(128, 128, 64, False, batch=4),
        AttnCase(16, 16, 16, False),
    ],
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
    "lengths that are not tile multiples": [
        AttnCase(37, 37, 16, False, batch=1),
        AttnCase(48, 80, 32, False, batch=1),
        AttnCase(100, 100, 16, True, batch=1),
    ],
    "4-D (batch, heads, N, d)": [AttnCase(32, 32, 32, True, batch=1, heads=2)],
    "bf16": [AttnCase(32, 32, 32, True, torch.bfloat16, batch=1)],
}
ATTN_PYTORCH_BEYOND = {
    "causal mask applied (optional for the PyTorch version)": [
        AttnCase(16, 16, 16, True),
        AttnCase(128, 128, 64, True),
    ],
    **ATTN_BEYOND,
}
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


def attn_float64(
    q, k, v, do, is_causal: bool, *, shift: int = 0, scaled: bool = True, keys: int | None = None
) -> tuple[dict, dict, float]:
    """o, lse, dq, dk, dv in float64 (closed forms of FA-2's backward), their scales, and the scores' worst error.
    shift moves the causal diagonal (query i sees keys j <= i + shift); scaled=False drops 1/sqrt(d); keys=n uses
    only the first n keys (their gradients stay zero beyond)."""
    q, k, v, do = (t.detach().double().cpu() for t in (q, k, v, do))
    Tk = k.shape[-2]
    if keys is not None:
        k, v = k[..., :keys, :], v[..., :keys, :]
    d = q.shape[-1]
    c = d**-0.5 if scaled else 1.0
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
    scales = {
        "o": p @ v.abs(),
        "lse": torch.ones_like(lse) + lse.abs(),
        "dq": ads @ k.abs() * c,
        "dk": ads.transpose(-2, -1) @ q.abs() * c,
        "dv": p.transpose(-2, -1) @ do.abs(),
    }
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
        variants.append(
            (
                "keys beyond the first N_q are ignored (the key loop must run over N_k, not N_q)",
                dict(is_causal=case.is_causal, keys=case.Tq),
            )
        )
    if case.is_causal:
        variants += [
            ("the causal mask is shifted by one: query i also sees key i+1", dict(is_causal=True, shift=1)),
            ("is_causal is ignored (no mask applied)", dict(is_causal=False)),
        ]
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
    got = (
        {"o": o}
        if not all(isinstance(g, Tensor) for g in grads)
        else dict(zip(("o", "dq", "dk", "dv"), (o, *grads), strict=True))
    )
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
        return (
            f"{case}: {len(rows)} tensors of shape {tuple(q.shape[:-1])} saved for backward, expected exactly one "
            "(the logsumexp L = m + log(l)); "
            + ("saving m and l separately?" if len(rows) == 2 else "backward must rebuild P from L")
        )
    want, scales, err = attn_float64(q, k, v, do, case.is_causal)
    m = worst("L", rows[0], want["lse"], attn_bounds(scales, case, err)["lse"])
    return "" if m is None else f"{case}: the saved (..., Tq) tensor is not the logsumexp of the scores: {m}"


def check_nothing_square_saved(apply, case: AttnCase = LSE_CASE, device="cpu") -> str:
    """Nothing (Tq, Tk)-sized saved for backward: the handout saves L, Q, K, V, O (beyond what the tests check)."""
    q, k, v, _ = attn_inputs(case, device=device)
    _, saved = saved_tensors(lambda: apply(q, k, v, case.is_causal))
    square = [tuple(t.shape) for t in saved if t.dim() >= 2 and tuple(t.shape[-2:]) == (case.Tq, case.Tk)]
    return (
        f"{case}: a tensor of shape {square[0]} is saved for backward: O(T^2) memory; save L instead" if square else ""
    )
