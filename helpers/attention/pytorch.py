"""FlashAttention-2 in PyTorch tiles: the online-softmax forward and the backward recomputed from L, the spec each
Triton kernel must match, and the autograd Function built on them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from helpers.attention.reference import _check
from helpers.attention.tiles import LaunchConfig, _launch_config


def flash_forward_torch(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, cfg: LaunchConfig) -> tuple[Tensor, Tensor]:
    """FA-2 forward on (N, T, d) tiles: O (N, Tq, d) in q.dtype and L (N, Tq) in fp32 (fp64 for fp64 inputs)."""
    N, Tq, d = q.shape
    Tk, acc_t, scale = k.shape[1], torch.promote_types(q.dtype, torch.float32), d**-0.5
    o = torch.empty_like(q)  # (N, Tq, d)
    lse = torch.empty(N, Tq, dtype=acc_t, device=q.device)  # (N, Tq)
    for i0 in range(0, Tq, cfg.block_q):
        i1 = min(i0 + cfg.block_q, Tq)
        qi = q[:, i0:i1].to(acc_t)  # (N, Bq, d)
        m = torch.full((N, i1 - i0), float("-inf"), dtype=acc_t, device=q.device)  # (N, Bq) running max
        lsum = torch.zeros_like(m)  # (N, Bq) running sum of exp(s - m), the paper's ℓ
        acc = torch.zeros_like(qi)  # (N, Bq, d) running sum of exp(s - m) v
        for j0 in range(0, i1 if is_causal else Tk, cfg.block_k):  # causal: key tiles after the last query skipped
            j1 = min(j0 + cfg.block_k, Tk)
            s = qi @ k[:, j0:j1].to(acc_t).transpose(1, 2) * scale  # (N, Bq, Bk)
            if is_causal and j1 - 1 > i0:  # a diagonal tile: hide keys j > i
                s = s.masked_fill(_above_diagonal(i0, i1, j0, j1, q.device), float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))  # (N, Bq); finite: key 0 is in every row's first tile
            alpha = torch.exp(m - m_new)  # (N, Bq) rescales what was summed against the old max
            p = torch.exp(s - m_new[..., None])  # (N, Bq, Bk)
            lsum = alpha * lsum + p.sum(-1)
            acc = alpha[..., None] * acc + p @ v[:, j0:j1].to(acc_t)  # (N, Bq, d)
            m = m_new
        o[:, i0:i1] = (acc / lsum[..., None]).to(q.dtype)
        lse[:, i0:i1] = m + torch.log(lsum)
    return o, lse


TILE_OPS = {"forward": 14, "backward": 16}  # eager tensor ops per tile pair of the loops above and below (casts aside)


def tiled_launches(T: int, d: int, dtype: torch.dtype, is_causal: bool = True, device="cuda") -> int:
    """Eager kernel launches of one FlashAttentionPyTorch forward+backward on (N, T, d): per tile pair of each loop
    TILE_OPS (its matmuls, exps, rescales and adds), at launch_config's tiles; N rides along in every launch. What
    its time is made of on a GPU: launches, not FLOPs (the reference runner's cost model)."""
    cfg = _launch_config(d, dtype, device)
    fwd = sum(
        len(range(0, min(i0 + cfg.block_q, T) if is_causal else T, cfg.block_k)) for i0 in range(0, T, cfg.block_q)
    )
    bwd = sum(
        len(range(j0 // cfg.block_loop * cfg.block_loop if is_causal else 0, T, cfg.block_loop))
        for j0 in range(0, T, cfg.block_own)
    )
    return TILE_OPS["forward"] * fwd + TILE_OPS["backward"] * bwd


def _above_diagonal(i0: int, i1: int, j0: int, j1: int, device) -> Tensor:
    """(Bq, Bk) bool, True where key j > query i: the causal mask of one tile."""
    return torch.arange(j0, j1, device=device)[None, :] > torch.arange(i0, i1, device=device)[:, None]


def flash_backward_torch(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, is_causal: bool, cfg: LaunchConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """FA-2 backward on (N, T, d) tiles from L: outer loop over key tiles (the dK/dV kernel's), inner over query
    tiles; dQ is summed on the side here (in Triton a kernel of its own). Returns dq, dk, dv in the inputs' dtype."""
    N, Tq, d = q.shape
    Tk, acc_t, scale = k.shape[1], lse.dtype, d**-0.5
    delta = (do.to(acc_t) * o.to(acc_t)).sum(-1)  # (N, Tq) D = rowsum(dO * O)
    dq = torch.zeros(N, Tq, d, dtype=acc_t, device=q.device)  # (N, Tq, d)
    dk, dv = torch.empty_like(k), torch.empty_like(v)  # (N, Tk, d)
    for j0 in range(0, Tk, cfg.block_own):
        j1 = min(j0 + cfg.block_own, Tk)
        kj, vj = k[:, j0:j1].to(acc_t), v[:, j0:j1].to(acc_t)  # (N, Bk, d)
        dkj, dvj = torch.zeros_like(kj), torch.zeros_like(vj)  # (N, Bk, d)
        for i0 in range(j0 // cfg.block_loop * cfg.block_loop if is_causal else 0, Tq, cfg.block_loop):
            i1 = min(i0 + cfg.block_loop, Tq)  # causal: queries i < j0 never see these keys, so start at j0
            qi, doi = q[:, i0:i1].to(acc_t), do[:, i0:i1].to(acc_t)  # (N, Bq, d)
            p = torch.exp(qi @ kj.transpose(1, 2) * scale - lse[:, i0:i1, None])  # (N, Bq, Bk) recomputed P
            if is_causal and j1 - 1 > i0:
                p = p.masked_fill(_above_diagonal(i0, i1, j0, j1, q.device), 0.0)
            dvj += p.transpose(1, 2) @ doi  # (N, Bk, d)
            ds = p * (doi @ vj.transpose(1, 2) - delta[:, i0:i1, None])  # (N, Bq, Bk) dS = P * (dP - D)
            dkj += ds.transpose(1, 2) @ qi * scale  # (N, Bk, d)
            dq[:, i0:i1] += ds @ kj * scale  # (N, Bq, d)
        dk[:, j0:j1], dv[:, j0:j1] = dkj.to(k.dtype), dvj.to(v.dtype)
    return dq.to(q.dtype), dk, dv


class FlashAttentionPyTorch(torch.autograd.Function):
    """FlashAttention-2 in PyTorch tiles: online softmax forward, backward recomputed from L. Any d; fp64 too."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        _check(q, k, v, is_causal, triton_kernels=False)
        cfg = _launch_config(q.shape[-1], q.dtype, q.device)
        with torch.autocast(q.device.type, enabled=False):  # its fp32 tiles stay fp32 under an enclosing autocast
            o, lse = flash_forward_torch(*(x.reshape(-1, *x.shape[-2:]) for x in (q, k, v)), is_causal, cfg)
        o, lse = o.view(q.shape), lse.view(q.shape[:-1])  # (..., Tq, d), (..., Tq)
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.is_causal, ctx.cfg = is_causal, cfg
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        lse, q, k, v, o = ctx.saved_tensors
        q3, k3, v3, o3, do3 = (x.reshape(-1, *x.shape[-2:]) for x in (q, k, v, o, do))  # (N, T, d)
        with torch.autocast(q.device.type, enabled=False):
            dq, dk, dv = flash_backward_torch(q3, k3, v3, o3, lse.reshape(-1, q.shape[-2]), do3, ctx.is_causal, ctx.cfg)
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), None
