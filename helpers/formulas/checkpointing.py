"""Activation checkpointing: memory at the backward peak per segment size, the best segment, and strategies
(notebook 07).

    checkpoint_memory(L, k, input_bytes, block_bytes), best_segment(...), checkpoint_strategies(L)
"""

from __future__ import annotations

import math

# activation checkpointing: L blocks in segments of k; only segment inputs are kept, one segment is recomputed at a time


def checkpoint_memory(n_blocks: int, segment: int, input_bytes: float, block_bytes: float) -> float:
    """Activation bytes at the backward peak with one level of checkpointing: ceil(L/k) segment inputs + the k blocks
    of the segment being recomputed. segment 0: no checkpointing, L blocks' activations."""
    if segment <= 0:
        return n_blocks * block_bytes
    return math.ceil(n_blocks / segment) * input_bytes + segment * block_bytes


def best_segment(n_blocks: int, input_bytes: float, block_bytes: float) -> tuple[float, int]:
    """(continuous optimum sqrt(L I / A), the integer k in 1..L minimizing checkpoint_memory)."""
    best = min(range(1, n_blocks + 1), key=lambda k: (checkpoint_memory(n_blocks, k, input_bytes, block_bytes), k))
    return math.sqrt(n_blocks * input_bytes / block_bytes), best


def checkpoint_strategies(n_blocks: int) -> dict[str, dict[str, float]]:
    """Peak activation memory (in blocks' activations, kept inputs counted as one block each) and forward passes for N
    identical blocks: none; one level of √N segments; nested halving (log2 N levels, O(log N) memory, O(N log N)
    compute); recursive prefix checkpointing, the least memory (keep only the input; before each block's backward
    re-run the prefix up to it, holding one running tensor: O(1) memory for N(N+1)/2 block forwards, O(N²))."""
    n, levels = n_blocks, max(1, math.ceil(math.log2(n_blocks)))
    s = max(1, round(math.sqrt(n)))
    return {
        "none": {"memory_blocks": n, "forward_passes": 1},
        "sqrt": {"memory_blocks": math.ceil(n / s) + s, "forward_passes": 2},
        "nested": {"memory_blocks": 2 * levels, "forward_passes": 1 + levels},
        "prefix": {"memory_blocks": 2, "forward_passes": (n + n * (n - 1) / 2) / n},
    }
