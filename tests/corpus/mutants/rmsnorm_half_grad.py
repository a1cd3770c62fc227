"""The backward returns half of dL/dx (a 0.5 left from a derivation of x^2)."""
import torch

from cs336_systems.norms.rmsnorm import RMSNormAutograd, rmsnorm_grad_g, rmsnorm_grad_x


class HalfGrad(RMSNormAutograd):
    @staticmethod
    def backward(ctx, grad_out):
        x, g = ctx.saved_tensors
        return 0.5 * rmsnorm_grad_x(grad_out, x, g), rmsnorm_grad_g(grad_out, x, g)


def get_rmsnorm_autograd_function_pytorch() -> type:
    return HalfGrad


def rmsnorm_backward_x_pytorch(grad_output: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return 0.5 * rmsnorm_grad_x(grad_output, x, g)
