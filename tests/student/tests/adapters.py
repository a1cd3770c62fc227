"""Every adapter of the course's 2024, 2025 and 2026 editions, wired as a student would (imports from the assignment
root's cs336_systems) to the companion's implementations. The mutants in tests/student/mutants/ each break one."""
from __future__ import annotations

import torch
from cs336_basics.model import Embedding, Linear

from cs336_systems import (DDPBucketed, DDPIndividualParameters, FSDP, FlashAttentionPyTorch, FlashAttentionTriton,
                           RMSNormPyTorchFunction, RMSNormTritonFunction, ShardedOptimizer, rmsnorm_backward_g,
                           rmsnorm_backward_x)


def get_rmsnorm_autograd_function_pytorch() -> type:
    return RMSNormPyTorchFunction


def get_rmsnorm_autograd_function_triton() -> type:
    return RMSNormTritonFunction


def rmsnorm_backward_g_pytorch(grad_output: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return rmsnorm_backward_g(grad_output, x, g)


def rmsnorm_backward_x_pytorch(grad_output: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return rmsnorm_backward_x(grad_output, x, g)


def get_flashattention_autograd_function_pytorch() -> type:
    return FlashAttentionPyTorch


def get_flashattention_autograd_function_triton() -> type:
    return FlashAttentionTriton


def get_ddp_individual_parameters(module: torch.nn.Module) -> torch.nn.Module:
    return DDPIndividualParameters(module)


def ddp_individual_parameters_on_after_backward(ddp_model, optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def get_ddp_bucketed(module: torch.nn.Module, bucket_size_mb: float) -> torch.nn.Module:
    return DDPBucketed(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model, optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model, optimizer) -> None:
    ddp_model.on_train_batch_start()


def get_ddp(module: torch.nn.Module) -> torch.nn.Module:
    return DDPIndividualParameters(module)


def ddp_on_after_backward(ddp_model, optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def get_sharded_optimizer(params, optimizer_cls, **kwargs) -> torch.optim.Optimizer:
    return ShardedOptimizer(params, optimizer_cls, **kwargs)


SHARD_TYPES = (torch.nn.Linear, torch.nn.Embedding, Linear, Embedding)  # torch's layers and cs336_basics'


def get_fsdp(module: torch.nn.Module, compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    return FSDP(module, compute_dtype=compute_dtype, shard_types=SHARD_TYPES)


def fsdp_on_after_backward(fsdp_model, optimizer) -> None:
    fsdp_model.finish_gradient_synchronization()


def fsdp_gather_full_params(fsdp_model) -> dict[str, torch.Tensor]:
    return fsdp_model.gather_full_params()
