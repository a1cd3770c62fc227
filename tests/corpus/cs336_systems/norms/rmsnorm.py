"""RMSNorm as the 2024 handout defines it: y = x / sqrt(mean(x^2) + eps) * g, with hand-derived gradients."""
import torch

EPS = 1e-5


def inv_rms(x: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    return torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def rmsnorm_grad_g(grad_out, x, g, eps=EPS):
    x_hat = x * inv_rms(x, eps)
    return (grad_out * x_hat).reshape(-1, x.shape[-1]).sum(dim=0)


def rmsnorm_grad_x(grad_out, x, g, eps=EPS):
    H = x.shape[-1]
    r = inv_rms(x, eps)
    gy = grad_out * g
    return r * gy - x * r.pow(3) * (gy * x).sum(dim=-1, keepdim=True) / H


class RMSNormAutograd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.save_for_backward(x, g)
        return x * inv_rms(x) * g

    @staticmethod
    def backward(ctx, grad_out):
        x, g = ctx.saved_tensors
        return rmsnorm_grad_x(grad_out, x, g), rmsnorm_grad_g(grad_out, x, g)
