from __future__ import annotations

import sys

import torch

sys.path.append("cs336_systems/flash")  # relative to the repository root, where pytest runs

import cs336_basics  # noqa: E402,F401  (the template imports the first assignment's package)
import cs336_systems  # noqa: E402,F401
from flash_einsum import FlashAttentionEinsum  # noqa: E402
from flash_triton import FlashAttentionTritonBlockPtr  # noqa: E402

from cs336_systems.norms.rmsnorm import RMSNormAutograd, rmsnorm_grad_g, rmsnorm_grad_x  # noqa: E402
from cs336_systems.norms.rmsnorm_triton import RMSNormTriton  # noqa: E402


def get_rmsnorm_autograd_function_pytorch() -> type:
    return RMSNormAutograd


def get_rmsnorm_autograd_function_triton() -> type:
    return RMSNormTriton


def rmsnorm_backward_g_pytorch(grad_output: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return rmsnorm_grad_g(grad_output, x, g)


def rmsnorm_backward_x_pytorch(grad_output: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return rmsnorm_grad_x(grad_output, x, g)


def get_flashattention_autograd_function_pytorch() -> type:
    return FlashAttentionEinsum


def get_flashattention_autograd_function_triton() -> type:
    return FlashAttentionTritonBlockPtr


def get_ddp(module: torch.nn.Module) -> torch.nn.Module:
    raise NotImplementedError


def ddp_on_after_backward(ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    raise NotImplementedError


def get_sharded_optimizer(params, optimizer_cls: type[torch.optim.Optimizer], **kwargs) -> torch.optim.Optimizer:
    raise NotImplementedError
