"""Closed forms, in one place: parameters, FLOPs, peaks and MFU, bytes of every kind, ZeRO 0-3, collective bytes.

    param_bytes("small"), train_flops("small", 4, 128), shape_ratios("small/cpu", 32), mfu(flops, seconds, "NVIDIA H100 80GB HBM3", "bf16")
    step_breakdown("xl/cpu", 8, 128), peak_breakdown(...)       # bytes of a training step, per part (notebook 01)
    busbw_factor("all_reduce", 8), wire_factor(...)           # collectives (notebooks 03-05)
    bucket_overhead(n, S, T_b, alpha, beta)                  # the DDP bucket-size model (notebook 04)
    zero_memory("xl", 8, stage=1), live_bytes(...)           # ZeRO 0-3 and our sharded runs (notebook 05)
    tp_calc("forward", **CALC_EXAMPLE).inequality            # the 2026 calculators in the handout's variables (07)
    xxl_compute_bound(), leaderboard_plan(), fastest_plan(plan, "B200 ~180 GB")   # 2025 accounting, 2026 plan (07)

Every function here is checked against a measurement (a test or a notebook assert), or, for the handouts' closed
forms, against figures derived by hand (tests/test_calculator.py). Counts come from the model's
own parameter table (`helpers.model.parameter_shapes`) and, for sharding, from the optimizers' own partition plan.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from helpers.model import ModelConfig, get_config, parameter_breakdown, parameter_shapes
from helpers.sharding import partition_by_bytes

KiB, MiB, GiB = 2**10, 2**20, 2**30  # binary units: torch's bucket_cap_mb, nccl-tests' sizes, memory tables


def dtype_bytes(dtype: torch.dtype) -> int:
    """Bytes per element of `dtype`."""
    return torch.empty((), dtype=dtype).element_size()


# ---- parameters and FLOPs (notebook 01) ----


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


# ---- bytes of a training step (notebook 01) ----


def param_bytes(cfg: ModelConfig | str, dtype=torch.float32) -> int:
    """Bytes of the parameters (also of their gradients, which have the parameters' dtype)."""
    return sum(parameter_breakdown(cfg).values()) * dtype_bytes(dtype)


def param_tensor_count(cfg: ModelConfig | str) -> int:
    """Number of parameter tensors, from the model's own parameter table."""
    return len(parameter_shapes(cfg))


def adamw_state_bytes(cfg: ModelConfig | str, dtype=torch.float32) -> int:
    """AdamW state: exp_avg and exp_avg_sq like each parameter, plus a 4-byte fp32 `step` per parameter tensor."""
    return 2 * param_bytes(cfg, dtype) + 4 * param_tensor_count(cfg)


def residual_stream_bytes(batch_size: int, context_length: int, d_model: int, dtype=torch.float32) -> int:
    """One residual-stream activation (B, T, d_model): B·T·d·bytes."""
    return batch_size * context_length * d_model * dtype_bytes(dtype)


def buffer_bytes(cfg: ModelConfig | str) -> int:
    """The causal-mask buffers: one (context, context) bool matrix per block."""
    c = get_config(cfg)
    return c.n_layers * c.context_length**2


def activation_bytes(
    cfg: ModelConfig | str, batch_size: int, context_length: int | None = None, dtype=torch.float32
) -> dict[str, int]:
    """Bytes autograd saves for backward in one forward pass of TransformerLM (fp32), per part.

    Per block, with R = B·T·d: the block input, norm1's y and output, q, k and v made contiguous
    for the matmuls (3R), the re-assembled heads, the mid-block residual, norm2's y and output
    (10 R in all), two rsqrt columns (2 B·T), the attention probabilities (B·H·T²), the negated
    causal mask (T² bool), and the FFN's d_ff-wide w1 output and GELU output. After the blocks:
    the last residual, the final norm's y, output and rsqrt, the log-softmax output (B·T·V) and
    the loss with its total weight (2 scalars). The position ids (int64 T) for the embedding backward.
    """
    c = get_config(cfg)
    B, T = batch_size, context_length or c.context_length
    e = dtype_bytes(dtype)
    R = B * T * c.d_model
    per_block = (10 * R + 2 * B * T + 2 * B * T * c.d_ff + B * c.n_heads * T * T) * e + T * T
    return {
        "blocks": c.n_layers * per_block,
        "final norm + head + loss": (3 * R + B * T + B * T * c.vocab_size + 2) * e,
        "position ids": T * 8,
    }


def block_saved_parts(
    cfg: ModelConfig | str, batch_size: int, context_length: int | None = None, dtype=torch.float32
) -> dict[str, int]:
    """The bytes one block saves for backward, per op that produced them (activation_bytes' "blocks" / L, itemised),
    largest first."""
    c = get_config(cfg)
    B, T = batch_size, context_length or c.context_length
    e = dtype_bytes(dtype)
    R = B * T * c.d_model * e
    parts = {
        "softmax output (attention probabilities, B·H·T²)": B * c.n_heads * T * T * e,
        "ffn w1 output (B·T·d_ff)": B * T * c.d_ff * e,
        "GELU output (B·T·d_ff)": B * T * c.d_ff * e,
        "q, k, v made contiguous for the matmuls (3 B·T·d)": 3 * R,
        "norm1: normalised x and output (2 B·T·d)": 2 * R,
        "norm2: normalised x and output (2 B·T·d)": 2 * R,
        "block input (B·T·d)": R,
        "heads re-assembled for the output projection (B·T·d)": R,
        "mid-block residual (B·T·d)": R,
        "norms' rsqrt columns (2 B·T)": 2 * B * T * e,
        "causal mask, negated (T², bool)": T * T,
    }
    return dict(sorted(parts.items(), key=lambda kv: -kv[1]))


def token_bytes(batch_size: int, context_length: int) -> int:
    """Inputs and targets, (B, T) int64 each."""
    return 2 * batch_size * context_length * 8


def step_breakdown(
    cfg: ModelConfig | str, batch_size: int, context_length: int | None = None, dtype=torch.float32
) -> dict[str, int]:
    """Analytic bytes of one training step's state: parameters, gradients, AdamW state, saved activations."""
    return {
        "parameters": param_bytes(cfg, dtype),
        "buffers": buffer_bytes(cfg),
        "gradients": param_bytes(cfg, dtype),
        "optimizer state": adamw_state_bytes(cfg, dtype),
        "activations": sum(activation_bytes(cfg, batch_size, context_length, dtype).values()),
        "token ids": token_bytes(batch_size, context_length or get_config(cfg).context_length),
    }


def loss_grad_bytes(
    cfg: ModelConfig | str, batch_size: int, context_length: int | None = None, dtype=torch.float32
) -> int:
    """The two (B, T, V) buffers live as backward starts: d loss/d log-probs and d loss/d logits."""
    c = get_config(cfg)
    return 2 * batch_size * (context_length or c.context_length) * c.vocab_size * dtype_bytes(dtype)


def peak_breakdown(
    cfg: ModelConfig | str, batch_size: int, context_length: int | None = None, dtype=torch.float32
) -> dict[str, int]:
    """What is live as backward starts in a steady-state step (AdamW state exists, grads were set to None).

    That moment holds every saved activation plus the two (B, T, V) loss-gradient buffers and is
    the step's peak when activations outweigh the gradients (as at the reference sizes); otherwise
    the peak falls later in backward, as gradients pile up, and this sum is a lower bound.
    """
    full = step_breakdown(cfg, batch_size, context_length, dtype)
    return {
        "parameters": full["parameters"],
        "buffers": full["buffers"],
        "optimizer state": full["optimizer state"],
        "gradients": 0,
        "activations": full["activations"],
        "loss gradients (B·T·V ×2)": loss_grad_bytes(cfg, batch_size, context_length, dtype),
        "token ids": full["token ids"],
    }


# ---- an RMSNorm's minimum traffic (notebook 02) ----


def norm_bytes(n_rows: int, H: int, dtype: torch.dtype, backward: bool) -> int:
    """Bytes a norm must move at least: fwd reads x, g, writes y; bwd also reads x, dy, g and writes dx, dg."""
    s = dtype_bytes(dtype)
    fwd = (2 * n_rows * H + H) * s
    return fwd + ((3 * n_rows * H + 2 * H) * s if backward else 0)


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


# ---- optimizer-state sharding and ZeRO (notebook 05; ZeRO paper, section 5: (2 + 2 + K)Ψ) ----

SHARDED_KINDS = ("unsharded", "sharded", "naive_sharded", "zero1")
PRECISIONS = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}  # bytes per parameter: weights, gradients, Adam state (K)


def expected_collectives(kind: str, grad_bytes: int, world_size: int) -> dict[str, int]:
    """Analytic bytes passed to each collective per step (Ψ = grad_bytes; zero1: Ψ padded to a multiple of N).
    sharded and naive_sharded broadcast the same bytes (one buffer per owner, or one call per tensor)."""
    padded = -(-grad_bytes // (4 * world_size)) * 4 * world_size  # fp32 elements, padded to N equal slices
    table = {
        "unsharded": {"all_reduce": grad_bytes},
        "sharded": {"all_reduce": grad_bytes, "broadcast": grad_bytes},
        "naive_sharded": {"all_reduce": grad_bytes, "broadcast": grad_bytes},
        "zero1": {"reduce_scatter": padded, "all_gather": padded},
    }
    if kind not in table:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(table)}")
    return table[kind]


def meta_sizes(model) -> tuple[int, ...]:
    """numel of each parameter of a model name / ModelConfig, in registration order (from the model's own table)."""
    return _meta_sizes(get_config(model))


@functools.lru_cache(maxsize=64)
def _meta_sizes(cfg: ModelConfig) -> tuple[int, ...]:
    return tuple(math.prod(shape) for shape in parameter_shapes(cfg).values())


def meta_numel(model) -> int:
    """Parameters of a model name / ModelConfig, or of an nn.Module."""
    if isinstance(model, torch.nn.Module):
        return sum(p.numel() for p in model.parameters())
    return sum(meta_sizes(model))


def zero_memory(model, world_size: int, stage: int, precision: str = "mixed") -> dict[str, float]:
    """Per-rank bytes of model states under ZeRO stage 0-3 with Adam: stage 1 shards the optimizer state,
    2 also the gradients, 3 also the weights. Communication: per-rank bytes received per step (2Ψ_g, stage 3 3Ψ_g)."""
    psi, N = meta_numel(model), world_size
    w, g, k = PRECISIONS[precision]
    out = {
        "parameters": w * psi / (N if stage >= 3 else 1),
        "gradients": g * psi / (N if stage >= 2 else 1),
        "optimizer state": k * psi / (N if stage >= 1 else 1),
    }
    out["total"] = sum(out.values())
    out["communication"] = (3 if stage == 3 else 2) * g * psi * (N - 1) / N
    return out


def state_bytes(kind: str, model_name, world_size: int, rank: int) -> int:
    """AdamW state this rank holds: exp_avg and exp_avg_sq (fp32) per owned element + a 4-byte step per owned tensor.
    Which tensors a rank owns comes from ShardedOptimizer's own plan (helpers.sharding.partition_by_bytes)."""
    sizes = list(meta_sizes(model_name))
    if kind == "unsharded":
        owned = sizes
    elif kind in ("sharded", "naive_sharded"):
        owned = [s for s, r in zip(sizes, partition_by_bytes([4 * s for s in sizes], world_size)) if r == rank]
    elif kind == "zero1":
        owned = [-(-sum(sizes) // world_size)]
    else:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(SHARDED_KINDS)}")
    return sum(8 * s + 4 for s in owned)


def live_bytes(
    kind: str,
    model_name,
    world_size: int,
    rank: int,
    batch_per_rank: int,
    context_length: int,
    point: str,
    step: int = 1,
) -> dict[str, int]:
    """What is live at 'after init' / 'before step' / 'after step' of step `step`: parameters and buffers,
    gradients (DDP buckets or Zero1's flat buffer, allocated when wrapping), optimizer state, token ids."""
    has_state = point == "after step" or step > 1
    psi = 4 * meta_numel(model_name)
    if kind == "zero1":
        psi = 4 * -(-meta_numel(model_name) // world_size) * world_size  # padded flat buffer
    return {
        "parameters": psi + buffer_bytes(model_name),
        "gradients": psi,
        "optimizer state": state_bytes(kind, model_name, world_size, rank) if has_state else 0,
        "other": 0 if point == "after init" else token_bytes(batch_per_rank, context_length),
    }


# ---- FSDP, tensor parallelism, activation checkpointing and the 2025/2026 calculators (notebook 07) ----
# Ring bytes and times live beside their code (helpers.fsdp.fsdp_bytes_per_step / ddp_bytes_per_step,
# helpers.ring.ring_time / alternate_ring_time); these are the closed forms notebook 07 adds.


def fsdp_shard_elements(model, world_size: int) -> dict[str, int]:
    """Elements one rank holds under helpers.fsdp.FSDP: each Linear/Embedding weight padded to a multiple of N and
    split N ways ("sharded"), the norm gains whole ("replicated"), and how many tensors of each."""
    shapes = parameter_shapes(model)
    sizes = {n: math.prod(s) for n, s in shapes.items()}
    shard = {n: -(-k // world_size) for n, k in sizes.items() if "norm" not in n}  # padded/N
    rep = {n: k for n, k in sizes.items() if "norm" in n}
    return {
        "sharded": sum(shard.values()),
        "replicated": sum(rep.values()),
        "sharded_tensors": len(shard),
        "replicated_tensors": len(rep),
        "psi_sharded": sum(sizes[n] for n in shard),
    }


def fsdp_live_bytes(
    model, world_size: int, batch_per_rank: int, context_length: int, point: str, step: int = 1
) -> dict[str, int]:
    """What FSDP (fp32, AdamW) keeps live per rank at 'after init' / 'before step' / 'after step': fp32 shards +
    replicated gains + mask buffers; their gradients once a backward ran; AdamW's two moments + a 4-byte step per
    tensor after the first step; the token ids. ZeRO-3 with whole gains and padding."""
    e = fsdp_shard_elements(model, world_size)
    own = e["sharded"] + e["replicated"]
    has_state = point == "after step" or step > 1
    return {
        "parameters": 4 * own + buffer_bytes(model),
        "gradients": 0 if point == "after init" else 4 * own,
        "optimizer state": (8 * own + 4 * (e["sharded_tensors"] + e["replicated_tensors"])) if has_state else 0,
        "other": 0 if point == "after init" else token_bytes(batch_per_rank, context_length),
    }


def fsdp_gathered_peak_bytes(model, world_size: int, bytes_per_element: int = 4, modules: int = 2) -> int:
    """Gathered weights alive at once: the `modules` largest sharded modules' padded weights (2: one computing, one
    prefetched, the bound; 1: the LM head alone, as backward starts)."""
    c = get_config(model)
    d, f, V, T = c.d_model, c.d_ff, c.vocab_size, c.context_length
    pad = lambda k: -(-k // world_size) * world_size  # noqa: E731
    sizes = sorted([pad(V * d), pad(T * d), pad(V * d), pad(3 * d * d), pad(d * d), pad(d * f), pad(f * d)])
    return sum(sizes[-modules:]) * bytes_per_element


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


# the 2026 gated FFN (x W1, x W2, f(x1) * x2, z W3; d -> f -> d), 16-bit weights and activations, b tokens per
# data-parallel replica, N devices; C FLOP/s per device, W bytes/s of egress per device


def gated_ffn(
    strategy: str, *, tokens: int, d: int, f: int, n: int, C: float, W: float, n_tp: int = 1, bytes_per_element: int = 2
) -> dict[str, float]:
    """Per device: backward FLOPs and seconds, backward bytes sent and seconds, and whether it is communication-bound.
    dp: all-reduce 3df grads; fsdp: all-gather 3df weights + reduce-scatter 3df grads; tp (n-way): all-reduce of dx
    (b x d); fsdp_tp: n = n_fsdp x n_tp, both of these on 1/n_tp of the weights."""
    e, params = bytes_per_element, 3 * d * f
    ring = lambda k: (k - 1) / k  # noqa: E731
    if strategy in ("dp", "fsdp"):
        flops, sent = 12 * tokens * d * f, 2 * ring(n) * params * e  # all-reduce == all-gather + reduce-scatter
    elif strategy == "tp":
        flops, sent = 12 * tokens * d * f / n, 2 * ring(n) * tokens * d * e
    elif strategy == "fsdp_tp":
        n_f = n // n_tp
        flops = 12 * tokens * d * f / n_tp
        sent = 2 * ring(n_f) * params * e / n_tp + 2 * ring(n_tp) * tokens * d * e
    else:
        raise ValueError(f"unknown strategy {strategy!r}; expected dp, fsdp, tp or fsdp_tp")
    out = {"backward_flops": flops, "compute_s": flops / C, "bytes_sent": sent, "comm_s": sent / W}
    out["comm_bound"] = out["comm_s"] > out["compute_s"]
    return out


def gated_ffn_thresholds(*, d: int, f: int, n: int, C: float, W: float) -> dict[str, float]:
    """Where each strategy turns communication-bound: dp/fsdp below tokens (N-1)/N C/W per device; tp above
    N = 1 + 3 f W / C devices (any batch)."""
    return {
        "dp_min_tokens": (n - 1) / n * C / W,
        "fsdp_min_tokens": (n - 1) / n * C / W,
        "tp_max_devices": 1 + 3 * f * W / C,
    }


# The 2026 calculators in the handout's variables: B tokens in the global batch, D, D_FF, N devices (N_DP, N_FSDP,
# N_TP), C FLOP/s and W bytes/s of egress per device, 16-bit weights and activations. Each part returns its
# expression and its compute-bound inequality (LaTeX for notebooks, plain text for the answers page) and a worked
# example. Ring collectives: an all-reduce sends 2(N-1)/N of the buffer, an all-gather or reduce-scatter (N-1)/N.

CALC_EXAMPLE = dict(B=32_768, D=4096, D_FF=16_384, N=8, C=989e12, W=450e9)  # H100-like: bf16 dense, NVLink one way


@dataclass(frozen=True)
class CalcPart:
    """One part of a 2026 calculator: what it computes, as expressions and an inequality, and one worked example."""

    problem: str  # "tp_calcs"
    part: str  # "forward", "backward", "(a)" ...
    expressions: tuple[
        tuple[str, str], ...
    ]  # (quantity, plain-text expression), e.g. ("FLOPs per device", "6·B·D·D_FF/N")
    inequality: str  # plain text: when it stays compute-bound
    latex: tuple[str, ...]  # the same, as LaTeX for a notebook
    example: dict  # inputs and the values they give

    def _repr_markdown_(self) -> str:
        """In a notebook: the part's expressions, its inequality, the same as math, and the example's bound."""
        lines = [f"**{self.problem} · {self.part}**"] + [f"- {q}: `{e}`" for q, e in self.expressions]
        if self.inequality != "—":
            bound = self.example.get("max_devices")
            lines.append(
                f"- compute-bound while: `{self.inequality}`"
                + (f" (worked example: N ≤ {bound:.1f})" if bound not in (None, math.inf) else "")
            )
        return "\n".join(lines + [f"$${t}$$" for t in self.latex])


def _ring(n: float, collective: str) -> float:
    return (2 if collective == "all_reduce" else 1) * (n - 1) / n


def dp_calc(pass_: str, *, B: int, D: int, D_FF: int, N: int, C: float, W: float) -> CalcPart:
    """data_parallel_calcs: each of N_DP devices runs B/N_DP tokens through the whole FFN (3 D×D_FF matrices);
    forward has no communication, backward all-reduces the 3·D·D_FF 16-bit gradients."""
    k = 6 if pass_ == "forward" else 12
    flops = k * B * D * D_FF / N
    sent = 0.0 if pass_ == "forward" else _ring(N, "all_reduce") * 3 * D * D_FF * 2
    exprs = (
        ("FLOPs per device", f"{k}·B·D·D_FF/N_DP"),
        (
            "bytes sent per device",
            "0 (no communication in forward)"
            if pass_ == "forward"
            else "2·(N_DP−1)/N_DP · 3·D·D_FF · 2 = 12·D·D_FF·(N_DP−1)/N_DP",
        ),
        ("time", f"max({k}·B·D·D_FF/(N_DP·C), comm/W)" if pass_ == "backward" else f"{k}·B·D·D_FF/(N_DP·C)"),
    )
    ineq = (
        "always compute-bound"
        if pass_ == "forward"
        else "12·B·D·D_FF/(N_DP·C) ≥ 12·D·D_FF·(N_DP−1)/(N_DP·W)  ⇔  N_DP ≤ 1 + B·W/C"
    )
    latex = (
        (r"\frac{6BDD_{FF}}{N_{DP}}", r"\text{no communication}")
        if pass_ == "forward"
        else (r"\frac{12BDD_{FF}}{N_{DP}}", r"\frac{12DD_{FF}(N_{DP}-1)}{N_{DP}}", r"N_{DP} \le 1 + \frac{BW}{C}")
    )
    bound = math.inf if pass_ == "forward" else 1 + B * W / C
    return CalcPart(
        "data_parallel_calcs",
        pass_,
        exprs,
        ineq,
        latex,
        dict(
            B=B,
            D=D,
            D_FF=D_FF,
            N_DP=N,
            C=C,
            W=W,
            flops=flops,
            bytes_sent=sent,
            compute_s=flops / C,
            comm_s=sent / W,
            max_devices=bound,
            comm_bound=sent / W > flops / C,
        ),
    )


def fsdp_calc(pass_: str, *, B: int, D: int, D_FF: int, N: int, C: float, W: float) -> CalcPart:
    """fsdp_calcs: B/N tokens per device; forward all-gathers the 3·D·D_FF 16-bit weights, backward gathers them again
    and reduce-scatters the gradients (an all-reduce's bytes)."""
    k, gathers = (6, 1) if pass_ == "forward" else (12, 2)
    flops = k * B * D * D_FF / N
    sent = gathers * _ring(N, "all_gather") * 3 * D * D_FF * 2
    what = "all-gather of the weights" if pass_ == "forward" else "all-gather + reduce-scatter"
    exprs = (
        ("FLOPs per device", f"{k}·B·D·D_FF/N_FSDP"),
        ("bytes sent per device", f"{what}: {k}·D·D_FF·(N_FSDP−1)/N_FSDP"),
    )
    ineq = (
        f"{k}·B·D·D_FF/(N_FSDP·C) ≥ {k}·D·D_FF·(N_FSDP−1)/(N_FSDP·W)  ⇔  N_FSDP ≤ 1 + B·W/C"
        "  (per device: B/N_FSDP ≥ (N_FSDP−1)/N_FSDP · C/W)"
    )
    latex = (
        rf"\frac{{{k}BDD_{{FF}}}}{{N_{{FSDP}}}}",
        rf"\frac{{{k}DD_{{FF}}(N_{{FSDP}}-1)}}{{N_{{FSDP}}}}",
        r"N_{FSDP} \le 1 + \frac{BW}{C}",
    )
    return CalcPart(
        "fsdp_calcs",
        pass_,
        exprs,
        ineq,
        latex,
        dict(
            B=B,
            D=D,
            D_FF=D_FF,
            N_FSDP=N,
            C=C,
            W=W,
            flops=flops,
            bytes_sent=sent,
            compute_s=flops / C,
            comm_s=sent / W,
            max_devices=1 + B * W / C,
            comm_bound=sent / W > flops / C,
        ),
    )


TP_BACKWARD_EQUATIONS = (  # device i holds W1, W2 by columns (D × D_FF/N), W3 by rows (D_FF/N × D); x, dy replicated
    "forward: x1ᵢ = x·W1ᵢ, x2ᵢ = x·W2ᵢ, zᵢ = f(x1ᵢ) ∗ x2ᵢ, y = Σᵢ zᵢ·W3ᵢ (all-reduce)",
    "dW3ᵢ = zᵢᵀ·dy;  dzᵢ = dy·W3ᵢᵀ",
    "dx2ᵢ = dzᵢ ∗ f(x1ᵢ);  dx1ᵢ = dzᵢ ∗ x2ᵢ ∗ f′(x1ᵢ)",
    "dW1ᵢ = xᵀ·dx1ᵢ;  dW2ᵢ = xᵀ·dx2ᵢ",
    "dx = Σᵢ (dx1ᵢ·W1ᵢᵀ + dx2ᵢ·W2ᵢᵀ)  (all-reduce of B × D)",
)


def tp_calc(pass_: str, *, B: int, D: int, D_FF: int, N: int, C: float, W: float) -> CalcPart:
    """tp_calcs: every device sees all B tokens and 1/N_TP of each matrix; forward all-reduces y, backward dx (B × D,
    16-bit) once each."""
    k, ratio = (6, "1.5") if pass_ == "forward" else (12, "3")
    flops = k * B * D * D_FF / N
    sent = _ring(N, "all_reduce") * B * D * 2
    exprs = (
        ("FLOPs per device", f"{k}·B·D·D_FF/N_TP"),
        ("bytes sent per device", f"all-reduce of {'y' if pass_ == 'forward' else 'dx'}: 4·B·D·(N_TP−1)/N_TP"),
    )
    ineq = f"{k}·B·D·D_FF/(N_TP·C) ≥ 4·B·D·(N_TP−1)/(N_TP·W)  ⇔  N_TP ≤ 1 + {ratio}·D_FF·W/C (any batch)"
    latex = (
        rf"\frac{{{k}BDD_{{FF}}}}{{N_{{TP}}}}",
        r"\frac{4BD(N_{TP}-1)}{N_{TP}}",
        rf"N_{{TP}} \le 1 + {ratio}\,\frac{{D_{{FF}}W}}{{C}}",
    )
    bound = 1 + float(ratio) * D_FF * W / C
    return CalcPart(
        "tp_calcs",
        pass_,
        exprs,
        ineq,
        latex,
        dict(
            B=B,
            D=D,
            D_FF=D_FF,
            N_TP=N,
            C=C,
            W=W,
            flops=flops,
            bytes_sent=sent,
            compute_s=flops / C,
            comm_s=sent / W,
            max_devices=bound,
            comm_bound=sent / W > flops / C,
        ),
    )


def fsdp_tp_calc(part: str, *, B: int, D: int, D_FF: int, N_FSDP: int, N_TP: int, C: float, W: float) -> CalcPart:
    """fsdp_tp_calcs, forward pass, N = N_FSDP·N_TP: (a) FLOPs 6BD·D_FF/N; (b) communication: the FSDP all-gather of
    the device's 1/N_TP of the weights and TP's all-reduce of its B/N_FSDP tokens' output run on different axes, so
    the time is the larger; (c) with overlap, compute-bound while compute exceeds each, N ≤ 1.5·B·D_FF·W²/C² at
    N_FSDP = BW/C, N_TP = 1.5·D_FF·W/C; (d) without overlap, compute ≥ their sum, N ≤ 3·B·D_FF·W²/(8C²) at half of
    each (N_FSDP = BW/(2C), N_TP = 3·D_FF·W/(4C)). (c) and (d) take the rings' (N−1)/N as 1, as the Scaling Book does."""
    N = N_FSDP * N_TP
    flops = 6 * B * D * D_FF / N
    t_fsdp = _ring(N_FSDP, "all_gather") * 6 * D * D_FF / N_TP / W
    t_tp = _ring(N_TP, "all_reduce") * 2 * B / N_FSDP * D / W
    ex = dict(
        B=B,
        D=D,
        D_FF=D_FF,
        N_FSDP=N_FSDP,
        N_TP=N_TP,
        C=C,
        W=W,
        flops=flops,
        compute_s=flops / C,
        fsdp_comm_s=t_fsdp,
        tp_comm_s=t_tp,
    )
    if part == "(a)":
        return CalcPart(
            "fsdp_tp_calcs",
            part,
            (("forward FLOPs per device", "6·B·D·D_FF/(N_FSDP·N_TP)"),),
            "—",
            (r"\frac{6BDD_{FF}}{N_{FSDP}N_{TP}}",),
            ex,
        )
    if part == "(b)":
        return CalcPart(
            "fsdp_tp_calcs",
            part,
            (
                ("FSDP all-gather time", "6·D·D_FF·(N_FSDP−1)/(N_FSDP·N_TP·W)"),
                ("TP all-reduce time", "4·B·D·(N_TP−1)/(N_FSDP·N_TP·W)"),
                ("communication time", "max(FSDP term, TP term)"),
            ),
            "—",
            (r"\max\left(\frac{6DD_{FF}(N_{FSDP}-1)}{N_{FSDP}N_{TP}W}, \frac{4BD(N_{TP}-1)}{N_{FSDP}N_{TP}W}\right)",),
            {**ex, "comm_s": max(t_fsdp, t_tp)},
        )
    if part == "(c)":
        n_f, n_t = B * W / C, 1.5 * D_FF * W / C
        return CalcPart(
            "fsdp_tp_calcs",
            part,
            (
                ("FSDP side", "6·B·D·D_FF/(N·C) ≥ 6·D·D_FF/(N_TP·W) ⇔ N_FSDP ≤ B·W/C"),
                ("TP side", "6·B·D·D_FF/(N·C) ≥ 4·B·D/(N_FSDP·W) ⇔ N_TP ≤ 1.5·D_FF·W/C"),
            ),
            "N = N_FSDP·N_TP ≤ 1.5·B·D_FF·W²/C²",
            (r"N \le \frac{1.5\,B D_{FF} W^2}{C^2}",),
            {**ex, "N_FSDP_max": n_f, "N_TP_max": n_t, "max_devices": 1.5 * B * D_FF * W**2 / C**2},
        )
    if part == "(d)":
        n_f, n_t = B * W / (2 * C), 3 * D_FF * W / (4 * C)
        return CalcPart(
            "fsdp_tp_calcs",
            part,
            (
                (
                    "no overlap",
                    "6·B·D·D_FF/(N·C) ≥ 6·D·D_FF/(N_TP·W) + 4·B·D/(N_FSDP·W) ⇔ 6·D_FF·N_FSDP + 4·B·N_TP ≤ 6·B·D_FF·W/C",
                ),
                (
                    "largest N",
                    "the product is largest with each term half the budget: N_FSDP = B·W/(2C), N_TP = 3·D_FF·W/(4C)",
                ),
            ),
            "N = N_FSDP·N_TP ≤ 3·B·D_FF·W²/(8·C²)",
            (r"N \le \frac{3\,B D_{FF} W^2}{8\,C^2}",),
            {**ex, "N_FSDP_max": n_f, "N_TP_max": n_t, "max_devices": 3 * B * D_FF * W**2 / (8 * C**2)},
        )
    raise ValueError(f"fsdp_tp_calcs has parts (a) to (d); got {part!r}")


def calc_parts(*, B: int, D: int, D_FF: int, N: int, C: float, W: float, N_TP: int = 4) -> list[CalcPart]:
    """Every part of the four 2026 calculators at one example: DP, FSDP and TP forward and backward, FSDP × TP (a)-(d)
    forward with N_FSDP = N / N_TP."""
    ex = dict(B=B, D=D, D_FF=D_FF, N=N, C=C, W=W)
    return [fn(p, **ex) for fn in (dp_calc, fsdp_calc, tp_calc) for p in ("forward", "backward")] + [
        fsdp_tp_calc(part, B=B, D=D, D_FF=D_FF, N_FSDP=N // N_TP, N_TP=N_TP, C=C, W=W)
        for part in ("(a)", "(b)", "(c)", "(d)")
    ]


def basics_params(cfg) -> int:
    """Parameters of the handout's cs336_basics model at a size: per block 4d² attention, SwiGLU's 3·d·d_ff and two
    RMSNorm gains; RoPE (no position table); untied embedding and LM head; a final gain."""
    c = get_config(cfg)
    d = c.d_model
    return c.n_layers * (4 * d * d + 3 * d * c.d_ff + 2 * d) + 2 * c.vocab_size * d + d


def sharded_state_bytes(psi: int, world_size: int) -> dict[str, float]:
    """fp32 AdamW model states per rank (4 + 4 + 8 bytes per parameter): DDP 16Ψ, ZeRO-1 8Ψ + 8Ψ/N, FSDP 16Ψ/N."""
    return {"DDP": 16 * psi, "ZeRO-1": 8 * psi + 8 * psi / world_size, "FSDP": 16 * psi / world_size}


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
    batch when F >= Y·C/(W·M_Y)."""
    shard = C / (W * M_X)
    return {
        "per_fsdp_shard": shard,
        "per_device": shard / Y,
        "overall": shard * X,
        "tp_min_d_ff": Y * C / (W * M_Y),
        "tp_ok": d_ff >= Y * C / (W * M_Y),
    }


def xxl_compute_bound_tokens(
    n_tp: int, C: float = TPU_V5P_LIKE["C"], W: float = TPU_V5P_LIKE["W"], M_X: int = MESH_2025["M_X"]
) -> float:
    """Per-device tokens above which the FSDP × TP forward is compute-bound: C / (W · M_X · n_tp) (xxl_compute_bound)."""
    return xxl_compute_bound(Y=n_tp, C=C, W=W, M_X=M_X)["per_device"]


# ---- the 2026 leaderboard as a plan (notebook 07 §8) ----
# A Llama-like model: per block RMSNorm, q/k/v/o projections (4d²), causal FlashAttention (saves O and one fp32
# logsumexp per row and head, never the T × T scores), RMSNorm, SwiGLU (3·d·d_ff); untied embedding and LM head.
# bf16 compute (weights, activations and gradients in bf16) with fp32 master weights and AdamW moments (12 B/param).

LEADERBOARD_MODEL = dict(
    d_model=4096,
    d_ff=11_008,
    n_layers=34,
    n_heads=32,
    vocab_size=151_936,
    context_length=32_768,
    batch_size=2,
    world_size=2,
)
LEADERBOARD_GPUS = {  # usable memory (bytes), dense bf16 FLOP/s, GPU-to-GPU link bytes/s each way (NVIDIA datasheets)
    "H100 80 GB": dict(memory=80e9, flops=989e12, link=450e9),  # NVLink 4: 900 GB/s both ways
    "H200 141 GB": dict(memory=141e9, flops=989e12, link=450e9),
    "B200 ~180 GB": dict(memory=180e9, flops=2.25e15, link=900e9),  # NVLink 5: 1.8 TB/s both ways
}
LEADERBOARD_MFU = 0.40  # the stated utilisation of the matmuls (an assumption, not a measurement)
PLAN_MFUS = (0.25, 0.35, 0.40, 0.50)  # the band the predicted time is shown over
PLAN_MARGIN = 0.10  # a plan fits only with this share of the card left free (fragmentation, NCCL buffers, workspace)
PLAN_TIE = 0.01  # predicted times within 1% are a tie, broken by memory (the plan with more headroom wins)
PLAN_STRATEGIES = {"DDP": 0, "ZeRO-1": 1, "ZeRO-2": 2, "FSDP": 3}  # strategy -> ZeRO stage
PLAN_CHECKPOINTING = ("none", "every block", "sqrt(L) segments")
PLAN_HEADS = ("plain", "chunked")  # LM head + cross-entropy: full (tokens, V) logits, or fused and chunked
PLAN_PRECISIONS = {"fp32 master": 12, "bf16 weights": 8}  # optimizer bytes per parameter beside bf16 weights + grads:
# fp32 master copy + two fp32 AdamW moments, or no master (the bf16 weights are updated in place; updates below bf16's
# resolution are lost unless rounded stochastically or compensated, a numerics risk a plan must state)
HEAD_CHUNK_TOKENS = 1024  # tokens per chunk of the fused head: its fp32 logits and their gradient are live at once


def llama_params(*, d_model: int, d_ff: int, n_layers: int, vocab_size: int, **_) -> dict[str, int]:
    """Parameters of the Llama-like model per part: blocks (4d² + 3·d·d_ff + 2d each), embedding, head, final norm."""
    return {
        "blocks": n_layers * (4 * d_model**2 + 3 * d_model * d_ff + 2 * d_model),
        "embedding": vocab_size * d_model,
        "lm_head": vocab_size * d_model,
        "final norm": d_model,
    }


def llama_block_saved_bytes(*, d_model: int, d_ff: int, n_heads: int, tokens: int, bytes_per_element: int = 2) -> int:
    """Bytes one block saves for backward: per token 10 d + 4 d_ff elements + two norm rsqrt values, and one fp32
    logsumexp per head. The 10 d: each norm's input, normalised x and gained output (6 d); q, k, v and O (4 d; the
    attention output is laid out (B, T, H, d_head), so the output projection reads it without a copy). The 4 d_ff:
    x W1, x W3, silu(x W1) and their product."""
    return tokens * ((10 * d_model + 4 * d_ff + 2) * bytes_per_element + 4 * n_heads)


def llama_head_bytes(*, d_model: int, vocab_size: int, tokens: int, bytes_per_element: int = 2) -> dict[str, int]:
    """The head's saved tensors (final norm: input, normalised x, output, rsqrt; the log-probabilities) and the two
    (tokens, V) gradient buffers live as backward starts."""
    e = bytes_per_element
    return {"saved": tokens * ((3 * d_model + 1 + vocab_size) * e), "loss gradients": 2 * tokens * vocab_size * e}


def chunked_head_bytes(
    *, d_model: int, vocab_size: int, tokens: int, bytes_per_element: int = 2, chunk_tokens: int = HEAD_CHUNK_TOKENS
) -> dict[str, int]:
    """A fused, chunked LM head + cross-entropy (as Liger's fused linear cross-entropy): the final norm's saved tensors,
    the input gradient it computes during forward (tokens × d), and one chunk's fp32 logits and their gradient; the
    (tokens, V) log-probabilities and loss gradients are never all live."""
    e = bytes_per_element
    return {
        "saved": tokens * ((3 * d_model + 1) * e + d_model * e),
        "loss gradients": 2 * min(chunk_tokens, tokens) * vocab_size * 4,
    }


def implied_mfu(step_s: float, flops: float, *, peak_flops: float, world_size: int) -> float:
    """The MFU a measured step implies: flops / (world_size · peak · step)."""
    return flops / (world_size * peak_flops * step_s)


def llama_train_flops(
    *,
    d_model: int,
    d_ff: int,
    n_layers: int,
    vocab_size: int,
    context_length: int,
    batch_size: int,
    segments: int = 0,
    causal_fraction: float = 0.5,
    **_,
) -> int:
    """Matmul FLOPs of one forward + backward (backward = 2x forward) and, with the blocks checkpointed in `segments`
    segments, their forward once more, less each segment's last down-projection (torch's non-reentrant checkpoint stops
    once the last saved tensor is rebuilt). Attention: 2·2·B·T²·d per layer, times causal_fraction (0.5: a causal
    kernel skips the masked half; 1.0: the full square, as computed by plain matmuls)."""
    tokens = batch_size * context_length
    blocks = n_layers * (
        2 * tokens * (4 * d_model**2 + 3 * d_model * d_ff)
        + causal_fraction * 4 * batch_size * context_length**2 * d_model
    )
    head = 2 * tokens * vocab_size * d_model
    recompute = blocks - segments * 2 * tokens * d_model * d_ff if segments else 0
    return int(3 * (blocks + head) + recompute)


def leaderboard_plan(
    model: dict | None = None,
    gpus: dict | None = None,
    mfu: float = LEADERBOARD_MFU,
    bytes_per_element: int = 2,
    margin: float = PLAN_MARGIN,
    mfus=PLAN_MFUS,
) -> list[dict]:
    """Every strategy (DDP, ZeRO-1, ZeRO-2, FSDP) × activation checkpointing (none, every block, √L segments) × LM head
    (plain, fused and chunked) × optimizer precision (fp32 master weights, or bf16 weights without a master): memory
    per GPU (GB = 1e9 bytes), whether it fits each GPU with `margin` of the card left free, FLOPs per step, and the
    predicted step time per GPU kind: compute at `mfu` plus the communication that cannot overlap (and at every MFU of
    `mfus`: "step_band_s"). Not overlappable: the collective on the last gradients backward makes (the embedding's),
    ZeRO-1/2's parameter all-gather after the step, FSDP's first gather; and whatever of the total communication
    outlasts the compute. bf16 compute (bytes_per_element: the activations' dtype; 4 for an fp32 run, whose 4 + 4 + 8
    bytes of state per parameter equal mixed precision's 2 + 2 + 12)."""
    m = {**LEADERBOARD_MODEL, **(model or {})}
    gpus = gpus or LEADERBOARD_GPUS
    N, L, d = m["world_size"], m["n_layers"], m["d_model"]
    if m["batch_size"] % N:
        raise ValueError(f"batch_size {m['batch_size']} must be a multiple of world_size {N} (one share per GPU)")
    if not 0 <= margin < 1:
        raise ValueError(f"margin is the share of the card kept free, in [0, 1); got {margin}")
    parts = llama_params(**m)
    psi, block_psi = sum(parts.values()), parts["blocks"] // L
    tokens = m["batch_size"] // N * m["context_length"]  # per GPU
    e = bytes_per_element
    A = llama_block_saved_bytes(d_model=d, d_ff=m["d_ff"], n_heads=m["n_heads"], tokens=tokens, bytes_per_element=e)
    I = tokens * d * e  # a block's input
    heads = {
        "plain": llama_head_bytes(d_model=d, vocab_size=m["vocab_size"], tokens=tokens, bytes_per_element=e),
        "chunked": chunked_head_bytes(d_model=d, vocab_size=m["vocab_size"], tokens=tokens, bytes_per_element=e),
    }
    ring = (N - 1) / N
    rows = []
    for strategy, stage in PLAN_STRATEGIES.items():
        gathered = 2 * 2 * max(block_psi, parts["lm_head"]) if stage == 3 else 0  # two units in flight, bf16
        sent = (3 if stage == 3 else 2) * ring * 2 * psi  # bytes each GPU sends per step
        tail = ring * 2 * parts["embedding"] * (2 if stage == 0 else 1)  # the embedding's all-reduce / reduce-scatter
        exposed = (
            tail + (ring * 2 * psi if stage in (1, 2) else 0) + (ring * 2 * parts["embedding"] if stage == 3 else 0)
        )
        for precision, opt_bytes in PLAN_PRECISIONS.items():
            states = {
                "bf16 weights": 2 * psi / (N if stage >= 3 else 1),
                "bf16 gradients": 2 * psi / (N if stage >= 2 else 1),
                ("fp32 master + AdamW" if precision == "fp32 master" else "AdamW (fp32 moments)"): opt_bytes
                * psi
                / (N if stage >= 1 else 1),
            }
            for ckpt in PLAN_CHECKPOINTING:
                segment = {"none": 0, "every block": 1, "sqrt(L) segments": max(1, round(math.sqrt(L)))}[ckpt]
                acts = checkpoint_memory(L, segment, I, A)
                flops = llama_train_flops(**m, segments=math.ceil(L / segment) if segment else 0)
                for head, hb in heads.items():
                    total = sum(states.values()) + gathered + acts + sum(hb.values())

                    def step_at(u, g):
                        compute = flops / N / (u * g["flops"])
                        return compute + max(exposed / g["link"], sent / g["link"] - compute)

                    rows.append(
                        {
                            "strategy": strategy,
                            "checkpointing": ckpt,
                            "head": head,
                            "precision": precision,
                            "segment": segment,
                            "params": psi,
                            **{f"{k} (GB)": v / 1e9 for k, v in states.items()},
                            "gathered (GB)": gathered / 1e9,
                            "activations (GB)": acts / 1e9,
                            "head + loss (GB)": sum(hb.values()) / 1e9,
                            "memory_GB": total / 1e9,
                            "headroom_GB": {k: (g["memory"] - total) / 1e9 for k, g in gpus.items()},
                            "fits": {k: total <= (1 - margin) * g["memory"] for k, g in gpus.items()},
                            "flops": flops,
                            "sent_GB": sent / 1e9,
                            "step_s": {k: step_at(mfu, g) for k, g in gpus.items()},
                            "step_band_s": {k: {u: step_at(u, g) for u in mfus} for k, g in gpus.items()},
                        }
                    )
    return rows


def fastest_plan(plan: list[dict], gpu: str, tie: float = PLAN_TIE, **where) -> dict | None:
    """The row of leaderboard_plan predicted fastest on `gpu` among those that fit (with the plan's margin); times
    within `tie` of the fastest are a tie, broken by memory (least first). `where` keeps only rows with those values,
    e.g. precision="fp32 master". None if none fits."""
    fits = [r for r in plan if r["fits"][gpu] and all(r[k] == v for k, v in where.items())]
    if not fits:
        return None
    quickest = min(r["step_s"][gpu] for r in fits)
    return min((r for r in fits if r["step_s"][gpu] <= quickest * (1 + tie)), key=lambda r: r["memory_GB"])


# ---- the memory calculator with presets, recomputation, micro-batches and pipeline stages (notebook 07 §7) ----
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
