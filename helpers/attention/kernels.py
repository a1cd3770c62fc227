"""FlashAttention-2 in Triton (Algorithms 1 and 2 of the FA-2 paper): one forward kernel, a dK/dV and a dQ kernel
for the backward, each beside its PyTorch spec in helpers.attention.pytorch, and the autograd Function launching
them. Without CUDA they run in Triton's interpreter (`import helpers` sets TRITON_INTERPRET=1).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from helpers.attention.reference import _check
from helpers.attention.tiles import _launch_config
from helpers.env import import_triton

triton, tl = import_triton()  # (None, None) e.g. on macOS: the PyTorch paths still work


if triton is not None:
    _INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")

    @triton.jit
    def _dot(a, b, acc, PRECISION: tl.constexpr):
        """tl.dot accumulating in fp32; the interpreter gets fp32 copies, since its tl.dot multiplies bf16 bit
        patterns as integers (triton-lang/triton#11584). bf16 products are exact in fp32, so nothing changes."""
        if _INTERPRETED:
            a, b = a.to(tl.float32), b.to(tl.float32)
        return tl.dot(a, b, acc, input_precision=PRECISION)

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
        scale,
        D: tl.constexpr,
        BK: tl.constexpr,
        MASKED: tl.constexpr,
        IS_CAUSAL: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """Keys j0 .. j0+BK-1 update acc (BQ, D), lsum and m (BQ,); MASKED tiles hide keys >= Tk (and j > i if
        causal)."""
        offs_k = j0 + tl.arange(0, BK)  # (BK,)
        offs_d = tl.arange(0, D)
        in_k = offs_k[:, None] < Tk  # (BK, 1)
        k = tl.load(K + offs_k[:, None] * sk_t + offs_d[None, :] * sk_d, mask=in_k, other=0.0)  # (BK, D)
        v = tl.load(V + offs_k[:, None] * sv_t + offs_d[None, :] * sv_d, mask=in_k, other=0.0)  # (BK, D)
        s = _dot(q, tl.trans(k), None, PRECISION) * scale  # (BQ, BK) fp32
        if MASKED:
            keep = offs_k[None, :] < Tk  # (1, BK)
            if IS_CAUSAL:
                keep = keep & (offs_k[None, :] <= offs_q[:, None])  # (BQ, BK)
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))  # (BQ,)
        alpha = tl.exp(m - m_new)  # (BQ,)
        p = tl.exp(s - m_new[:, None])  # (BQ, BK)
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
        offs_q = i * BQ + tl.arange(0, BQ)  # (BQ,)
        offs_d = tl.arange(0, D)
        in_q = offs_q[:, None] < Tq  # (BQ, 1)
        q = tl.load(Q + b * sq_b + h * sq_h + offs_q[:, None] * sq_t + offs_d[None, :] * sq_d, mask=in_q, other=0.0)
        m = tl.full([BQ], float("-inf"), tl.float32)  # running max
        lsum = tl.zeros([BQ], tl.float32)  # running sum of exp(s - m)
        acc = tl.zeros([BQ, D], tl.float32)
        if IS_CAUSAL:  # keys < i*BQ: all visible; [i*BQ, (i+1)*BQ): diagonal tiles, masked; later tiles skipped
            lo, hi = i * BQ, tl.minimum((i + 1) * BQ, Tk)
        else:  # full key tiles unmasked, the ragged last one masked
            lo, hi = Tk - Tk % BK, Tk
        for j0 in range(0, lo, BK):
            acc, lsum, m = _fwd_tile(
                acc, lsum, m, q, K, V, offs_q, j0, Tk, sk_t, sk_d, sv_t, sv_d, scale, D, BK, False, IS_CAUSAL, PRECISION
            )
        for j0 in range(lo, hi, BK):
            acc, lsum, m = _fwd_tile(
                acc, lsum, m, q, K, V, offs_q, j0, Tk, sk_t, sk_d, sv_t, sv_d, scale, D, BK, True, IS_CAUSAL, PRECISION
            )
        o_ptrs = O + b * so_b + h * so_h + offs_q[:, None] * so_t + offs_d[None, :] * so_d
        tl.store(o_ptrs, (acc / lsum[:, None]).to(O.dtype.element_ty), mask=in_q)
        tl.store(L + bh * Tq + offs_q, m + tl.log(lsum), mask=offs_q < Tq)

    # spec: flash_backward_torch's outer loop (dK, dV of one key tile); grid (key tiles, batch * heads)
    @triton.jit
    def attn_bwd_dkdv_kernel(
        Q,
        K,
        V,
        dO,
        L,
        Delta,
        dK,
        dV,
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
        sdo_b,
        sdo_h,
        sdo_t,
        sdo_d,
        H,
        Tq,
        Tk,
        scale,
        D: tl.constexpr,
        BN: tl.constexpr,
        BM: tl.constexpr,
        IS_CAUSAL: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """dK, dV for BN key rows, looping over query tiles; works on transposes (S^T = K Q^T), so P^T needs no
        transpose. dK and dV are written contiguous (B, H, Tk, D)."""
        j = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        b, h = bh // H, bh % H
        Q += b * sq_b + h * sq_h
        dO += b * sdo_b + h * sdo_h
        offs_k = j * BN + tl.arange(0, BN)  # (BN,)
        offs_d = tl.arange(0, D)
        in_k = offs_k[:, None] < Tk
        k = tl.load(K + b * sk_b + h * sk_h + offs_k[:, None] * sk_t + offs_d[None, :] * sk_d, mask=in_k, other=0.0)
        v = tl.load(V + b * sv_b + h * sv_h + offs_k[:, None] * sv_t + offs_d[None, :] * sv_d, mask=in_k, other=0.0)
        dk = tl.zeros([BN, D], tl.float32)
        dv = tl.zeros([BN, D], tl.float32)
        # padded query rows load q = dO = L = Delta = 0, so they add 0 to dk and dv; padded key rows are not stored
        for i0 in range((j * BN) if IS_CAUSAL else 0, Tq, BM):  # causal: queries i < j*BN never see these keys
            offs_q = i0 + tl.arange(0, BM)  # (BM,)
            in_q = offs_q[None, :] < Tq  # (1, BM)
            qT = tl.load(Q + offs_q[None, :] * sq_t + offs_d[:, None] * sq_d, mask=in_q, other=0.0)  # (D, BM)
            do = tl.load(
                dO + offs_q[:, None] * sdo_t + offs_d[None, :] * sdo_d, mask=offs_q[:, None] < Tq, other=0.0
            )  # (BM, D)
            lse = tl.load(L + bh * Tq + offs_q, mask=offs_q < Tq, other=0.0)  # (BM,)
            delta = tl.load(Delta + bh * Tq + offs_q, mask=offs_q < Tq, other=0.0)  # (BM,)
            sT = _dot(k, qT, None, PRECISION) * scale  # (BN, BM) S^T
            keep = in_k  # (BN, 1): padded keys' rows are never stored, but exp(0 - L) there could overflow
            if IS_CAUSAL:  # only diagonal tiles need it; the select is cheap next to 4 dots
                keep = keep & (offs_q[None, :] >= offs_k[:, None])
            pT = tl.exp(tl.where(keep, sT, float("-inf")) - lse[None, :])  # (BN, BM) P^T
            dv = _dot(pT.to(do.dtype), do, dv, PRECISION)  # (BN, D)
            dpT = _dot(v, tl.trans(do), None, PRECISION)  # (BN, BM) dP^T
            dsT = pT * (dpT - delta[None, :])  # (BN, BM) dS^T
            dk = _dot(dsT.to(qT.dtype), tl.trans(qT), dk, PRECISION)  # (BN, D)
        offs = bh * Tk * D + offs_k[:, None] * D + offs_d[None, :]  # dK, dV: contiguous (B, H, Tk, D)
        tl.store(dK + offs, (dk * scale).to(dK.dtype.element_ty), mask=in_k)
        tl.store(dV + offs, dv.to(dV.dtype.element_ty), mask=in_k)

    # spec: the dq line of flash_backward_torch, for one query tile; grid (query tiles, batch * heads)
    @triton.jit
    def attn_bwd_dq_kernel(
        Q,
        K,
        V,
        dO,
        L,
        Delta,
        dQ,
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
        sdo_b,
        sdo_h,
        sdo_t,
        sdo_d,
        H,
        Tq,
        Tk,
        scale,
        D: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        IS_CAUSAL: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """dQ for BM query rows, looping over key tiles (S and dP recomputed: 3 dots per tile)."""
        i = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        b, h = bh // H, bh % H
        K += b * sk_b + h * sk_h
        V += b * sv_b + h * sv_h
        offs_q = i * BM + tl.arange(0, BM)  # (BM,)
        offs_d = tl.arange(0, D)
        in_q = offs_q[:, None] < Tq
        q = tl.load(Q + b * sq_b + h * sq_h + offs_q[:, None] * sq_t + offs_d[None, :] * sq_d, mask=in_q, other=0.0)
        do = tl.load(
            dO + b * sdo_b + h * sdo_h + offs_q[:, None] * sdo_t + offs_d[None, :] * sdo_d, mask=in_q, other=0.0
        )  # (BM, D)
        lse = tl.load(L + bh * Tq + offs_q, mask=offs_q < Tq, other=0.0)  # (BM,)
        delta = tl.load(Delta + bh * Tq + offs_q, mask=offs_q < Tq, other=0.0)  # (BM,)
        dq = tl.zeros([BM, D], tl.float32)
        for j0 in range(0, tl.minimum((i + 1) * BM, Tk) if IS_CAUSAL else Tk, BN):  # causal: skip keys > last query
            offs_k = j0 + tl.arange(0, BN)  # (BN,)
            in_k = offs_k[None, :] < Tk  # (1, BN)
            kT = tl.load(K + offs_k[None, :] * sk_t + offs_d[:, None] * sk_d, mask=in_k, other=0.0)  # (D, BN)
            vT = tl.load(V + offs_k[None, :] * sv_t + offs_d[:, None] * sv_d, mask=in_k, other=0.0)  # (D, BN)
            s = _dot(q, kT, None, PRECISION) * scale  # (BM, BN)
            keep = in_k  # padded keys must go: k = 0 there, but exp(0 - L) can be inf, and inf * 0 = nan
            if IS_CAUSAL:
                keep = keep & (offs_k[None, :] <= offs_q[:, None])
            p = tl.exp(tl.where(keep, s, float("-inf")) - lse[:, None])  # (BM, BN)
            ds = p * (_dot(do, vT, None, PRECISION) - delta[:, None])  # (BM, BN) dS = P * (dP - D)
            dq = _dot(ds.to(kT.dtype), tl.trans(kT), dq, PRECISION)  # (BM, D)
        offs = bh * Tq * D + offs_q[:, None] * D + offs_d[None, :]  # dQ: contiguous (B, H, Tq, D)
        tl.store(dQ + offs, (dq * scale).to(dQ.dtype.element_ty), mask=in_q)


def _as_4d(x: Tensor) -> Tensor:
    """(..., T, d) as (B, H, T, d), H = x.shape[-3] (1 if absent): a view when the leading dims allow, so the
    usual (B, T, H, d).transpose(1, 2) layout reaches the kernels through its strides, without a copy."""
    return x[None, None] if x.dim() == 2 else x.reshape(-1, *x.shape[-3:])


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 in Triton: one forward kernel; backward = D = rowsum(dO * O) in torch (elementwise ops on
    (B, H, Tq, d), O(T d) like the rest; a kernel would only spare fp32 temporaries) + a dK/dV kernel per key tile
    + a dQ kernel per query tile.

    Why two backward kernels rather than one pass with atomic dQ adds: every output tile has one owner, so the
    result is deterministic and needs no fp32 atomics or zeroed dQ buffer; the price is recomputing S and dP in
    the dQ kernel (7 matmuls instead of 5). That is what FA-2 does. Inputs are read through their strides; the
    outputs O, dQ, dK, dV come back contiguous.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        _check(q, k, v, is_causal, triton_kernels=True)
        q4, k4, v4 = _as_4d(q), _as_4d(k), _as_4d(v)  # (B, H, T, d)
        B, H, Tq, d = q4.shape
        cfg = _launch_config(d, q.dtype, q.device)
        o4 = torch.empty(B, H, Tq, d, dtype=q.dtype, device=q.device)  # (B, H, Tq, d)
        lse = torch.empty(B, H, Tq, dtype=torch.float32, device=q.device)  # (B, H, Tq)
        attn_fwd_kernel[(triton.cdiv(Tq, cfg.block_q), B * H)](
            q4,
            k4,
            v4,
            o4,
            lse,
            *q4.stride(),
            *k4.stride(),
            *v4.stride(),
            *o4.stride(),
            H,
            Tq,
            k4.shape[2],
            d**-0.5,
            D=d,
            BQ=cfg.block_q,
            BK=cfg.block_k,
            IS_CAUSAL=is_causal,
            PRECISION=cfg.dot_precision,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
        o = o4.view(q.shape)
        ctx.save_for_backward(lse.view(q.shape[:-1]), q, k, v, o)
        ctx.is_causal, ctx.cfg = is_causal, cfg
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        lse, q, k, v, o = ctx.saved_tensors
        q4, k4, v4, o4, do4 = (_as_4d(x) for x in (q, k, v, o, do))  # (B, H, T, d)
        (B, H, Tq, d), Tk, cfg = q4.shape, k4.shape[2], ctx.cfg
        delta = (do4.float() * o4.float()).sum(-1)  # (B, H, Tq) fp32: D = rowsum(dO * O)
        dq, dk, dv = (torch.empty(B, H, x.shape[2], d, dtype=x.dtype, device=x.device) for x in (q4, k4, v4))
        args = (*q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), H, Tq, Tk, d**-0.5)
        opts = dict(
            D=d,
            IS_CAUSAL=ctx.is_causal,
            PRECISION=cfg.dot_precision,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
        attn_bwd_dkdv_kernel[(triton.cdiv(Tk, cfg.block_own), B * H)](
            q4, k4, v4, do4, lse, delta, dk, dv, *args, BN=cfg.block_own, BM=cfg.block_loop, **opts
        )
        attn_bwd_dq_kernel[(triton.cdiv(Tq, cfg.block_own), B * H)](
            q4, k4, v4, do4, lse, delta, dq, *args, BM=cfg.block_own, BN=cfg.block_loop, **opts
        )
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), None
