"""Other students' styles: einops tiles of 16 for the PyTorch FlashAttention; RMSNorm with NVTX ranges behind a plain
class whose .apply is an autograd Function's (what the course's tests call)."""
from cs336_systems.flash.flash_einops import FlashAttentionEinops
from cs336_systems.norms.rmsnorm_nvtx import RMSNormFunction


def get_flashattention_autograd_function_pytorch() -> type:
    return FlashAttentionEinops


def get_rmsnorm_autograd_function_pytorch() -> type:
    return RMSNormFunction
