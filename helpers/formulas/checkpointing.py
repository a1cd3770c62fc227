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


def halving_forwards(n_blocks: int) -> int:
    """Block forwards of one step under nested halving (each half of a stretch run under a non-reentrant
    torch.utils.checkpoint, recursively; the stretch itself not): one forward, then in backward each checkpointed
    stretch is recomputed only until its last saved tensor, which for a stretch of two halves is its second half's
    input (torch's early stop), so a recompute runs the first half alone; a single block runs whole."""

    def recompute(m):  # block forwards of re-running a checkpointed stretch of m blocks
        return 1 if m == 1 else m // 2

    def backward(m):  # block forwards during the backward of a stretch of m blocks run in halves
        if m == 1:
            return 0
        return sum(recompute(h) + backward(h) for h in (m // 2, m - m // 2))

    return n_blocks + backward(n_blocks)


def checkpoint_strategies(n_blocks: int, input_ratio: float = 1.0) -> dict[str, dict[str, float]]:
    """Peak activation memory in blocks (one block = A, the tensors one block saves for backward, its input among them;
    a kept input I = input_ratio · A, 1 counting it as a whole block) and forward passes for N identical blocks: none;
    one level of √N segments (checkpoint_memory); nested halving (⌈log2 N⌉ levels, one kept input per level: O(log N)
    memory, O(N log N) compute, halving_forwards); recursive prefix checkpointing, the least memory (keep only the
    input; before each block's backward re-run the prefix up to it: the input and one block alive, O(1), for N(N+1)/2
    block forwards, O(N²)). tests/test_answers_closed_forms.py measures the nested and prefix counts (A = 8 I)."""
    n, r, levels = n_blocks, input_ratio, max(1, math.ceil(math.log2(n_blocks)))
    s = max(1, round(math.sqrt(n)))
    return {
        "none": {"memory_blocks": n, "forward_passes": 1},
        "sqrt": {"memory_blocks": checkpoint_memory(n, s, r, 1), "forward_passes": 2, "segment": s},
        "nested": {"memory_blocks": levels * r + 1, "forward_passes": halving_forwards(n) / n},
        "prefix": {"memory_blocks": r + 1, "forward_passes": (n + 1) / 2},
    }
