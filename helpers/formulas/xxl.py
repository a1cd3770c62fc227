"""The 2025 handout's accounting (notebook 07): the XXL FFN-only model's memory per device and when FSDP × TP is
compute-bound on a TPU v5p-like mesh.

    xxl_memory(tokens, n_fsdp), xxl_min_fsdp(tokens), xxl_compute_bound()
"""

from __future__ import annotations

import math

# the 2025 "XXL" FFN-only model: fp32 master weights, gradients, AdamW moments (16 B/param), bf16 activations

XXL = dict(d_model=16_384, d_ff=53_248, n_blocks=126)
# the handout's TPU v5p figures (from the Scaling Book): bf16 FLOP/s, ICI bytes/s per link (2 · 9e10), HBM per device
TPU_V5P_LIKE = dict(C=4.6e14, W=1.8e11, hbm=95e9)
MESH_2025 = dict(X=16, Y=4, M_X=2, M_Y=1)  # communication_accounting(c): FSDP over X, TP over Y, M_X/M_Y links


def xxl_activation_bytes_per_token(d_model=XXL["d_model"], d_ff=XXL["d_ff"], n_blocks=XXL["n_blocks"]) -> int:
    """bf16 bytes saved for backward per token: each block's two matmul inputs, 2 (d + d_ff) bytes, over the blocks."""
    return n_blocks * 2 * (d_model + d_ff)


def xxl_memory(
    tokens: int, n_fsdp: int = 1, d_model=XXL["d_model"], d_ff=XXL["d_ff"], n_blocks=XXL["n_blocks"]
) -> dict[str, float]:
    """Bytes per device: 16 Ψ of fp32 states / N, and the bf16 activations saved for backward (each block's two
    matmul inputs, 2 (d + f) bytes per token) with half of them sharded: A (1 + 1/N) / 2."""
    psi = n_blocks * 2 * d_model * d_ff
    acts = tokens * xxl_activation_bytes_per_token(d_model, d_ff, n_blocks)
    out = {"params": psi, "states": 16 * psi / n_fsdp, "activations": acts * (0.5 + 0.5 / n_fsdp)}
    out["total"] = out["states"] + out["activations"]
    return out


def xxl_max_tokens(hbm: float = TPU_V5P_LIKE["hbm"], **model) -> float:
    """Tokens per device above which no N fits: as N grows M(N) falls to A/2, so tokens <= 2 hbm / (bytes per token)."""
    return 2 * hbm / xxl_activation_bytes_per_token(**model)


def xxl_min_fsdp(tokens: int, hbm: float = TPU_V5P_LIKE["hbm"], **model) -> int | None:
    """The smallest N with xxl_memory(...)['total'] <= hbm (None when half the activations alone exceed it)."""
    if xxl_memory(tokens, 10**12, **model)["total"] > hbm:
        return None
    n = 1
    while xxl_memory(tokens, n, **model)["total"] > hbm:
        n *= 2
    lo = n // 2 + 1
    while lo < n:  # bisect in (n/2, n]
        mid = (lo + n) // 2
        lo, n = (mid + 1, n) if xxl_memory(tokens, mid, **model)["total"] > hbm else (lo, mid)
    return n


def xxl_compute_bound(
    *,
    X: int = MESH_2025["X"],
    Y: int = MESH_2025["Y"],
    M_X: int = MESH_2025["M_X"],
    M_Y: int = MESH_2025["M_Y"],
    C: float = TPU_V5P_LIKE["C"],
    W: float = TPU_V5P_LIKE["W"],
    d_ff: int = XXL["d_ff"],
) -> dict[str, float]:
    """Forward, FSDP over X × TP over Y (the Scaling Book's mixed FSDP/TP): per layer T_math = 4BDF/(XYC), the FSDP
    all-gather 4DF/(Y·W·M_X), TP's activation collective 4BD/(X·W·M_Y). Compute-bound on the FSDP side once the
    tokens per FSDP shard B/X >= C/(W·M_X); per device that is B/(XY), overall B. The TP side holds whatever the
    batch when F >= Y·C/(W·M_Y). Those bounds let the two axes' collectives overlap each other; when they cannot (the
    time of both summed against T_math), the overall batch must reach "overall_summed" (inf when TP alone is
    communication-bound)."""
    shard = C / (W * M_X)
    margin = d_ff / (X * Y * C) - 1 / (X * W * M_Y)  # per token: compute left after TP's collective
    return {
        "per_fsdp_shard": shard,
        "per_device": shard / Y,
        "overall": shard * X,
        "overall_summed": (d_ff / (Y * W * M_X)) / margin if margin > 0 else math.inf,
        "tp_min_d_ff": Y * C / (W * M_Y),
        "tp_ok": d_ff >= Y * C / (W * M_Y),
    }


def xxl_compute_bound_tokens(
    n_tp: int, C: float = TPU_V5P_LIKE["C"], W: float = TPU_V5P_LIKE["W"], M_X: int = MESH_2025["M_X"]
) -> float:
    """Per-device tokens above which the FSDP × TP forward is compute-bound: C / (W · M_X · n_tp)
    (xxl_compute_bound)."""
    return xxl_compute_bound(Y=n_tp, C=C, W=W, M_X=M_X)["per_device"]
