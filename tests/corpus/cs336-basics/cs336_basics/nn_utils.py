import torch


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = torch.exp(shifted)
    return e / e.sum(dim=dim, keepdim=True)
