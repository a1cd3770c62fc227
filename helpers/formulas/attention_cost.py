"""What each FlashAttention-2 kernel costs (notebook 06, `python -m helpers tune attention`): matmul FLOPs and HBM
bytes per kernel at given tiles, and from a measured time its TFLOP/s and fraction of the device's peak.

    costs = kernel_costs(16, 16384, 16384, 64, is_causal=True, tiles={"fwd": (128, 64), "dkdv": (128, 32), ...})
    costs["dkdv"].flops, costs["dkdv"].bytes; achieved(costs["dkdv"], 1.9e-3, "NVIDIA H100 80GB HBM3")

FLOPs count 2 per multiply-add of the kernel's matmuls over the (query, key) pairs a mask keeps (the FA-2 paper's
accounting per matmul; softmax, exp and the mask not counted): forward S = QK^T and PV, 4 d per pair; the dK/dV
kernel S^T, dV = P^T dO, dP^T, dK = dS^T Q, 8 d; the dQ kernel S, dP, dQ = dS K, 6 d. The split backward is 14 d per
pair, 3.5x the forward, where FA-2's single pass is 10 d (helpers.attention.attention_flops' figure).
`flops_executed` counts the pairs the tiles compute (diagonal tiles whole, a ragged last program's padding too).
Bytes count every tile load and store as if none hit L2: each program reads its own rows once and the other side's
tiles once per program, an upper bound that L2 reuse lowers.
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.formulas.flops import peak_flops

MATMULS = {"fwd": 2, "delta": 0, "dkdv": 4, "dq": 3}  # matmuls per tile pair, 2 d FLOPs per (query, key) pair each


@dataclass(frozen=True)
class KernelCost:
    """One kernel's work: matmul FLOPs over kept pairs and over computed tiles; HBM bytes read and written."""

    kernel: str
    flops: int
    flops_executed: int
    bytes: int


def _streamed(own: int, T_own: int, T_other: int, is_causal: bool, owns_keys: bool) -> int:
    """Rows of the other side one kernel's programs stream in total: per program of `own` rows, all T_other, or
    causally only the visible ones (from the diagonal on for a key owner, up to it for a query owner)."""
    total = 0
    for start in range(0, T_own, own):
        if not is_causal:
            total += T_other
        elif owns_keys:
            total += T_other - start
        else:
            total += min(start + own, T_other)
    return total


def kernel_costs(
    batch_heads: int, Tq: int, Tk: int, d: int, is_causal: bool = True, tiles: dict | None = None, dtype_bytes: int = 2
) -> dict[str, KernelCost]:
    """KernelCost of fwd, delta, dkdv and dq at `tiles` (kernel -> (own, loop) rows; default 128 x 32 for all) for
    (batch_heads, Tq, Tk, d) inputs of dtype_bytes per element (L and D in fp32)."""
    if is_causal and Tq != Tk:
        raise ValueError(f"causal attention needs Tq == Tk; got Tq={Tq}, Tk={Tk}")
    tiles = {"fwd": (128, 32), "dkdv": (128, 32), "dq": (128, 32), **(tiles or {})}
    pairs = Tq * (Tq + 1) // 2 if is_causal else Tq * Tk
    row, n = d * dtype_bytes, batch_heads
    out = {}
    for kernel, (own, _loop) in tiles.items():
        owns_keys = kernel == "dkdv"
        T_own, T_other = (Tk, Tq) if owns_keys else (Tq, Tk)
        streamed = _streamed(own, T_own, T_other, is_causal, owns_keys)
        executed = streamed * own  # every streamed row against the program's `own` rows
        if kernel == "fwd":  # Q read, K and V streamed, O written; L written (fp32)
            nbytes = 2 * Tq * row + 2 * streamed * row + 4 * Tq
        elif kernel == "dkdv":  # K, V read, dK, dV written; Q, dO, L, D streamed
            nbytes = 4 * Tk * row + streamed * (2 * row + 8)
        else:  # Q, dO, L, D read, dQ written; K, V streamed
            nbytes = 3 * Tq * row + 8 * Tq + 2 * streamed * row
        f = 2 * d * MATMULS[kernel]
        out[kernel] = KernelCost(kernel, n * pairs * f, n * executed * f, n * nbytes)
    out["delta"] = KernelCost("delta", 2 * n * Tq * d, 2 * n * Tq * d, n * (2 * Tq * row + 4 * Tq))
    return out


@dataclass(frozen=True)
class Achieved:
    """A kernel's measured rate: TFLOP/s, the fraction of the device's dense peak at `precision`, and GB/s."""

    tflops: float
    fraction_of_peak: float | None
    GBps: float


def achieved(cost: KernelCost, seconds: float, device_name: str = "", precision: str = "bf16") -> Achieved:
    """TFLOP/s (kept pairs' FLOPs), the fraction of peak_flops(device_name, precision) (None for an unknown
    device) and GB/s of the byte model, for `cost` measured at `seconds`."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    peak = peak_flops(device_name, precision) if device_name else None
    rate = cost.flops / seconds
    return Achieved(rate / 1e12, rate / peak if peak else None, cost.bytes / seconds / 1e9)
