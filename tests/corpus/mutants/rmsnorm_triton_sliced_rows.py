"""The Triton forward takes H as the row length of any input (no .contiguous(), x.reshape keeps a view): right for
the contiguous inputs of the course's tests, silently wrong on a view (a transposed one; a slice x[..., :H] of a wider
tensor, whose rows are further apart than H)."""
import torch

from cs336_systems.norms.rmsnorm_triton_fused import RMSNormTritonFused, rmsnorm_fwd


class SlicedRows(RMSNormTritonFused):
    @classmethod
    def forward(cls, ctx, x, g):
        H = x.shape[-1]
        x2 = x.reshape(-1, H)  # BUG: a view when it can be, with its own row stride, read as if it were H
        y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        rmsnorm_fwd[(x2.shape[0],)](x2, g, y, H, H, cls.eps, BLOCK_SIZE=cls.block_size(H))
        ctx.save_for_backward(x2.contiguous(), g)
        ctx.shape = x.shape
        return y.view(x.shape)


def get_rmsnorm_autograd_function_triton() -> type:
    return SlicedRows
