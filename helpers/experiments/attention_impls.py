"""Notebook 06's attention implementations by name, on the same inputs: q, k, v and dO drawn once, f(q, k, v) for
naive | sdpa | compiled | flash_pytorch | flash_triton (or a student's), and the three timed passes of one.

    q, k, v, do = inputs((1, 2, 64, 16))
    steps = pass_steps(attention_fn("flash_pytorch", q, is_causal=True), q, k, v, do)   # {"fwd", "bwd", "fwd+bwd"}
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from helpers import attention as A

PASSES = ("fwd", "bwd", "fwd+bwd")


def inputs(shape, dtype=torch.float32, device="cpu", seed=0, requires_grad=True) -> tuple[Tensor, ...]:
    """q, k, v (B, H, T, d) and an upstream gradient dO, drawn in fp32 on the device and cast."""
    if len(shape) != 4 or min(shape) < 1:
        raise ValueError(f"shape must be (batch, heads, T, d) with every entry >= 1; got {shape}")
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (torch.randn(*shape, generator=gen, device=device).to(dtype) for _ in range(4))  # (B, H, T, d)
    return (*(t.requires_grad_(requires_grad) for t in (q, k, v)), do)


_COMPILED: dict = {}


def compiled_naive(key) -> callable:
    """torch.compile(naive_attention) for one (shape, dtype, causal) key, kept for reuse; dynamo is reset before
    its recompile limit (8 shapes of one function) is reached."""
    if key not in _COMPILED:
        if len(_COMPILED) >= 6:
            torch._dynamo.reset()
            _COMPILED.clear()
        _COMPILED[key] = torch.compile(A.naive_attention, dynamic=False)
    return _COMPILED[key]


def attention_fn(impl: str, q: Tensor, is_causal: bool, fns: dict | None = None):
    """f(q, k, v) for impl in naive | sdpa | compiled (torch.compile of naive) | flash_pytorch | flash_triton, or a
    name of `fns` ({label: apply(q, k, v, is_causal)}: another implementation, e.g. a student's)."""
    if fns and impl in fns:
        return lambda q, k, v, f=fns[impl]: f(q, k, v, is_causal)
    if impl == "naive":
        return lambda q, k, v: A.naive_attention(q, k, v, is_causal)
    if impl == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    if impl == "compiled":
        compiled = compiled_naive((tuple(q.shape), q.dtype, is_causal))
        return lambda q, k, v: compiled(q, k, v, is_causal)
    if impl in ("flash_pytorch", "flash_triton"):
        fn = A.FlashAttentionPyTorch if impl == "flash_pytorch" else A.FlashAttentionTriton
        return lambda q, k, v: fn.apply(q, k, v, is_causal)
    raise ValueError(f"unknown attention {impl!r}; known: naive, sdpa, compiled, flash_pytorch, flash_triton")


def pass_steps(fn, q, k, v, do) -> dict:
    """The three timed steps on one input: forward; backward alone (one graph kept, retain_graph); both."""
    o = fn(q, k, v)  # the graph the backward step reuses
    return {
        "fwd": lambda: fn(q, k, v),
        "bwd": lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True),
        "fwd+bwd": lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), do),
    }


def is_oom(err: Exception) -> bool:
    """True for the error a device raises when it runs out of memory (a row then records oom instead of a time)."""
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()
