"""Another Triton style: tiles of up to 64 queries and keys, never longer than the sequence, keys past N_k masked
with -inf, the causal mask added as -1e6 (the handout's words), P @ V accumulated with tl.dot(..., acc=); backward
in PyTorch by recomputation (fp32, cast back)."""
import math

import torch
import triton
import triton.language as tl


@triton.jit
def fwd_kernel(Q_ptr, K_ptr, V_ptr, O_ptr, L_ptr,
               stride_qb, stride_qq, stride_qd, stride_kb, stride_kk, stride_kd,
               stride_vb, stride_vk, stride_vd, stride_ob, stride_oq, stride_od, stride_lb, stride_lq,
               N_QUERIES, N_KEYS, scale,
               D: tl.constexpr, Q_TILE_SIZE: tl.constexpr, K_TILE_SIZE: tl.constexpr, is_causal: tl.constexpr):
    qi = tl.program_id(0)
    b = tl.program_id(1)
    Q_block_ptr = tl.make_block_ptr(Q_ptr + b * stride_qb, shape=(N_QUERIES, D), strides=(stride_qq, stride_qd),
                                    offsets=(qi * Q_TILE_SIZE, 0), block_shape=(Q_TILE_SIZE, D), order=(1, 0))
    K_block_ptr = tl.make_block_ptr(K_ptr + b * stride_kb, shape=(N_KEYS, D), strides=(stride_kk, stride_kd),
                                    offsets=(0, 0), block_shape=(K_TILE_SIZE, D), order=(1, 0))
    V_block_ptr = tl.make_block_ptr(V_ptr + b * stride_vb, shape=(N_KEYS, D), strides=(stride_vk, stride_vd),
                                    offsets=(0, 0), block_shape=(K_TILE_SIZE, D), order=(1, 0))
    O_block_ptr = tl.make_block_ptr(O_ptr + b * stride_ob, shape=(N_QUERIES, D), strides=(stride_oq, stride_od),
                                    offsets=(qi * Q_TILE_SIZE, 0), block_shape=(Q_TILE_SIZE, D), order=(1, 0))
    L_block_ptr = tl.make_block_ptr(L_ptr + b * stride_lb, shape=(N_QUERIES,), strides=(stride_lq,),
                                    offsets=(qi * Q_TILE_SIZE,), block_shape=(Q_TILE_SIZE,), order=(0,))
    q = tl.load(Q_block_ptr, boundary_check=(0, 1), padding_option="zero")
    acc = tl.zeros((Q_TILE_SIZE, D), dtype=tl.float32)
    l_i = tl.zeros((Q_TILE_SIZE,), dtype=tl.float32)
    m_i = tl.full((Q_TILE_SIZE,), float("-inf"), dtype=tl.float32)
    q_idx = qi * Q_TILE_SIZE + tl.arange(0, Q_TILE_SIZE)
    for start in range(0, N_KEYS, K_TILE_SIZE):
        k = tl.load(K_block_ptr, boundary_check=(0, 1), padding_option="zero")
        v = tl.load(V_block_ptr, boundary_check=(0, 1), padding_option="zero")
        k_idx = start + tl.arange(0, K_TILE_SIZE)
        s = tl.dot(q, tl.trans(k)) * scale
        if is_causal:
            s = s + tl.where(q_idx[:, None] >= k_idx[None, :], 0.0, -1.0e6)
        s = tl.where(k_idx[None, :] < N_KEYS, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        corr = tl.exp(m_i - m_new)
        l_i = corr * l_i + tl.sum(p, axis=1)
        acc = tl.dot(p.to(v.dtype), v, acc=acc * corr[:, None])
        m_i = m_new
        K_block_ptr = K_block_ptr.advance((K_TILE_SIZE, 0))
        V_block_ptr = V_block_ptr.advance((K_TILE_SIZE, 0))
    tl.store(O_block_ptr, (acc / l_i[:, None]).to(O_block_ptr.type.element_ty), boundary_check=(0, 1))
    tl.store(L_block_ptr, m_i + tl.log(l_i), boundary_check=(0,))


def _tile(n):
    return max(16, min(64, triton.next_power_of_2(n)))


class FlashAttentionTritonTiles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        batch, n_q, d = Q.shape
        n_k = K.shape[1]
        O = torch.empty_like(Q)
        L = torch.empty((batch, n_q), device=Q.device, dtype=torch.float32)
        bq, bk = _tile(n_q), _tile(n_k)
        fwd_kernel[(triton.cdiv(n_q, bq), batch)](
            Q, K, V, O, L,
            Q.stride(0), Q.stride(1), Q.stride(2), K.stride(0), K.stride(1), K.stride(2),
            V.stride(0), V.stride(1), V.stride(2), O.stride(0), O.stride(1), O.stride(2), L.stride(0), L.stride(1),
            n_q, n_k, 1.0 / math.sqrt(d), D=d, Q_TILE_SIZE=bq, K_TILE_SIZE=bk, is_causal=is_causal,
        )
        ctx.save_for_backward(L, Q, K, V, O)
        ctx.is_causal = is_causal
        return O

    @staticmethod
    def backward(ctx, dO):
        L, Q, K, V, O = ctx.saved_tensors
        q, k, v, o, do = (t.float() for t in (Q, K, V, O, dO))
        scale = 1.0 / math.sqrt(q.shape[-1])
        D = (o * do).sum(-1)
        S = torch.einsum("bqd,bkd->bqk", q, k) * scale
        if ctx.is_causal:
            keep = torch.arange(q.shape[1], device=q.device)[:, None] >= torch.arange(k.shape[1], device=q.device)
            S = S + torch.where(keep, 0.0, -1e6)
        P = torch.exp(S - L[:, :, None])
        dV = torch.einsum("bqk,bqd->bkd", P, do)
        dS = P * (torch.einsum("bqd,bkd->bqk", do, v) - D[:, :, None])
        dQ = torch.einsum("bqk,bkd->bqd", dS, k) * scale
        dK = torch.einsum("bqk,bqd->bkd", dS, q) * scale
        return dQ.to(Q.dtype), dK.to(K.dtype), dV.to(V.dtype), None
