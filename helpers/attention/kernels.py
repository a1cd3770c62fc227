"""FlashAttention-2 in Triton (Algorithms 1 and 2 of the FA-2 paper): the forward kernel beside its PyTorch spec in
helpers.attention.pytorch, and the autograd Function that launches it and the backward's three kernels (D = rowsum(dO
* O), dK/dV, dQ: helpers.attention.kernels_backward; what they share: .kernels_common). Without CUDA they run in
Triton's interpreter (`import helpers` sets TRITON_INTERPRET=1).

What makes them fast (after Triton's fused-attention tutorial, python/tutorials/06-fused-attention.py):
- scores in log2 units: S * (scale * log2(e)) and exp2, so exp's hidden multiply by log2(e) folds into the scale
  (one FMA per score with the max or L subtracted); L is stored in natural-log units (its public meaning: the
  row-wise logsumexp of the scaled scores, what FlashAttentionPyTorch saves) and converted on loading;
- causal: tiles wholly above the diagonal are skipped, tiles wholly below it run without a mask, and only the
  diagonal ones (and a ragged last tile, where padding must be hidden) pay for the select;
- tiles, warps and stages per kernel from helpers.attention.tuned (per d, dtype and architecture).
"""

from __future__ import annotations

import torch
from torch import Tensor

from helpers.attention.kernels_backward import flash_backward_triton
from helpers.attention.kernels_common import triton
from helpers.attention.reference import _check
from helpers.attention.tiles import LaunchConfig, _launch_config

if triton is not None:
    from helpers.attention.kernels_common import _LN2, _LOG2E, _dot, tl

    # spec: one key tile of flash_forward_torch's inner loop (online softmax update of acc, lsum, m)
    @triton.jit
    def _fwd_tile(
        acc,
        lsum,
        m,
        q,
        K,
        V,
        offs_q,
        j0,
        Tk,
        sk_t,
        sk_d,
        sv_t,
        sv_d,
        qk_scale,
        D: tl.constexpr,
        BK: tl.constexpr,
        MASKED: tl.constexpr,
        IS_CAUSAL: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """Keys j0 .. j0+BK-1 update acc (BQ, D), lsum and m (BQ,), scores and m in log2 units (qk_scale = scale *
        log2 e); MASKED tiles hide keys >= Tk (and j > i if causal)."""
        offs_k = j0 + tl.arange(0, BK)  # (BK,)
        offs_d = tl.arange(0, D)
        in_k = offs_k[:, None] < Tk  # (BK, 1)
        k = tl.load(K + offs_k[:, None] * sk_t + offs_d[None, :] * sk_d, mask=in_k, other=0.0)  # (BK, D)
        v = tl.load(V + offs_k[:, None] * sv_t + offs_d[None, :] * sv_d, mask=in_k, other=0.0)  # (BK, D)
        s = _dot(q, tl.trans(k), None, PRECISION) * qk_scale  # (BQ, BK) fp32, log2 units
        if MASKED:
            keep = offs_k[None, :] < Tk  # (1, BK)
            if IS_CAUSAL:
                keep = keep & (offs_k[None, :] <= offs_q[:, None])  # (BQ, BK)
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))  # (BQ,)
        alpha = tl.exp2(m - m_new)  # (BQ,)
        p = tl.exp2(s - m_new[:, None])  # (BQ, BK)
        lsum = lsum * alpha + tl.sum(p, 1)
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], PRECISION)  # (BQ, D) fp32
        return acc, lsum, m_new

    # spec: flash_forward_torch; grid (query tiles, batch * heads)
    @triton.jit
    def attn_fwd_kernel(
        Q,
        K,
        V,
        O,  # noqa: E741  (the paper's Q, K, V, O; kernel_check reads the argument names)
        L,
        sq_b,
        sq_h,
        sq_t,
        sq_d,
        sk_b,
        sk_h,
        sk_t,
        sk_d,
        sv_b,
        sv_h,
        sv_t,
        sv_d,
        so_b,
        so_h,
        so_t,
        so_d,
        H,
        Tq,
        Tk,
        scale,
        D: tl.constexpr,
        BQ: tl.constexpr,
        BK: tl.constexpr,
        IS_CAUSAL: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """One program per (query tile, batch*head): O and L for BQ query rows, loading K and V tile by tile."""
        i = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)  # int64 offsets: B * H * T * d may exceed 2**31
        b, h = bh // H, bh % H
        K += b * sk_b + h * sk_h
        V += b * sv_b + h * sv_h
        qk_scale = scale * _LOG2E
        offs_q = i * BQ + tl.arange(0, BQ)  # (BQ,)
        offs_d = tl.arange(0, D)
        in_q = offs_q[:, None] < Tq  # (BQ, 1)
        q = tl.load(Q + b * sq_b + h * sq_h + offs_q[:, None] * sq_t + offs_d[None, :] * sq_d, mask=in_q, other=0.0)
        m = tl.full([BQ], float("-inf"), tl.float32)  # running max (log2 units)
        lsum = tl.zeros([BQ], tl.float32)  # running sum of exp2(s - m)
        acc = tl.zeros([BQ, D], tl.float32)
        if IS_CAUSAL:  # keys < i*BQ: all visible; [i*BQ, (i+1)*BQ): diagonal tiles, masked; later tiles skipped
            lo, hi = i * BQ, tl.minimum((i + 1) * BQ, Tk)
        else:  # full key tiles unmasked, the ragged last one masked
            lo, hi = Tk - Tk % BK, Tk
        for j0 in range(0, lo, BK):
            acc, lsum, m = _fwd_tile(
                acc,
                lsum,
                m,
                q,
                K,
                V,
                offs_q,
                j0,
                Tk,
                sk_t,
                sk_d,
                sv_t,
                sv_d,
                qk_scale,
                D,
                BK,
                False,
                IS_CAUSAL,
                PRECISION,
            )
        for j0 in range(lo, hi, BK):
            acc, lsum, m = _fwd_tile(
                acc,
                lsum,
                m,
                q,
                K,
                V,
                offs_q,
                j0,
                Tk,
                sk_t,
                sk_d,
                sv_t,
                sv_d,
                qk_scale,
                D,
                BK,
                True,
                IS_CAUSAL,
                PRECISION,
            )
        o_ptrs = O + b * so_b + h * so_h + offs_q[:, None] * so_t + offs_d[None, :] * so_d
        tl.store(o_ptrs, (acc / lsum[:, None]).to(O.dtype.element_ty), mask=in_q)
        tl.store(L + bh * Tq + offs_q, (m + tl.log2(lsum)) * _LN2, mask=offs_q < Tq)  # natural-log units


def _as_4d(x: Tensor) -> Tensor:
    """(..., T, d) as (B, H, T, d), H = x.shape[-3] (1 if absent): a view when the leading dims allow, so the
    usual (B, T, H, d).transpose(1, 2) layout reaches the kernels through its strides, without a copy."""
    return x[None, None] if x.dim() == 2 else x.reshape(-1, *x.shape[-3:])


def flash_forward_triton(q4: Tensor, k4: Tensor, v4: Tensor, is_causal: bool, cfg: LaunchConfig):
    """The forward kernel on (B, H, T, d) views at cfg.fwd's tiles: O (B, H, Tq, d) contiguous, L (B, H, Tq) fp32."""
    B, H, Tq, d = q4.shape
    o4 = torch.empty(B, H, Tq, d, dtype=q4.dtype, device=q4.device)  # (B, H, Tq, d)
    lse = torch.empty(B, H, Tq, dtype=torch.float32, device=q4.device)  # (B, H, Tq)
    t = cfg.fwd
    attn_fwd_kernel[(triton.cdiv(Tq, t.own), B * H)](
        q4, k4, v4, o4, lse, *q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(), H, Tq, k4.shape[2], d**-0.5,
        D=d, BQ=t.own, BK=t.loop, IS_CAUSAL=is_causal, PRECISION=cfg.dot_precision, num_warps=t.num_warps,
        num_stages=t.num_stages,
    )  # fmt: skip
    return o4, lse


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 in Triton: one forward kernel; backward = a D = rowsum(dO * O) kernel, a dK/dV kernel per key
    tile, a dQ kernel per query tile.

    Why two backward kernels rather than one pass with atomic dQ adds (FA-2's CUDA code): every output tile has one
    owner, so the result is deterministic and needs no zeroed fp32 dQ buffer, no cast kernel after it, and no
    BM x d fp32 atomics per tile pair (T^2 d / BN of them: at the leaderboard's shape ~0.3 GB of L2 atomic traffic,
    which Triton issues one element at a time); the price is recomputing S and dP in the dQ kernel (7 matmuls instead
    of 5), which the tutorial's split pays too. Whether atomics win on a given GPU is for the sweep to show; this is
    the variant that needs no tuning to be correct. Inputs are read through their strides; the outputs O, dQ, dK,
    dV come back contiguous.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        _check(q, k, v, is_causal, triton_kernels=True)
        q4, k4, v4 = _as_4d(q), _as_4d(k), _as_4d(v)  # (B, H, T, d)
        cfg = _launch_config(q4.shape[-1], q.dtype, q.device)
        o4, lse = flash_forward_triton(q4, k4, v4, is_causal, cfg)
        o = o4.view(q.shape)
        ctx.save_for_backward(lse.view(q.shape[:-1]), q, k, v, o)
        ctx.is_causal, ctx.cfg = is_causal, cfg
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        lse, q, k, v, o = ctx.saved_tensors
        q4, k4, v4, o4, do4 = (_as_4d(x) for x in (q, k, v, o, do))  # (B, H, T, d)
        dq, dk, dv = flash_backward_triton(q4, k4, v4, o4, lse, do4, ctx.is_causal, ctx.cfg)
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), None
