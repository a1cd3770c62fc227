"""One helper picks the tiles and warps for both FlashAttention implementations (the PyTorch spec and the Triton
kernels), per head dim, dtype and device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LaunchConfig:
    """Tiles and warps for one (d, dtype, device). Forward: block_q query rows x block_k key rows. Backward: a
    program owns block_own rows (keys for dK/dV, queries for dQ) and loops over block_loop rows of the other side."""

    block_q: int
    block_k: int
    block_own: int
    block_loop: int
    num_warps: int
    num_stages: int
    dot_precision: str  # "ieee" for fp32: full fp32 dots (no tf32), so fp32 results match the spec to ~1e-6


def _launch_config(d: int, dtype: torch.dtype, device) -> LaunchConfig:
    """Tile sizes and warps for FlashAttentionPyTorch and FlashAttentionTriton (block_q % block_k == 0 and
    block_own % block_loop == 0, so causal loop bounds fall on tile borders)."""
    precision = "ieee" if dtype == torch.float32 else "tf32"  # "tf32" only matters for fp32 operands
    if torch.device(device).type != "cuda":
        # interpreter / CPU: small tiles, so small test shapes still cross many tile borders and ragged edges;
        # block_q = 2 * block_k gives two diagonal key tiles per query tile, as on the GPU
        return LaunchConfig(32, 16, 32, 16, 4, 1, precision)
    # Chosen by compiling for sm_80 and sm_90a (ptxas -v): no register spills on either (e.g. 4 warps spill there).
    # 16-bit: 128 query rows share each K/V tile load; d = 128 halves the key tile to keep S and O in registers.
    # Backward programs hold k, v, dk, dv (or q, dO, dq) for 64 rows and stream 32-row tiles of the other side.
    # fp32 ("ieee") dots run on FMA units, not tensor cores, and need far more registers: small tiles (fp32 on a
    # GPU is for checking; train in bf16).
    if dtype != torch.float32:  # (block_q, block_k, block_own, block_loop, num_warps, num_stages)
        choice = (128, 64, 64, 32, 8, 3) if d <= 64 else (128, 32, 64, 32, 8, 2)
    else:
        choice = (64, 32, 64, 16, 8, 2) if d <= 64 else (16, 16, 16, 16, 8, 3)  # d=128, 4 warps: triton 3.6 spills
    return LaunchConfig(*choice, dot_precision=precision)
