"""FlashAttention-2 (notebook 06): naive attention, a tiled PyTorch spec, and Triton kernels, forward and backward.

    o = FlashAttentionTriton.apply(q, k, v, True)       # q (..., Tq, d), k and v (..., Tk, d); causal needs Tq == Tk
    o = FlashAttentionPyTorch.apply(q, k, v)            # the same tiles in PyTorch ops: the spec the kernels must match
    attention_flops(B * H, T, T, d, is_causal=True, backward=True); score_matrix_bytes(B * H, T, T, torch.bfloat16)

Both Functions save one tensor beside q, k, v, O: L = row-wise logsumexp of the scaled scores, (..., Tq) in fp32.
Backward recomputes P = exp(S - L) tile by tile, so no Tq x Tk matrix lives between forward and backward.
Without CUDA the kernels run in Triton's interpreter (`import helpers` sets TRITON_INTERPRET=1): correct, but slow.

The parts: .reference (naive attention, its costs, the input checks), .tiles (the launch configuration, from the
table in .tuned), .pytorch (the tiled spec and FlashAttentionPyTorch), .kernels (the Triton forward kernel and
FlashAttentionTriton), .kernels_backward (the backward's three kernels), .kernels_common (what they share); every
name is re-exported here.
"""

from helpers.attention.kernels import FlashAttentionTriton, _as_4d, flash_forward_triton
from helpers.attention.kernels_backward import DELTA_BLOCK, bwd_delta, bwd_kernel, flash_backward_triton
from helpers.attention.kernels_common import triton
from helpers.attention.pytorch import (
    TILE_OPS,
    FlashAttentionPyTorch,
    _above_diagonal,
    flash_backward_torch,
    flash_forward_torch,
    tiled_launches,
)
from helpers.attention.reference import (
    HEAD_DIMS,
    TORCH_DTYPES,
    TRITON_DTYPES,
    _check,
    _scores,
    attention_flops,
    attention_lse,
    attention_probs,
    naive_attention,
    score_matrix_bytes,
)
from helpers.attention.tiles import GRID, KERNELS, LaunchConfig, Tiles, _launch_config, tiles_for

if triton is not None:
    from helpers.attention.kernels import _fwd_tile, attn_fwd_kernel
    from helpers.attention.kernels_backward import (
        _dkdv_tile,
        _dq_tile,
        attn_bwd_delta_kernel,
        attn_bwd_dkdv_kernel,
        attn_bwd_dq_kernel,
    )
    from helpers.attention.kernels_common import _dot

__all__ = [
    "HEAD_DIMS",
    "TORCH_DTYPES",
    "TRITON_DTYPES",
    "attention_flops",
    "attention_lse",
    "attention_probs",
    "naive_attention",
    "score_matrix_bytes",
    "LaunchConfig",
    "Tiles",
    "tiles_for",
    "GRID",
    "KERNELS",
    "DELTA_BLOCK",
    "TILE_OPS",
    "FlashAttentionPyTorch",
    "flash_backward_torch",
    "flash_forward_torch",
    "tiled_launches",
    "FlashAttentionTriton",
    "flash_forward_triton",
    "flash_backward_triton",
    "bwd_delta",
    "bwd_kernel",
    "triton",
    "attn_fwd_kernel",
    "attn_bwd_delta_kernel",
    "attn_bwd_dkdv_kernel",
    "attn_bwd_dq_kernel",
]
# the parts notebook 06, kernel_check and the tests show or call directly
__all__ += [
    "_check",
    "_scores",
    "_launch_config",
    "_above_diagonal",
    "_as_4d",
    "_dot",
    "_fwd_tile",
    "_dkdv_tile",
    "_dq_tile",
]
