"""RMSNorm's backward layout per (arch, dtype, width), read by helpers.rmsnorm.backward_config.

Written by `python -m helpers tune rmsnorm` from its measurements (every timed row is saved under
data/reference/<device>/rmsnorm_tune.jsonl). Until a device has run it, a seed: one block per row up to 4096
columns (no second pass for the row's dot product; 8192 in one block spills 264-360 B at 16 warps, so it loops over
two blocks of 4096), 16 fp32 elements of each row tile per thread, narrow rows taken several at a time so each
program keeps more bytes in flight; 4 programs (dg partial rows) per SM. A row's block count follows from H. Rows a
device has measured replace the seed's for that arch (SOURCE says which run).
"""

SOURCE = "tuned on NVIDIA H200 (2026-11-28, commit d9e013a)"

BACKWARD = (
    # (arch, dtype, H, block_h, num_warps, rows, programs_per_sm)
    ("sm_80", "bfloat16", 1024, 1024, 4, 2, 4),
    ("sm_80", "bfloat16", 2048, 2048, 8, 2, 4),
    ("sm_80", "bfloat16", 4096, 4096, 8, 1, 4),
    ("sm_80", "bfloat16", 8192, 4096, 8, 1, 4),
    ("sm_80", "float32", 1024, 1024, 4, 2, 4),
    ("sm_80", "float32", 2048, 2048, 8, 2, 4),
    ("sm_80", "float32", 4096, 4096, 8, 1, 4),
    ("sm_80", "float32", 8192, 4096, 8, 1, 4),
    ("sm_90a", "bfloat16", 1024, 1024, 4, 2, 4),
    ("sm_90a", "bfloat16", 2048, 2048, 4, 1, 4),
    ("sm_90a", "bfloat16", 4096, 4096, 16, 1, 4),
    ("sm_90a", "bfloat16", 8192, 4096, 8, 1, 4),
    ("sm_90a", "float32", 1024, 1024, 8, 4, 4),
    ("sm_90a", "float32", 2048, 2048, 8, 2, 4),
    ("sm_90a", "float32", 4096, 4096, 16, 1, 4),
    ("sm_90a", "float32", 8192, 4096, 8, 1, 4),
)
