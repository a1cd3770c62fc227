"""Another student's style: einops tiles of 16 for the PyTorch version."""
from cs336_systems.flash.flash_einops import FlashAttentionEinops


def get_flashattention_autograd_function_pytorch() -> type:
    return FlashAttentionEinops
