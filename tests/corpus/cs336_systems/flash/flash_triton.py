"""FlashAttention-2 forward as the 2025 handout's skeleton lays it out: 3-D (batch, N, d), grid (query tiles, batch),
block pointers advanced along the keys, fp32 on-chip buffers, causal masking by index comparison, tiles of 16 (the
least the handout allows, so every length it promises is a multiple). Backward in PyTorch by recomputation from L,
in fp32 for bf16 inputs too."""
import math

import torch
import triton
import triton.language as tl


@triton.jit
def flash_fwd_kernel(Q_ptr, K_ptr, V_ptr, O_ptr, L_ptr,
                     stride_qb, stride_qq, stride_qd, stride_kb, stride_kk, stride_kd,
                     stride_vb, stride_vk, stride_vd, stride_ob, stride_oq, stride_od, stride_lb, stride_lq,
                     N_QUERIES, N_KEYS, scale,
                     D: tl.constexpr, Q_TILE_SIZE: tl.constexpr, K_TILE_SIZE: tl.constexpr, is_causal: tl.constexpr):
    query_tile_index = tl.program_id(0)
    batch_index = tl.program_id(1)
    Q_block_ptr = tl.make_block_ptr(Q_ptr + batch_index * stride_qb, shape=(N_QUERIES, D),
                                    strides=(stride_qq, stride_qd), offsets=(query_tile_index * Q_TILE_SIZE, 0),
                                    block_shape=(Q_TILE_SIZE, D), order=(1, 0))
    K_block_ptr = tl.make_block_ptr(K_ptr + batch_index * stride_kb, shape=(N_KEYS, D),
                                    strides=(stride_kk, stride_kd), offsets=(0, 0),
                                    block_shape=(K_TILE_SIZE, D), order=(1, 0))
    V_block_ptr = tl.make_block_ptr(V_ptr + batch_index * stride_vb, shape=(N_KEYS, D),
                                    strides=(stride_vk, stride_vd), offsets=(0, 0),
                                    block_shape=(K_TILE_SIZE, D), order=(1, 0))
    O_block_ptr = tl.make_block_ptr(O_ptr + batch_index * stride_ob, shape=(N_QUERIES, D),
                                    strides=(stride_oq, stride_od), offsets=(query_tile_index * Q_TILE_SIZE, 0),
                                    block_shape=(Q_TILE_SIZE, D), order=(1, 0))
    L_block_ptr = tl.make_block_ptr(L_ptr + batch_index * stride_lb, shape=(N_QUERIES,), strides=(stride_lq,),
                                    offsets=(query_tile_index * Q_TILE_SIZE,), block_shape=(Q_TILE_SIZE,),
                                    order=(0,))
    q = tl.load(Q_block_ptr, boundary_check=(0, 1), padding_option="zero")
    o = tl.zeros((Q_TILE_SIZE, D), dtype=tl.float32)
    l = tl.zeros((Q_TILE_SIZE,), dtype=tl.float32)
    m = tl.full((Q_TILE_SIZE,), float("-inf"), dtype=tl.float32)
    rows = query_tile_index * Q_TILE_SIZE + tl.arange(0, Q_TILE_SIZE)
    for j in range(tl.cdiv(N_KEYS, K_TILE_SIZE)):
        k = tl.load(K_block_ptr, boundary_check=(0, 1), padding_option="zero")
        v = tl.load(V_block_ptr, boundary_check=(0, 1), padding_option="zero")
        s = tl.dot(q, tl.trans(k)) * scale
        if is_causal:
            cols = j * K_TILE_SIZE + tl.arange(0, K_TILE_SIZE)
            s = tl.where(rows[:, None] >= cols[None, :], s, -1.0e6)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        l = alpha * l + tl.sum(p, axis=1)
        o = alpha[:, None] * o + tl.dot(p.to(v.dtype), v)
        m = m_new
        K_block_ptr = tl.advance(K_block_ptr, (K_TILE_SIZE, 0))
        V_block_ptr = tl.advance(V_block_ptr, (K_TILE_SIZE, 0))
    tl.store(O_block_ptr, (o / l[:, None]).to(O_block_ptr.type.element_ty), boundary_check=(0, 1))
    tl.store(L_block_ptr, m + tl.log(l), boundary_check=(0,))


def flash_forward(Q, K, V, is_causal=False, q_tile=16, k_tile=16):
    B, N_q, d = Q.shape
    O = torch.empty_like(Q)
    L = torch.empty(B, N_q, device=Q.device, dtype=torch.float32)
    flash_fwd_kernel[(triton.cdiv(N_q, q_tile), B)](
        Q, K, V, O, L, *Q.stride(), *K.stride(), *V.stride(), *O.stride(), *L.stride(),
        N_q, K.shape[1], 1 / math.sqrt(d), D=d, Q_TILE_SIZE=q_tile, K_TILE_SIZE=k_tile, is_causal=is_causal)
    return O, L


def flash_backward(Q, K, V, O, L, dO, is_causal):
    """Equations 13-19 by recomputation, in fp32 whatever the inputs' dtype."""
    Q, K, V, O, dO = (t.float() for t in (Q, K, V, O, dO))
    scale = 1 / math.sqrt(Q.shape[-1])
    S = Q @ K.transpose(-1, -2) * scale
    if is_causal:
        S = S.masked_fill(~torch.ones_like(S[0], dtype=torch.bool).tril(), -1e6)
    P = torch.exp(S - L[..., None])
    dS = P * (dO @ V.transpose(-1, -2) - (dO * O).sum(-1, keepdim=True))
    return dS @ K * scale, dS.transpose(-1, -2) @ Q * scale, P.transpose(-1, -2) @ dO


class FlashAttentionTritonBlockPtr(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        O, L = flash_forward(Q, K, V, is_causal)
        ctx.is_causal = is_causal
        ctx.save_for_backward(L, Q, K, V, O)
        return O

    @staticmethod
    def backward(ctx, dO):
        L, Q, K, V, O = ctx.saved_tensors
        dQ, dK, dV = flash_backward(Q, K, V, O, L, dO, ctx.is_causal)
        return dQ.to(Q.dtype), dK.to(K.dtype), dV.to(V.dtype), None
