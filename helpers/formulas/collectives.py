"""Collectives: algbw, busbw and bytes on the wire (notebooks 03-05), and the DDP bucket-size α-β model (04).

busbw_factor("all_reduce", 8), wire_factor(...), bucket_overhead(n, S, T_b, alpha, beta)
"""

from __future__ import annotations

import math

import numpy as np

# ---- collectives (notebooks 03-05; nccl-tests, doc/PERFORMANCE.md) ----


def busbw_factor(op: str, world_size: int) -> float:
    """nccl-tests factor from algbw to busbw: all_reduce 2(n-1)/n, all_gather/reduce_scatter (n-1)/n, broadcast 1."""
    n = world_size
    factors = {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "broadcast": 1.0,
    }
    if op not in factors:
        raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(factors)}")
    return factors[op]


def algbw(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth, bytes/s: the message size over the time."""
    return size_bytes / seconds


def busbw(op: str, size_bytes: float, seconds: float, world_size: int) -> float:
    """Bus bandwidth, bytes/s: algbw scaled so it compares with the link's peak whatever the rank count."""
    return algbw(size_bytes, seconds) * busbw_factor(op, world_size)


def wire_factor(op: str, world_size: int) -> float:
    """Bytes each rank receives per byte passed (ring algorithms): all-reduce 2(N-1)/N, the others (N-1)/N."""
    return (2 if op == "all_reduce" else 1) * (world_size - 1) / world_size


# ---- the DDP bucket-size model (notebook 04 derives it) ----


def bucket_overhead(n_buckets, grad_bytes: float, backward_s: float, alpha_s: float, beta_Bps: float):
    """Modelled time from backward's end to the last all-reduce's end, with n equal buckets ready evenly in backward."""
    n = np.asarray(n_buckets, dtype=float)
    per_bucket = alpha_s + grad_bytes / (n * beta_Bps)  # one bucket's all-reduce
    return np.maximum(per_bucket, n * per_bucket - backward_s * (1 - 1 / n))


def optimal_buckets(grad_bytes: float, backward_s: float, alpha_s: float, beta_Bps: float) -> float:
    """The n minimizing bucket_overhead: max((T_b - S/beta)/alpha, sqrt(T_b/alpha)), at least 1."""
    return max(1.0, (backward_s - grad_bytes / beta_Bps) / alpha_s, math.sqrt(backward_s / alpha_s))


def handout_bucket_size(grad_bytes: float, alpha_s: float, beta_Bps: float) -> float:
    """The handout's optimum bucket size in bytes, b* = sqrt(s·w·o): its assumption (a bucket's gradients take as long
    to compute as to send, T_b = S/β) turns bucket_overhead into n·α + S/(n·β), least at n* = sqrt(S/(α·β))."""
    return math.sqrt(grad_bytes * beta_Bps * alpha_s)
