"""Model states and collective bytes under sharding: our sharded optimizers, ZeRO 0-3 (notebook 05) and FSDP by hand
(notebook 07). Which tensors a rank owns comes from the optimizers' own partition plan.

    zero_memory("xl", 8, stage=1), live_bytes(...), fsdp_live_bytes(...), expected_collectives("zero1", S, 4)
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from helpers.formulas.step_bytes import buffer_bytes, token_bytes
from helpers.model import ModelConfig, count_parameters, get_config, parameter_shapes
from helpers.sharding import partition_by_bytes

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
        owned = [
            s for s, r in zip(sizes, partition_by_bytes([4 * s for s in sizes], world_size), strict=True) if r == rank
        ]
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


# ---- FSDP by hand (notebook 07): ZeRO-3 with whole gains and padding ----
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
    prefetched, the bound; 1: the LM head alone, as backward starts). Sharded: every Linear's and Embedding's weight
    (the 2-D parameters of the model's own table)."""
    pad = lambda k: -(-k // world_size) * world_size  # noqa: E731
    sizes = sorted(pad(math.prod(s)) for s in parameter_shapes(model).values() if len(s) == 2)
    return sum(sizes[-modules:]) * bytes_per_element


# ---- the handout's model and its fp32 AdamW states under DDP, ZeRO-1 and FSDP (notebook 07) ----


def basics_params(cfg) -> int:
    """Parameters of the handout's cs336_basics model at a size's shape: per block 4d² attention, SwiGLU's 3·d·d_ff
    and two RMSNorm gains; RoPE (no position table); untied embedding and LM head; a final gain (the zoo's "basics")."""
    return count_parameters(dataclasses.replace(get_config(cfg), arch="basics"))


def sharded_state_bytes(psi: int, world_size: int) -> dict[str, float]:
    """fp32 AdamW model states per rank (4 + 4 + 8 bytes per parameter): DDP 16Ψ, ZeRO-1 8Ψ + 8Ψ/N, FSDP 16Ψ/N."""
    return {"DDP": 16 * psi, "ZeRO-1": 8 * psi + 8 * psi / world_size, "FSDP": 16 * psi / world_size}
