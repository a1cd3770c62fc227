"""Notebook 06's checks of the algorithm and the kernels against naive attention: online softmax and the backward
from L step by step (float64, small shapes), any attention function's output and gradients, and each Triton kernel
launched alone against its PyTorch spec (the interpreter on a CPU).

    check_function(FlashAttentionPyTorch.apply, (1, 2, 20, 8), torch.float64, is_causal=True)   # o, dq, dk, dv
    check_kernel("fwd", (1, 2, 40, 16), torch.float32)      # one Triton kernel vs its PyTorch spec
"""

from __future__ import annotations

import torch
from torch import Tensor

from helpers import attention as A
from helpers.experiments.attention_impls import inputs

TOL = {
    torch.float64: dict(rtol=1e-10, atol=1e-12),  # the algorithm's steps vs naive attention: rounding error
    torch.float32: dict(rtol=1e-4, atol=1e-5),  # tiled sums in another order, fp32 accumulators
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
}  # P cast to bf16 before P V: a few bf16 ulps


def online_softmax(s: Tensor, block: int) -> tuple[Tensor, Tensor, Tensor]:
    """Walk the key axis of scores s (..., Tk) in blocks, keeping only a running max m and running sum lsum (the
    paper's ℓ) of exp(s - m): returns m, lsum and logsumexp = m + log lsum, equal to torch.logsumexp(s, -1)."""
    m = torch.full(s.shape[:-1], float("-inf"), dtype=s.dtype)  # (...,)
    lsum = torch.zeros(s.shape[:-1], dtype=s.dtype)  # (...,)
    for j0 in range(0, s.shape[-1], block):
        sj = s[..., j0 : j0 + block]  # (..., Bk)
        m_new = torch.maximum(m, sj.amax(-1))
        lsum = lsum * torch.exp(m - m_new) + torch.exp(sj - m_new[..., None]).sum(-1)  # old terms rescaled to new max
        m = m_new
    return m, lsum, m + torch.log(lsum)


def backward_from_lse(q, k, v, o, lse, do, is_causal=False) -> tuple[Tensor, Tensor, Tensor]:
    """The FA-2 backward untiled: P = exp(S - L) rebuilt from L, D = rowsum(dO * O), dS = P * (dP - D)."""
    scale = q.shape[-1] ** -0.5
    s = q @ k.transpose(-2, -1) * scale  # (..., Tq, Tk)
    if is_causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).tril().logical_not(), float("-inf"))
    p = torch.exp(s - lse[..., None])  # (..., Tq, Tk) P, exactly softmax(S) when L = logsumexp(S)
    dv = p.transpose(-2, -1) @ do  # (..., Tk, d)
    dp = do @ v.transpose(-2, -1)  # (..., Tq, Tk)
    delta = (do * o).sum(-1, keepdim=True)  # (..., Tq, 1) = rowsum(P * dP)
    ds = p * (dp - delta)  # (..., Tq, Tk)
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv


def naive_grads(q, k, v, do, is_causal=False) -> tuple[Tensor, ...]:
    """o and dq, dk, dv of naive_attention by autograd: the reference for every check."""
    o = A.naive_attention(q, k, v, is_causal)
    return (o.detach(), *torch.autograd.grad(o, (q, k, v), do))


def check_function(fn, shape, dtype=torch.float32, device="cpu", is_causal: bool = False) -> float:
    """Assert fn(q, k, v, is_causal)'s output and dq, dk, dv equal naive attention's (autograd, fp32 from the same
    inputs; fp64 stays fp64) within TOL[dtype]; the largest error."""
    q, k, v, do = inputs(shape, dtype, device)
    up = dtype if dtype == torch.float64 else torch.float32
    ref = naive_grads(*(t.detach().to(up).requires_grad_() for t in (q, k, v)), do.to(up), is_causal)
    o = fn(q, k, v, is_causal)
    got = (o.detach(), *torch.autograd.grad(o, (q, k, v), do))
    worst = 0.0
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, ref, strict=True):
        torch.testing.assert_close(
            a, b.to(dtype), **TOL[dtype], msg=lambda m, name=name: f"{name} ({dtype}, {shape}): {m}"
        )
        worst = max(worst, float((a.double() - b.double()).abs().max()))
    return worst


# ---- each Triton kernel against its spec (interpreter on CPU) --------------------------------------------------


def run_kernel(name: str, q, k, v, do, is_causal: bool = False) -> dict:
    """Launch one kernel (fwd | dkdv | dq) as FlashAttentionTriton does, on contiguous (B, H, T, d) inputs; L and D
    for the backward kernels come from the spec (attention_lse, rowsum(dO * O)), so each kernel is checked alone."""
    q, k, v, do = (t.detach().contiguous() for t in (q, k, v, do))
    B, H, T, d = q.shape
    cfg = A._launch_config(d, q.dtype, q.device)
    args = (*q.stride(), *k.stride(), *v.stride())
    opts = dict(
        D=d, IS_CAUSAL=is_causal, PRECISION=cfg.dot_precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages
    )
    if name == "fwd":
        o, lse = torch.empty_like(q), torch.empty(B, H, T, device=q.device)
        A.attn_fwd_kernel[(-(-T // cfg.block_q), B * H)](
            q, k, v, o, lse, *args, *o.stride(), H, T, T, d**-0.5, BQ=cfg.block_q, BK=cfg.block_k, **opts
        )
        return {"o": o, "lse": lse}
    lse = A.attention_lse(q, k, is_causal).float().contiguous()  # (B, H, T)
    delta = (do.float() * A.naive_attention(q, k, v, is_causal).float()).sum(-1).contiguous()  # (B, H, T)
    args = (*args, *do.stride(), H, T, T, d**-0.5)
    grid = (-(-T // cfg.block_own), B * H)
    if name == "dkdv":
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        A.attn_bwd_dkdv_kernel[grid](
            q, k, v, do, lse, delta, dk, dv, *args, BN=cfg.block_own, BM=cfg.block_loop, **opts
        )
        return {"dk": dk, "dv": dv}
    if name == "dq":
        dq = torch.empty_like(q)
        A.attn_bwd_dq_kernel[grid](q, k, v, do, lse, delta, dq, *args, BM=cfg.block_own, BN=cfg.block_loop, **opts)
        return {"dq": dq}
    raise ValueError(f"unknown kernel {name!r}; known: fwd, dkdv, dq")


KERNELS = {"fwd": "attn_fwd_kernel", "dkdv": "attn_bwd_dkdv_kernel", "dq": "attn_bwd_dq_kernel"}


def check_kernel(name: str, shape, dtype=torch.float32, device="cpu", is_causal: bool = False) -> float:
    """Assert one kernel's outputs equal naive attention's (o, L by attention_lse, dq/dk/dv by autograd, computed in
    fp32 from the same inputs) within TOL[dtype]; the largest error (notebook 06 section 3)."""
    q, k, v, do = inputs(shape, dtype, device)
    up = [t.detach().float().requires_grad_() for t in (q, k, v)]
    o, dq, dk, dv = naive_grads(*up, do.float(), is_causal)
    spec = {"o": o, "lse": A.attention_lse(q.detach(), k.detach(), is_causal), "dq": dq, "dk": dk, "dv": dv}
    worst = 0.0
    for key, got in run_kernel(name, q, k, v, do, is_causal).items():
        want = spec[key].to(got.dtype)
        torch.testing.assert_close(
            got, want, **TOL[dtype], msg=lambda m, key=key: f"{name} {key} ({dtype}, {shape}): {m}"
        )
        worst = max(worst, float((got.float() - want.float()).abs().max()))
    return worst
