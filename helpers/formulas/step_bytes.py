"""Bytes of a training step, per part (notebook 01), and an RMSNorm's minimum traffic (notebook 02).

step_breakdown("xl/cpu", 8, 128), peak_breakdown(...), block_saved_parts(...), norm_bytes(rows, H, dtype, True)
"""

from __future__ import annotations

import torch

from helpers.formulas.units import dtype_bytes
from helpers.model import ModelConfig, get_config, parameter_breakdown, parameter_shapes


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
    """Each block's buffers: its causal mask, (context, context) bool, unless the block computes as the course's
    staff code does (ops "staff", which makes the mask each forward); with RoPE ("basics") its cos and sin tables,
    (context, head_dim / 2) fp32 each."""
    c = get_config(cfg)
    mask = c.context_length**2 if c.block_ops == "fused" else 0
    rope = 2 * c.context_length * (c.head_dim // 2) * 4 if c.arch == "basics" else 0
    return c.n_layers * (mask + rope)


def activation_bytes(
    cfg: ModelConfig | str, batch_size: int, context_length: int | None = None, dtype=torch.float32
) -> dict[str, int]:
    """Bytes autograd saves for backward in one forward pass of TransformerLM (fp32), per part: the blocks
    (n_layers × block_saved_parts); after them the last residual, the final norm's y, output and rsqrt, the
    log-softmax output (B·T·V) and the loss with its total weight (2 scalars); the position ids (int64 T) for the
    embedding backward ("gpt"; RoPE's rotation saves only its tables, buffers already counted)."""
    c = get_config(cfg)
    B, T = batch_size, context_length or c.context_length
    e = dtype_bytes(dtype)
    R = B * T * c.d_model
    return {
        "blocks": c.n_layers * sum(block_saved_parts(c, B, T, dtype).values()),
        "final norm + head + loss": (3 * R + B * T + B * T * c.vocab_size + 2) * e,
        "position ids": T * 8 if c.arch == "gpt" else 0,
    }


def ffn_saved_widths(cfg: ModelConfig | str) -> int:
    """How many (B, T, d_ff) tensors the feed-forward saves: GELU's input and output ("gpt": 2); SwiGLU's w1 and w3
    outputs, silu(w1 x) and the product w2 reads, and with the staff's SiLU, x·sigmoid(x), the sigmoid too
    ("basics": 5 with ops "staff", 4 with "fused")."""
    c = get_config(cfg)
    return 2 if c.arch == "gpt" else {"staff": 5, "fused": 4}[c.block_ops]


def block_saved_parts(
    cfg: ModelConfig | str, batch_size: int, context_length: int | None = None, dtype=torch.float32
) -> dict[str, int]:
    """The bytes one block saves for backward, per op that produced them (activation_bytes' "blocks" / L, itemised),
    largest first. With R = B·T·d: the block input, norm1's y and output, q, k and v made contiguous for the
    matmuls, the re-assembled heads, the mid-block residual, norm2's y and output (10 R), two rsqrt columns, the
    causal mask (T², bool) and the feed-forward's d_ff-wide tensors (ffn_saved_widths); the attention
    probabilities (B·H·T²), and with the staff's softmax, exp(x - max) / sum, also the exp (B·H·T²), the sum and
    the max's int64 indices (B·H·T each)."""
    c = get_config(cfg)
    B, T = batch_size, context_length or c.context_length
    e = dtype_bytes(dtype)
    R = B * T * c.d_model * e
    staff = c.block_ops == "staff"
    ffn_parts = {
        "gpt": ("ffn w1 output (B·T·d_ff)", "GELU output (B·T·d_ff)"),
        "basics": (
            "ffn w1 output (B·T·d_ff)",
            "ffn w3 output (B·T·d_ff)",
            *(("sigmoid(w1 x), SiLU's (B·T·d_ff)",) if staff else ()),
            "SiLU output (B·T·d_ff)",
            "SiLU(w1 x) · w3 x, w2's input (B·T·d_ff)",
        ),
    }[c.arch]
    scores = B * c.n_heads * T * T * e
    softmax = (
        {
            "softmax: exp(x - max) (B·H·T²)": scores,
            "softmax output (attention probabilities, B·H·T²)": scores,
            "softmax: max's indices (B·H·T, int64)": B * c.n_heads * T * 8,
            "softmax: the sum (B·H·T)": B * c.n_heads * T * e,
        }
        if staff
        else {"softmax output (attention probabilities, B·H·T²)": scores}
    )
    parts = {
        **softmax,
        **dict.fromkeys(ffn_parts, B * T * c.d_ff * e),
        (
            "q, k, v made contiguous for the matmuls (3 B·T·d)"
            if c.arch == "gpt"
            else "q and k rotated (RoPE) and v made contiguous, for the matmuls (3 B·T·d)"
        ): 3 * R,
        "norm1: normalised x and output (2 B·T·d)": 2 * R,
        "norm2: normalised x and output (2 B·T·d)": 2 * R,
        "block input (B·T·d)": R,
        "heads re-assembled for the output projection (B·T·d)": R,
        "mid-block residual (B·T·d)": R,
        "norms' rsqrt columns (2 B·T)": 2 * B * T * e,
        "causal mask (T², bool)" if staff else "causal mask, negated (T², bool)": T * T,
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
