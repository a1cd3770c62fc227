"""Other students' styles: einops tiles of 16 for the PyTorch FlashAttention, tiles as long as the sequence (up to
64) in Triton; RMSNorm with NVTX ranges behind a plain class whose .apply is an autograd Function's (what the course's
tests call), and the 2024 RMSNorm fused in Triton forward and backward (the weighted-sum example's layout)."""
from cs336_systems.flash.flash_einops import FlashAttentionEinops
from cs336_systems.flash.flash_triton_tiles import FlashAttentionTritonTiles
from cs336_systems.norms.rmsnorm_nvtx import RMSNormFunction
from cs336_systems.norms.rmsnorm_triton_fused import RMSNormTritonFused


def get_flashattention_autograd_function_pytorch() -> type:
    return FlashAttentionEinops


def get_rmsnorm_autograd_function_pytorch() -> type:
    return RMSNormFunction


def get_flashattention_autograd_function_triton() -> type:
    return FlashAttentionTritonTiles


def get_rmsnorm_autograd_function_triton() -> type:
    return RMSNormTritonFused
