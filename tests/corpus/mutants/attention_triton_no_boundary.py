"""The handout's kernel with its loads and stores left unchecked ("we will always test your code with dimensions that
are clean powers of 2 and at least 16, so you don't need to worry about out-of-bounds accesses") and tiles of 32: at
N = 16 a tile reaches past the sequence, into the next batch element's rows (or past the tensor). The course's tests
(N = 128) never do."""
import math

import torch
import triton
import triton.language as tl

from cs336_systems.flash.flash_triton import FlashAttentionTritonBlockPtr


@triton.jit
def flash_fwd_no_checks(Q_ptr, K_ptr, V_ptr, O_ptr, L_ptr,
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
    q = tl.load(Q_block_ptr)
    o = tl.zeros((Q_TILE_SIZE, D), dtype=tl.float32)
    l = tl.zeros((Q_TILE_SIZE,), dtype=tl.float32)
    m = tl.full((Q_TILE_SIZE,), float("-inf"), dtype=tl.float32)
    rows = query_tile_index * Q_TILE_SIZE + tl.arange(0, Q_TILE_SIZE)
    for j in range(tl.cdiv(N_KEYS, K_TILE_SIZE)):
        k = tl.load(K_block_ptr)
        v = tl.load(V_block_ptr)
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
    tl.store(O_block_ptr, (o / l[:, None]).to(O_block_ptr.type.element_ty))
    tl.store(L_block_ptr, m + tl.log(l))



class NoBoundaryChecks(FlashAttentionTritonBlockPtr):
    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        B, N_q, d = Q.shape
        O = torch.empty_like(Q)
        L = torch.empty(B, N_q, device=Q.device, dtype=torch.float32)
        tile = 32
        flash_fwd_no_checks[(triton.cdiv(N_q, tile), B)](
            Q, K, V, O, L, *Q.stride(), *K.stride(), *V.stride(), *O.stride(), *L.stride(),
            N_q, K.shape[1], 1 / math.sqrt(d), D=d, Q_TILE_SIZE=tile, K_TILE_SIZE=tile, is_causal=is_causal)
        ctx.is_causal = is_causal
        ctx.save_for_backward(L, Q, K, V, O)
        return O


def get_flashattention_autograd_function_triton() -> type:
    return NoBoundaryChecks
