"""FlashAttention-2's backward in Triton (Algorithm 2 of the FA-2 paper): a small kernel for D = rowsum(dO * O), a
dK/dV kernel per key tile and a dQ kernel per query tile, each beside its PyTorch spec in helpers.attention.pytorch,
and the functions launching them (FlashAttentionTriton, in helpers.attention.kernels, says why two kernels)."""

from __future__ import annotations

import torch
from torch import Tensor

from helpers.attention.kernels_common import tl, triton
from helpers.attention.tiles import LaunchConfig

DELTA_BLOCK = 128  # query rows per program of the D = rowsum(dO * O) kernel (memory-bound: any size near this)


if triton is not None:
    from helpers.attention.kernels_common import _LOG2E, _dot

    # spec: delta = (do * o).sum(-1) in fp32, the first line of flash_backward_torch; grid (query tiles, batch * heads)
    @triton.jit
    def attn_bwd_delta_kernel(
        O,  # noqa: E741
        dO,
        Delta,
        so_b,
        so_h,
        so_t,
        so_d,
        sdo_b,
        sdo_h,
        sdo_t,
        sdo_d,
        H,
        Tq,
        D: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """D = rowsum(dO * O) for BLOCK query rows in fp32, read through the strides (no fp32 copies of O, dO)."""
        bh = tl.program_id(1).to(tl.int64)
        b, h = bh // H, bh % H
        offs_q = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
        offs_d = tl.arange(0, D)
        in_q = offs_q < Tq
        o = tl.load(O + b * so_b + h * so_h + offs_q[:, None] * so_t + offs_d[None, :] * so_d, mask=in_q[:, None])
        do = tl.load(
            dO + b * sdo_b + h * sdo_h + offs_q[:, None] * sdo_t + offs_d[None, :] * sdo_d, mask=in_q[:, None]
        )  # (BLOCK, D)
        tl.store(Delta + bh * Tq + offs_q, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=in_q)

    # spec: one query tile of flash_backward_torch's inner loop, its dk and dv lines
    @triton.jit
    def _dkdv_tile(
        dk,
        dv,
        k,
        v,
        Q,
        dO,
        L,
        Delta,
        offs_k,
        i0,
        Tq,
        sq_t,
        sq_d,
        sdo_t,
        sdo_d,
        qk_scale,
        D: tl.constexpr,
        BM: tl.constexpr,
        MASKED: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """Queries i0 .. i0+BM-1 add to dk, dv (BN, D); works on transposes (S^T = K Q^T), so P^T needs no transpose.
        MASKED (causal diagonal tiles) drops pairs with key j > query i. No other mask: padded queries load q = dO =
        L = D = 0 and add 0; padded keys' rows may hold inf, but a matmul's output row reads only its own row and
        those rows are never stored."""
        offs_q = i0 + tl.arange(0, BM)  # (BM,)
        offs_d = tl.arange(0, D)
        in_q = offs_q < Tq
        qT = tl.load(Q + offs_q[None, :] * sq_t + offs_d[:, None] * sq_d, mask=in_q[None, :], other=0.0)  # (D, BM)
        do = tl.load(dO + offs_q[:, None] * sdo_t + offs_d[None, :] * sdo_d, mask=in_q[:, None], other=0.0)  # (BM, D)
        lse2 = tl.load(L + offs_q, mask=in_q, other=0.0) * _LOG2E  # (BM,) L in log2 units
        delta = tl.load(Delta + offs_q, mask=in_q, other=0.0)  # (BM,)
        sT = _dot(k, qT, None, PRECISION) * qk_scale  # (BN, BM) S^T, log2 units
        if MASKED:
            sT = tl.where(offs_q[None, :] >= offs_k[:, None], sT, float("-inf"))
        pT = tl.exp2(sT - lse2[None, :])  # (BN, BM) P^T
        dv = _dot(pT.to(do.dtype), do, dv, PRECISION)  # (BN, D)
        dpT = _dot(v, tl.trans(do), None, PRECISION)  # (BN, BM) dP^T
        dsT = pT * (dpT - delta[None, :])  # (BN, BM) dS^T
        dk = _dot(dsT.to(qT.dtype), tl.trans(qT), dk, PRECISION)  # (BN, D)
        return dk, dv

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
        """dK, dV for BN key rows, looping over query tiles. Causal: query tiles before j*BN skipped, the BN / BM
        diagonal ones masked, the rest unmasked. dK and dV are written contiguous (B, H, Tk, D)."""
        j = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        b, h = bh // H, bh % H
        Q += b * sq_b + h * sq_h
        dO += b * sdo_b + h * sdo_h
        L += bh * Tq
        Delta += bh * Tq
        qk_scale = scale * _LOG2E
        offs_k = j * BN + tl.arange(0, BN)  # (BN,)
        offs_d = tl.arange(0, D)
        in_k = offs_k[:, None] < Tk
        k = tl.load(K + b * sk_b + h * sk_h + offs_k[:, None] * sk_t + offs_d[None, :] * sk_d, mask=in_k, other=0.0)
        v = tl.load(V + b * sv_b + h * sv_h + offs_k[:, None] * sv_t + offs_d[None, :] * sv_d, mask=in_k, other=0.0)
        dk = tl.zeros([BN, D], tl.float32)
        dv = tl.zeros([BN, D], tl.float32)
        if IS_CAUSAL:  # queries i < j*BN never see these keys; [j*BN, (j+1)*BN): the diagonal tiles
            lo, mid = j * BN, tl.minimum((j + 1) * BN, Tq)
        else:
            lo, mid = 0, 0
        for i0 in range(lo, mid, BM):
            dk, dv = _dkdv_tile(
                dk,
                dv,
                k,
                v,
                Q,
                dO,
                L,
                Delta,
                offs_k,
                i0,
                Tq,
                sq_t,
                sq_d,
                sdo_t,
                sdo_d,
                qk_scale,
                D,
                BM,
                True,
                PRECISION,
            )
        for i0 in range(mid, Tq, BM):
            dk, dv = _dkdv_tile(
                dk,
                dv,
                k,
                v,
                Q,
                dO,
                L,
                Delta,
                offs_k,
                i0,
                Tq,
                sq_t,
                sq_d,
                sdo_t,
                sdo_d,
                qk_scale,
                D,
                BM,
                False,
                PRECISION,
            )
        offs = bh * Tk * D + offs_k[:, None] * D + offs_d[None, :]  # dK, dV: contiguous (B, H, Tk, D)
        tl.store(dK + offs, (dk * scale).to(dK.dtype.element_ty), mask=in_k)
        tl.store(dV + offs, dv.to(dV.dtype.element_ty), mask=in_k)

    # spec: one key tile of the dq line of flash_backward_torch
    @triton.jit
    def _dq_tile(
        dq,
        q,
        do,
        lse2,
        delta,
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
        BN: tl.constexpr,
        MASKED: tl.constexpr,
        IS_CAUSAL: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """Keys j0 .. j0+BN-1 add to dq (BM, D): S and dP recomputed (3 dots). MASKED tiles hide keys >= Tk, which
        must go (k = 0 there, but exp2(0 - L) can be inf, and inf * 0 = nan), and j > i if causal."""
        offs_k = j0 + tl.arange(0, BN)  # (BN,)
        offs_d = tl.arange(0, D)
        in_k = offs_k[None, :] < Tk  # (1, BN)
        kT = tl.load(K + offs_k[None, :] * sk_t + offs_d[:, None] * sk_d, mask=in_k, other=0.0)  # (D, BN)
        vT = tl.load(V + offs_k[None, :] * sv_t + offs_d[:, None] * sv_d, mask=in_k, other=0.0)  # (D, BN)
        s = _dot(q, kT, None, PRECISION) * qk_scale  # (BM, BN), log2 units
        if MASKED:
            keep = in_k
            if IS_CAUSAL:
                keep = keep & (offs_k[None, :] <= offs_q[:, None])
            s = tl.where(keep, s, float("-inf"))
        p = tl.exp2(s - lse2[:, None])  # (BM, BN)
        ds = p * (_dot(do, vT, None, PRECISION) - delta[:, None])  # (BM, BN) dS = P * (dP - D)
        return _dot(ds.to(kT.dtype), tl.trans(kT), dq, PRECISION)  # (BM, D)

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
        """dQ for BM query rows, looping over key tiles: causal skips keys after the tile's last query and masks
        only the diagonal tiles; otherwise only a ragged last key tile is masked."""
        i = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        b, h = bh // H, bh % H
        K += b * sk_b + h * sk_h
        V += b * sv_b + h * sv_h
        qk_scale = scale * _LOG2E
        offs_q = i * BM + tl.arange(0, BM)  # (BM,)
        offs_d = tl.arange(0, D)
        in_q = offs_q[:, None] < Tq
        q = tl.load(Q + b * sq_b + h * sq_h + offs_q[:, None] * sq_t + offs_d[None, :] * sq_d, mask=in_q, other=0.0)
        do = tl.load(
            dO + b * sdo_b + h * sdo_h + offs_q[:, None] * sdo_t + offs_d[None, :] * sdo_d, mask=in_q, other=0.0
        )  # (BM, D)
        lse2 = tl.load(L + bh * Tq + offs_q, mask=offs_q < Tq, other=0.0) * _LOG2E  # (BM,) log2 units
        delta = tl.load(Delta + bh * Tq + offs_q, mask=offs_q < Tq, other=0.0)  # (BM,)
        dq = tl.zeros([BM, D], tl.float32)
        if IS_CAUSAL:  # keys < i*BM: all visible; [i*BM, (i+1)*BM): diagonal tiles, masked; later tiles skipped
            lo, hi = i * BM, tl.minimum((i + 1) * BM, Tk)
        else:  # full key tiles unmasked, the ragged last one masked
            lo, hi = Tk - Tk % BN, Tk
        for j0 in range(0, lo, BN):
            dq = _dq_tile(
                dq, q, do, lse2, delta, K, V, offs_q, j0, Tk, sk_t, sk_d, sv_t, sv_d, qk_scale, D, BN, False, IS_CAUSAL,
                PRECISION,
            )  # fmt: skip
        for j0 in range(lo, hi, BN):
            dq = _dq_tile(
                dq, q, do, lse2, delta, K, V, offs_q, j0, Tk, sk_t, sk_d, sv_t, sv_d, qk_scale, D, BN, True, IS_CAUSAL,
                PRECISION,
            )  # fmt: skip
        offs = bh * Tq * D + offs_q[:, None] * D + offs_d[None, :]  # dQ: contiguous (B, H, Tq, D)
        tl.store(dQ + offs, (dq * scale).to(dQ.dtype.element_ty), mask=in_q)


def bwd_delta(o4: Tensor, do4: Tensor) -> Tensor:
    """D = rowsum(dO * O), (B, H, Tq) fp32, by attn_bwd_delta_kernel."""
    B, H, Tq, d = o4.shape
    delta = torch.empty(B, H, Tq, dtype=torch.float32, device=o4.device)  # (B, H, Tq)
    attn_bwd_delta_kernel[(triton.cdiv(Tq, DELTA_BLOCK), B * H)](
        o4, do4, delta, *o4.stride(), *do4.stride(), H, Tq, D=d, BLOCK=DELTA_BLOCK, num_warps=4
    )
    return delta


def bwd_kernel(name: str, q4, k4, v4, do4, lse, delta, is_causal: bool, cfg: LaunchConfig) -> tuple[Tensor, ...]:
    """One backward kernel ("dkdv" -> (dk, dv), "dq" -> (dq,)) at cfg's tiles for it, on (B, H, T, d) views."""
    (B, H, Tq, d), Tk = q4.shape, k4.shape[2]
    args = (*q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), H, Tq, Tk, d**-0.5)
    t = getattr(cfg, name)
    opts = dict(D=d, IS_CAUSAL=is_causal, PRECISION=cfg.dot_precision, num_warps=t.num_warps, num_stages=t.num_stages)
    if name == "dkdv":
        dk, dv = (torch.empty(B, H, Tk, d, dtype=x.dtype, device=x.device) for x in (k4, v4))
        grid = (triton.cdiv(Tk, t.own), B * H)
        attn_bwd_dkdv_kernel[grid](q4, k4, v4, do4, lse, delta, dk, dv, *args, BN=t.own, BM=t.loop, **opts)
        return dk, dv
    dq = torch.empty(B, H, Tq, d, dtype=q4.dtype, device=q4.device)
    attn_bwd_dq_kernel[(triton.cdiv(Tq, t.own), B * H)](
        q4, k4, v4, do4, lse, delta, dq, *args, BM=t.own, BN=t.loop, **opts
    )
    return (dq,)


def flash_backward_triton(
    q4: Tensor, k4: Tensor, v4: Tensor, o4: Tensor, lse: Tensor, do4: Tensor, is_causal: bool, cfg: LaunchConfig
):
    """D, then the dK/dV and dQ kernels on (B, H, T, d) views, L (B, H, Tq) contiguous: dq, dk, dv contiguous."""
    delta = bwd_delta(o4, do4)  # (B, H, Tq)
    dk, dv = bwd_kernel("dkdv", q4, k4, v4, do4, lse, delta, is_causal, cfg)
    (dq,) = bwd_kernel("dq", q4, k4, v4, do4, lse, delta, is_causal, cfg)
    return dq, dk, dv
