"""Not one mistake but bad input of every kind, for the driver: RMSNorm (PyTorch) returns NaN, its Triton adapter
returns an instance instead of the class, FlashAttention's PyTorch adapter kills its process, its Triton one is not
implemented. The other topics (the fixture's) must still run."""
import os
import signal

import torch

from _fixture import *  # noqa: F401,F403
from _fixture import RMSNormPyTorchFunction


class NaNNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        return torch.full_like(x, float("nan"))

    @staticmethod
    def backward(ctx, dy):
        return torch.full_like(dy, float("nan")), None


class Crash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        os.kill(os.getpid(), signal.SIGSEGV)


def get_rmsnorm_autograd_function_pytorch():
    return NaNNorm


def get_rmsnorm_autograd_function_triton():
    return RMSNormPyTorchFunction()


def get_flashattention_autograd_function_pytorch():
    return Crash


def get_flashattention_autograd_function_triton():
    raise NotImplementedError
