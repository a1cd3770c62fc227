"""The memory calculator with presets, recomputation, micro-batches and pipeline stages (notebook 07 §7).

memory_calculator("xl", dp=8, pp=1, micro_batch=4, n_micro=1, recompute="selective")
"""

from __future__ import annotations

import math

from helpers.formulas.plans import LEADERBOARD_MODEL
from helpers.model import get_config

# Activations per layer per micro-batch of b sequences of s tokens, hidden h, a heads, 16-bit, GPT-style block
# (Korthikanti et al., 2022, "Reducing Activation Recomputation in Large Transformer Models"): none s·b·h·(34 + 5as/h),
# selective (attention's softmax recomputed) 34·s·b·h, full (only each layer's input kept) 2·s·b·h bytes.

CALCULATOR_PRESETS = {  # d_model, d_ff, n_layers, n_heads, vocab_size, context_length; ffn matrices (2 GELU, 3 SwiGLU)
    **{
        name: dict(
            d_model=c.d_model,
            d_ff=c.d_ff,
            n_layers=c.n_layers,
            n_heads=c.n_heads,
            vocab_size=c.vocab_size,
            context_length=c.context_length,
            ffn_matrices=2,
        )
        for name, c in ((n, get_config(n)) for n in ("small", "xl", "2.7B"))
    },
    # full multi-head attention: 8.8 B parameters; Llama 3's grouped-query attention has 8.0 B
    "Llama-3-8B-like (MHA)": dict(
        d_model=4096, d_ff=14_336, n_layers=32, n_heads=32, vocab_size=128_256, context_length=8192, ffn_matrices=3
    ),
    "2026 leaderboard": dict(
        **{k: LEADERBOARD_MODEL[k] for k in ("d_model", "d_ff", "n_layers", "n_heads", "vocab_size", "context_length")},
        ffn_matrices=3,
    ),
}
RECOMPUTATION = ("none", "selective", "full")


def preset_params(preset: str) -> int:
    """Parameters of a calculator preset: blocks (4d² attention + ffn_matrices·d·d_ff), untied embedding and head."""
    p = CALCULATOR_PRESETS[preset]
    return (
        p["n_layers"] * (4 * p["d_model"] ** 2 + p["ffn_matrices"] * p["d_model"] * p["d_ff"])
        + 2 * p["vocab_size"] * p["d_model"]
    )


def layer_activation_bytes(preset: str, micro_batch: int, recompute: str) -> float:
    """Bytes one layer keeps for backward per micro-batch (Korthikanti et al., 2022), by recomputation."""
    p = CALCULATOR_PRESETS[preset]
    s, h, a = p["context_length"], p["d_model"], p["n_heads"]
    per = {"none": 34 + 5 * a * s / h, "selective": 34, "full": 2}
    if recompute not in per:
        raise ValueError(f"recompute must be one of {RECOMPUTATION}, got {recompute!r}")
    return s * micro_batch * h * per[recompute]


def memory_calculator(
    preset: str, dp: int, pp: int, micro_batch: int, n_micro: int, recompute: str
) -> dict[str, dict[str, float]]:
    """Per ZeRO stage, GB (1e9 bytes) per GPU with mixed precision and Adam (2 + 2 + 12 bytes per parameter, sharded
    over the dp replicas by stage; layers split over pp stages) and the activations of the first pipeline stage, which
    keeps min(pp, n_micro) micro-batches in flight (1F1B); with the pipeline's bubble fraction (pp−1)/(n_micro+pp−1)
    and the global batch, dp · micro_batch · n_micro sequences."""
    if preset not in CALCULATOR_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {list(CALCULATOR_PRESETS)}")
    if min(dp, pp, micro_batch, n_micro) < 1:
        raise ValueError("dp, pp, micro_batch and n_micro must be at least 1")
    psi = preset_params(preset) / pp
    layers = math.ceil(CALCULATOR_PRESETS[preset]["n_layers"] / pp)
    acts = layers * min(pp, n_micro) * layer_activation_bytes(preset, micro_batch, recompute)
    bubble = (pp - 1) / (n_micro + pp - 1)
    out = {}
    for stage in range(4):
        states = psi * (2 / (dp if stage >= 3 else 1) + 2 / (dp if stage >= 2 else 1) + 12 / (dp if stage >= 1 else 1))
        out[f"ZeRO-{stage}" if stage else "DDP (ZeRO-0)"] = {
            "parameters per GPU (B)": psi / dp ** (stage >= 3) / 1e9,
            "model states (GB)": states / 1e9,
            "activations (GB)": acts / 1e9,
            "total (GB)": (states + acts) / 1e9,
            "pipeline bubble": bubble,
            "global batch (sequences)": dp * micro_batch * n_micro,
        }
    return out
