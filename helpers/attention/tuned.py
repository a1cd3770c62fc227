"""The FlashAttention kernels' tiles per (arch, dtype, d, kernel), read by helpers.attention.tiles.

Written by `python -m helpers tune attention` from its measurements (the rows it chose; every timed row is saved under
data/reference/<device>/attention_tune.jsonl). Until a device has run it, the seed: the 16-bit backward from
Triton's fused-attention tutorial (python/tutorials/06-fused-attention.py: the dK/dV program owns 128 keys and
streams 32 queries, 4 warps, 5 stages on Hopper; the dQ program the mirror), 8 warps where our kernels would spill
with 4 (dK/dV on both architectures, dQ on sm_80); the forward and fp32 rows as the H200 reference run measured
them. Rows a device has measured replace the seed's for that arch (SOURCE says which run). Every row compiles for
its architecture without spills (`python -m helpers kernels`).
"""

SOURCE = "tuned on NVIDIA H200 (2026-11-28, commit d9e013a)"

TILES = (
    # (arch, dtype, d, kernel, own, loop, num_warps, num_stages)
    ("sm_80", "bfloat16", 64, "dkdv", 128, 32, 8, 3),
    ("sm_80", "bfloat16", 64, "dq", 128, 32, 8, 3),
    ("sm_80", "bfloat16", 64, "fwd", 128, 64, 8, 3),
    ("sm_80", "bfloat16", 128, "dkdv", 64, 32, 8, 2),
    ("sm_80", "bfloat16", 128, "dq", 64, 32, 8, 2),
    ("sm_80", "bfloat16", 128, "fwd", 128, 32, 8, 2),
    ("sm_80", "float32", 64, "dkdv", 64, 16, 8, 2),
    ("sm_80", "float32", 64, "dq", 64, 16, 8, 2),
    ("sm_80", "float32", 64, "fwd", 64, 32, 8, 2),
    ("sm_80", "float32", 128, "dkdv", 16, 16, 8, 3),
    ("sm_80", "float32", 128, "dq", 16, 16, 8, 3),
    ("sm_80", "float32", 128, "fwd", 16, 16, 8, 3),
    ("sm_90a", "bfloat16", 64, "dkdv", 64, 32, 4, 4),
    ("sm_90a", "bfloat16", 64, "dq", 64, 32, 4, 4),
    ("sm_90a", "bfloat16", 64, "fwd", 64, 64, 4, 3),
    ("sm_90a", "bfloat16", 128, "dkdv", 64, 32, 4, 3),
    ("sm_90a", "bfloat16", 128, "dq", 64, 32, 4, 3),
    ("sm_90a", "bfloat16", 128, "fwd", 64, 64, 4, 3),
    ("sm_90a", "float32", 64, "dkdv", 64, 16, 8, 2),
    ("sm_90a", "float32", 64, "dq", 64, 16, 8, 2),
    ("sm_90a", "float32", 64, "fwd", 64, 32, 8, 2),
    ("sm_90a", "float32", 128, "dkdv", 16, 16, 8, 3),
    ("sm_90a", "float32", 128, "dq", 16, 16, 8, 3),
    ("sm_90a", "float32", 128, "fwd", 16, 16, 8, 3),
)
