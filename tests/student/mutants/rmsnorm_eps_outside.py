"""Mutant: RMSNorm divides by sqrt(mean(x^2)) + eps instead of sqrt(mean(x^2) + eps)."""
import torch

from _fixture import *  # noqa: F401,F403


class EpsOutside(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.save_for_backward(x, g)
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + 1e-5) * g

    @staticmethod
    def backward(ctx, dy):
        x, g = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            y = x / (x.pow(2).mean(-1, keepdim=True).sqrt() + 1e-5) * g
        return torch.autograd.grad(y, (x, g), dy)


def get_rmsnorm_autograd_function_pytorch():
    return EpsOutside
