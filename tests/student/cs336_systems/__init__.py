"""A stand-in for a student's `cs336_systems` package: the companion's own implementations under the course's names,
so `python -m helpers yours tests/student/tests/adapters.py` has something that passes every check."""
from helpers.attention import FlashAttentionPyTorch, FlashAttentionTriton
from helpers.ddp import DDPBucketed, DDPIndividualParameters
from helpers.fsdp import FSDP
from helpers.rmsnorm import RMSNormPyTorchFunction, RMSNormTritonFunction, rmsnorm_backward_g, rmsnorm_backward_x
from helpers.sharding import ShardedOptimizer

__all__ = ["DDPBucketed", "DDPIndividualParameters", "FSDP", "FlashAttentionPyTorch", "FlashAttentionTriton",
           "RMSNormPyTorchFunction", "RMSNormTritonFunction", "ShardedOptimizer", "rmsnorm_backward_g",
           "rmsnorm_backward_x"]
