"""Mutant: the causal mask lets query i see key i+1 (tril(1) instead of tril())."""
import torch

from _fixture import *  # noqa: F401,F403


class Shifted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        if is_causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).tril(1).logical_not(), float("-inf"))
        lse = torch.logsumexp(s, -1)
        o = torch.exp(s - lse[..., None]) @ v
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        if ctx.is_causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).tril(1).logical_not(), float("-inf"))
        p = torch.exp(s - lse[..., None])
        ds = p * (do @ v.transpose(-2, -1) - (do * o).sum(-1, keepdim=True))
        c = q.shape[-1] ** -0.5
        return ds @ k * c, ds.transpose(-2, -1) @ q * c, p.transpose(-2, -1) @ do, None


def get_flashattention_autograd_function_pytorch():
    return Shifted
