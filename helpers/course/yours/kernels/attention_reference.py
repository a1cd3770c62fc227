"""FlashAttention's float64 reference for `yours`' checks (attn_checks): o, L, dq, dk, dv from closed forms (FA-2's
backward, Equations 13-19 of the 2025 handout), the scales their bounds are taken on, and the outputs of known mistakes
(a Variant), computed in query chunks on the inputs' device so that the handout's longest sequences fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

CHUNK_ELEMENTS = 2**24  # scores held at once: a (rows, N_k) float64 chunk of at most 128 MiB


@dataclass(frozen=True)
class Variant:
    """Which attention to compute: the right one by default, or a known mistake's."""

    is_causal: bool = False
    shift: int = 0  # the causal diagonal moved: query i sees keys j <= i + shift
    scaled: bool = True  # False: scores without 1/sqrt(d)
    keys: int | None = None  # only the first `keys` keys take part (the others' gradients are zero)
    pad_to: int | None = None  # zero keys appended up to a multiple of pad_to enter the softmax (a tile's padding)
    backward_causal: bool | None = None  # the backward's mask, where it differs from the forward's

    @property
    def masked_backward(self) -> bool:
        return self.is_causal if self.backward_causal is None else self.backward_causal


@dataclass
class Reference:
    """The float64 outputs (o, lse, dq, dk, dv, on the CPU), the same expressions on absolute values (scales), and
    the scores' extremes a bound needs: s_max = max |S|, s_abs_d = max d * sum_k |q_k| |k_k| / sqrt(d)."""

    want: dict
    scales: dict
    s_max: float
    s_abs_d: float


def _hide(s: Tensor, first_row: int, shift: int) -> Tensor:
    """s with the scores above the causal diagonal (key j > query i + shift) set to -inf; rows start at first_row."""
    rows = torch.arange(first_row, first_row + s.shape[-2], device=s.device)[:, None]  # (r, 1)
    cols = torch.arange(s.shape[-1], device=s.device)[None, :]  # (1, N_k)
    return s.masked_fill(cols > rows + shift, -math.inf)


def _keys_used(k: Tensor, v: Tensor, variant: Variant) -> tuple[Tensor, Tensor]:
    """The keys and values the variant attends over: the first `keys`, or zero rows appended up to pad_to."""
    if variant.keys is not None:
        return k[..., : variant.keys, :], v[..., : variant.keys, :]
    if variant.pad_to:
        extra = -k.shape[-2] % variant.pad_to
        zeros = k.new_zeros(*k.shape[:-2], extra, k.shape[-1])  # (..., extra, d)
        return torch.cat([k, zeros], -2), torch.cat([v, zeros], -2)
    return k, v


def _to_length(t: Tensor, n: int) -> Tensor:
    """t's key rows cut or zero-extended to n (a variant's dk, dv back on the real keys)."""
    if t.shape[-2] >= n:
        return t[..., :n, :]
    return torch.cat([t, t.new_zeros(*t.shape[:-2], n - t.shape[-2], t.shape[-1])], -2)


def attn_float64(q, k, v, do, variant: Variant = Variant()) -> Reference:
    """The variant's attention and gradients in float64 from the very inputs the implementation got, a chunk of
    queries at a time on their device."""
    q, k, v, do = (t.detach().double() for t in (q, k, v, do))
    Tq, Tk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    k, v = _keys_used(k, v, variant)
    c = d**-0.5 if variant.scaled else 1.0
    rows = max(1, CHUNK_ELEMENTS // k.shape[-2])
    parts = {name: [] for name in ("o", "lse", "dq", "o_s", "lse_s", "dq_s")}
    dk, dv, dk_s, dv_s = (torch.zeros_like(k) for _ in range(4))  # (..., N_k, d) accumulated over the chunks
    s_max = s_abs_d = 0.0
    for i0 in range(0, Tq, rows):
        qi, doi = q[..., i0 : i0 + rows, :], do[..., i0 : i0 + rows, :]  # (..., r, d)
        s = qi @ k.transpose(-2, -1) * c  # (..., r, N_k)
        s_fwd = _hide(s, i0, variant.shift) if variant.is_causal else s
        lse = torch.logsumexp(s_fwd, -1)  # (..., r)
        p = torch.exp(s_fwd - lse[..., None])  # (..., r, N_k)
        o = p @ v  # (..., r, d)
        parts["o_s"].append(p @ v.abs())
        if variant.masked_backward != variant.is_causal:  # the backward rebuilds P under another mask
            p = torch.exp((_hide(s, i0, variant.shift) if variant.masked_backward else s) - lse[..., None])
        dp = doi @ v.transpose(-2, -1)  # (..., r, N_k)
        delta = (doi * o).sum(-1, keepdim=True)  # (..., r, 1)
        ds = p * (dp - delta)  # (..., r, N_k)
        ads = p * (doi.abs() @ v.abs().transpose(-2, -1) + (doi * o).abs().sum(-1, keepdim=True))  # (..., r, N_k)
        parts["o"].append(o)
        parts["lse"].append(lse)
        parts["dq"].append(ds @ k * c)
        parts["lse_s"].append(1 + lse.abs())
        parts["dq_s"].append(ads @ k.abs() * c)
        dk += ds.transpose(-2, -1) @ qi * c
        dv += p.transpose(-2, -1) @ doi
        dk_s += ads.transpose(-2, -1) @ qi.abs() * c
        dv_s += p.transpose(-2, -1) @ doi.abs()
        finite = s_fwd.isfinite()
        s_abs = (qi.abs() @ k.abs().transpose(-2, -1)) * c  # (..., r, N_k) sum of |terms| of each score
        s_max = max(s_max, float(s.abs().where(finite, 0).amax()))
        s_abs_d = max(s_abs_d, float((d * s_abs).where(finite, 0).amax()))
    joined = {name: torch.cat(ts, -2 if name.startswith(("o", "dq")) else -1).cpu() for name, ts in parts.items()}
    want = {"o": joined["o"], "lse": joined["lse"], "dq": joined["dq"]}
    scales = {"o": joined["o_s"], "lse": joined["lse_s"], "dq": joined["dq_s"]}
    for name, t, scale in (("dk", dk, dk_s), ("dv", dv, dv_s)):  # the keys left out get zero gradients and scales
        want[name], scales[name] = _to_length(t, Tk).cpu(), _to_length(scale, Tk).cpu()
    return Reference(want, scales, s_max, s_abs_d)
