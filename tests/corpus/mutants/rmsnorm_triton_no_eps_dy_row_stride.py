"""Two bugs at once, as go-akshit's 2024 repository has them: no eps, and a Triton backward that indexes the incoming
gradient with the input's row stride. The missing eps fails the rules above; the stride bug shows only on an
expanded gradient (y.sum().backward(): stride 0), where the backward reads rows of memory that are not dy's, and must
be found there although the contiguous twin fails too."""
import torch

from cs336_systems.norms.rmsnorm_triton_fused import RMSNormTritonFused, rmsnorm_bwd


class NoEpsDyRowStride(RMSNormTritonFused):
    eps = 0.0

    @classmethod
    def backward(cls, ctx, dy):
        x2, g = ctx.saved_tensors
        H = x2.shape[-1]
        dy2 = dy.reshape(-1, H)  # BUG: an expanded dy stays a stride-0 view; the kernel steps it by x's row stride
        dx, partial_dg = torch.empty_like(x2), torch.empty_like(x2)
        rmsnorm_bwd[(x2.shape[0],)](dy2, x2, g, dx, partial_dg, x2.stride(0), H, cls.eps, BLOCK_SIZE=cls.block_size(H))
        return dx.view(ctx.shape), partial_dg.sum(dim=0)


def get_rmsnorm_autograd_function_triton() -> type:
    return NoEpsDyRowStride
