"""The launch grid is (batch, T_q) while the kernel reads program_id(0) as the query tile and program_id(1) as the
batch element: right whenever T_q equals the batch (the course's tests: 4 x 128 with tiles of 32), wrong otherwise
(and past the tensors' ends when T_q is the larger)."""
import math

import torch
import triton

from cs336_systems.flash.flash_triton import FlashAttentionTritonBlockPtr
from cs336_systems.flash.flash_triton_tiles import fwd_kernel


class GridSwapped(FlashAttentionTritonBlockPtr):
    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        B, N_q, d = Q.shape
        O = torch.empty_like(Q)
        L = torch.empty(B, N_q, device=Q.device, dtype=torch.float32)
        tile = 32
        fwd_kernel[(B, triton.cdiv(N_q, tile))](
            Q, K, V, O, L, *Q.stride(), *K.stride(), *V.stride(), *O.stride(), *L.stride(),
            N_q, K.shape[1], 1 / math.sqrt(d), D=d, Q_TILE_SIZE=tile, K_TILE_SIZE=tile, is_causal=is_causal)
        ctx.is_causal = is_causal
        ctx.save_for_backward(L, Q, K, V, O)
        return O


def get_flashattention_autograd_function_triton() -> type:
    return GridSwapped
