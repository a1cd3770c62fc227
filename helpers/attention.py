"""FlashAttention-2 (notebook 06): naive attention, a tiled PyTorch spec, and Triton kernels, forward and backward.

    o = FlashAttentionTriton.apply(q, k, v, True)       # q (..., Tq, d), k and v (..., Tk, d); causal needs Tq == Tk
    o = FlashAttentionPyTorch.apply(q, k, v)            # the same tiles in PyTorch ops: the spec the kernels must match
    attention_flops(B * H, T, T, d, is_causal=True, backward=True); score_matrix_bytes(B * H, T, T, torch.bfloat16)

Both Functions save one tensor beside q, k, v, O: L = row-wise logsumexp of the scaled scores, (..., Tq) in fp32.
Backward recomputes P = exp(S - L) tile by tile, so no Tq x Tk matrix lives between forward and backward.
Without CUDA the kernels run in Triton's interpreter (`import helpers` sets TRITON_INTERPRET=1): correct, but slow.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # e.g. macOS: the PyTorch paths still work
    triton = tl = None

HEAD_DIMS = (16, 32, 64, 128)  # Triton: a head row is one block (power of two), and tl.dot needs K >= 16
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TORCH_DTYPES = TRITON_DTYPES + (torch.float64,)  # the PyTorch spec also runs in fp64 (gradcheck)


# ---- Naive attention (the reference) and closed forms for its cost -------------------------------------------


def _scores(q: Tensor, k: Tensor, is_causal: bool) -> Tensor:
    """Scaled scores S = q k^T / sqrt(d), -inf where key j > query i when causal: (..., Tq, Tk)."""
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (..., Tq, Tk)
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()  # (Tq, Tk)
        s = s.masked_fill(~keep, float("-inf"))
    return s


def naive_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """softmax(q k^T / sqrt(d)) v with the whole (..., Tq, Tk) score matrix in memory: the reference."""
    return torch.softmax(_scores(q, k, is_causal), dim=-1) @ v  # (..., Tq, d)


def attention_lse(q: Tensor, k: Tensor, is_causal: bool = False) -> Tensor:
    """Row-wise logsumexp of the scaled scores in (at least) fp32, (..., Tq): what the Functions save as L."""
    up = torch.promote_types(q.dtype, torch.float32)
    return torch.logsumexp(_scores(q.to(up), k.to(up), is_causal), dim=-1)  # (..., Tq)


def attention_flops(batch_heads: int, Tq: int, Tk: int, d: int, is_causal: bool = False, backward: bool = False) -> int:
    """Matmul FLOPs of attention (FA-2 accounting; softmax not counted), forward or backward alone.

    Forward: 2 matmuls (S = Q K^T, O = P V), 2*d FLOPs each per (query, key) pair -> 4*d per pair.
    Backward: 5 matmuls (S recomputed, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q) -> 2.5x forward.
    (FlashAttentionTriton's split backward recomputes S and dP once more for dQ: 7 matmuls, 3.5x.)
    Causal counts only the Tq(Tq+1)/2 pairs with j <= i, as if masked tiles cost nothing.
    """
    if is_causal and Tq != Tk:
        raise ValueError(f"causal attention needs Tq == Tk; got Tq={Tq}, Tk={Tk}")
    pairs = Tq * (Tq + 1) // 2 if is_causal else Tq * Tk
    return batch_heads * pairs * d * (10 if backward else 4)


def score_matrix_bytes(batch_heads: int, Tq: int, Tk: int, dtype: torch.dtype) -> int:
    """Bytes of one (batch_heads, Tq, Tk) score matrix: what naive attention materialises (P is as big again)."""
    return batch_heads * Tq * Tk * dtype.itemsize


def _check(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, triton_kernels: bool) -> None:
    """Raise a ValueError that says what to do when (q, k, v) cannot go through FlashAttention."""
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(f"q, k, v must be (..., T, d) with the same number of dims; got {shapes}")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(
            f"q, k, v must have the same leading dims (no broadcasting); got {shapes}: "
            "expand or repeat k and v first (e.g. for grouped-query attention)"
        )
    if k.shape != v.shape or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"k and v must both be (..., Tk, d) with q's d; got {shapes}")
    if q.numel() == 0 or k.numel() == 0:
        raise ValueError(f"q, k, v must be non-empty; got {shapes}")
    if is_causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"causal attention (query i sees keys j <= i) needs Tq == Tk; got {shapes}: "
            "pass is_causal=False or give q and k the same length"
        )
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}: cast them first")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v are on {q.device}, {k.device}, {v.device}; move them to one device")
    dtypes = TRITON_DTYPES if triton_kernels else TORCH_DTYPES
    if q.dtype not in dtypes:
        raise ValueError(
            f"{'Triton' if triton_kernels else 'PyTorch'} FlashAttention supports {dtypes}; "
            f"got {q.dtype}: cast q, k, v first"
        )
    if not triton_kernels:
        return
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(
            f"the Triton kernels support head dims d in {HEAD_DIMS}; got d = {q.shape[-1]}: "
            "use FlashAttentionPyTorch (any d) or a model whose head dim is one of these"
        )
    if triton is None:
        raise ValueError("Triton is not installed; use FlashAttentionPyTorch, or install triton (Linux)")
    if q.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "CPU tensors need Triton's interpreter: move q, k, v to CUDA, or set TRITON_INTERPRET=1 "
            "before triton is imported (import helpers first)"
        )


# ---- One helper picks the tiles for both implementations ------------------------------------------------------


@dataclass(frozen=True)
class LaunchConfig:
    """Tiles and warps for one (d, dtype, device). Forward: block_q query rows x block_k key rows. Backward: a
    program owns block_own rows (keys for dK/dV, queries for dQ) and loops over block_loop rows of the other side."""

    block_q: int
    block_k: int
    block_own: int
    block_loop: int
    num_warps: int
    num_stages: int
    dot_precision: str  # "ieee" for fp32: full fp32 dots (no tf32), so fp32 results match the spec to ~1e-6


def _launch_config(d: int, dtype: torch.dtype, device) -> LaunchConfig:
    """Tile sizes and warps for FlashAttentionPyTorch and FlashAttentionTriton (block_q % block_k == 0 and
    block_own % block_loop == 0, so causal loop bounds fall on tile borders)."""
    precision = "ieee" if dtype == torch.float32 else "tf32"  # "tf32" only matters for fp32 operands
    if torch.device(device).type != "cuda":
        # interpreter / CPU: small tiles, so small test shapes still cross many tile borders and ragged edges;
        # block_q = 2 * block_k gives two diagonal key tiles per query tile, as on the GPU
        return LaunchConfig(32, 16, 32, 16, 4, 1, precision)
    # Chosen by compiling for sm_80 and sm_90a (ptxas -v): no register spills on either (e.g. 4 warps spill there).
    # 16-bit: 128 query rows share each K/V tile load; d = 128 halves the key tile to keep S and O in registers.
    # Backward programs hold k, v, dk, dv (or q, dO, dq) for 64 rows and stream 32-row tiles of the other side.
    # fp32 ("ieee") dots run on FMA units, not tensor cores, and need far more registers: small tiles (fp32 on a
    # GPU is for checking; train in bf16).
    if dtype != torch.float32:  # (block_q, block_k, block_own, block_loop, num_warps, num_stages)
        choice = (128, 64, 64, 32, 8, 3) if d <= 64 else (128, 32, 64, 32, 8, 2)
    else:
        choice = (64, 32, 64, 16, 8, 2) if d <= 64 else (16, 16, 16, 16, 4, 3)
    return LaunchConfig(*choice, dot_precision=precision)


# ---- PyTorch: tiled online softmax, forward and backward (the spec) -------------------------------------------


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


# ---- Triton: forward in one kernel; backward as a dK/dV kernel and a dQ kernel --------------------------------

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
