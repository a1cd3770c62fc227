"""Parameters, FLOPs, peak FLOP/s and MFU (notebooks 00 and 01).

train_flops("small", 4, 128), shape_ratios("small/cpu", 32), mfu(flops, seconds, "NVIDIA H100 80GB HBM3", "bf16")
"""

from __future__ import annotations

from helpers.model import get_config, parameter_breakdown


def matmul_params(cfg) -> int:
    """Parameters that take part in a matmul: attention, feed-forward and the LM head (not embeddings, norms)."""
    parts = parameter_breakdown(cfg)
    return parts["attention"] + parts["feed_forward"] + parts["lm_head"]


def forward_flops(cfg, batch_size: int, context_length: int | None = None) -> dict[str, int]:
    """Forward matmul FLOPs: 2·N_matmul·B·T for weights, 2·2·B·T²·d per layer for QKᵀ and AV (full T², as computed)."""
    c = get_config(cfg)
    T = context_length or c.context_length
    return {
        "weights": 2 * matmul_params(c) * batch_size * T,
        "attention": c.n_layers * 2 * 2 * batch_size * T * T * c.d_model,
    }


def train_flops(cfg, batch_size: int, context_length: int | None = None) -> int:
    """FLOPs of forward + backward (backward = 2× forward): 6·N·B·T + 12·L·B·T²·d."""
    return 3 * sum(forward_flops(cfg, batch_size, context_length).values())


def shape_ratios(cfg, context_length: int | None = None) -> dict[str, float]:
    """The ratios the CPU presets keep (notebook 00): head_dim, d_ff/d_model, layers per 1,000 of width, and at
    `context_length` the LM head's and attention's (QKᵀ, AV) shares of the forward matmul FLOPs and the softmax
    elements per 1,000 of those FLOPs (L·h·T² per sequence)."""
    c = get_config(cfg)
    T = context_length or c.context_length
    f = forward_flops(c, 1, T)
    total = sum(f.values())
    return {
        "head_dim": c.head_dim,
        "d_ff / d_model": c.d_ff / c.d_model,
        "layers per 1000 of width": 1000 * c.n_layers / c.d_model,
        "LM head share of FLOPs": 2 * parameter_breakdown(c)["lm_head"] * T / total,
        "attention share of FLOPs": f["attention"] / total,
        "softmax elements per kFLOP": 1000 * c.n_layers * c.n_heads * T * T / total,
    }


# Dense peak FLOP/s (no sparsity) from NVIDIA's datasheets: H100 SXM5 / H200 (H100 and H200 datasheets,
# nvidia.com/en-us/data-center/h100 and /h200), H100 PCIe, A100 SXM (A100 datasheet, 2021).
# "fp32" is plain FP32 (PyTorch's default: no TF32 in matmuls); "tf32" when TF32 is allowed.
PEAK_FLOPS = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "H100 PCIe": {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
}


def peak_flops(device_name: str, precision: str = "fp32") -> float | None:
    """Dense peak FLOP/s of a known GPU at `precision` (bf16, fp16, tf32, fp32); None when unknown (e.g. CPUs)."""
    for key, peaks in PEAK_FLOPS.items():  # "H100 PCIe" is checked before "H100"
        if all(part.lower() in device_name.lower() for part in key.split()):
            return peaks.get(precision)
    return None


def mfu(flops: float, seconds: float, device_name: str, precision: str = "fp32") -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the device's peak; None where no peak is known."""
    peak = peak_flops(device_name, precision)
    return None if peak is None or seconds <= 0 else flops / seconds / peak
