"""A third style: a torch.compile'd tile update in the PyTorch version."""
from cs336_systems.flash.flash_compiled import FlashAttentionCompiled


def get_flashattention_autograd_function_pytorch() -> type:
    return FlashAttentionCompiled
