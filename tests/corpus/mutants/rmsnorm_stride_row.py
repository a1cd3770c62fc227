"""The Triton wrapper takes x.stride(0) as the row length: right for 2-D inputs, wrong for (batch, seq, H)."""
import torch

from cs336_systems.norms.rmsnorm import RMSNormAutograd
from cs336_systems.norms.rmsnorm_triton import launch_forward


class StrideRow(RMSNormAutograd):
    @staticmethod
    def forward(ctx, x, g):
        ctx.save_for_backward(x, g)
        return launch_forward(x, g, row_len=x.stride(0))


def get_rmsnorm_autograd_function_triton() -> type:
    return StrideRow
