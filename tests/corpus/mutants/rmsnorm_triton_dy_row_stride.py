"""The Triton backward indexes the incoming gradient with the input's row stride (dy viewed as rows without
.contiguous()): right for the dense gradients the course's tests pass, reads past dy's one row when autograd passes an
expanded one (y.sum().backward(): stride 0), giving NaN or garbage on a GPU."""
import torch

from cs336_systems.norms.rmsnorm_triton_fused import RMSNormTritonFused, rmsnorm_bwd


class DyRowStride(RMSNormTritonFused):
    @classmethod
    def backward(cls, ctx, dy):
        x2, g = ctx.saved_tensors
        H = x2.shape[-1]
        dy2 = dy.reshape(-1, H)  # BUG: an expanded dy stays a stride-0 view; the kernel steps it by x's row stride
        dx, partial_dg = torch.empty_like(x2), torch.empty_like(x2)
        rmsnorm_bwd[(x2.shape[0],)](dy2, x2, g, dx, partial_dg, x2.stride(0), H, cls.eps, BLOCK_SIZE=cls.block_size(H))
        return dx.view(ctx.shape), partial_dg.sum(dim=0)


def get_rmsnorm_autograd_function_triton() -> type:
    return DyRowStride
