"""Naive attention (the reference every implementation is checked against), closed forms for its cost, and the
input checks both FlashAttention Functions share.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from helpers.env import import_triton

triton, _ = import_triton()  # None e.g. on macOS: the PyTorch paths still work

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


def attention_probs(q: Tensor, k: Tensor, is_causal: bool = False) -> Tensor:
    """P = softmax(q k^T / sqrt(d)), (..., Tq, Tk): naive attention's weights (notebook 08's gradient scales)."""
    return torch.softmax(_scores(q, k, is_causal), dim=-1)


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
