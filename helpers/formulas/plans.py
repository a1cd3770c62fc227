"""The 2026 leaderboard as a plan (notebook 07 §8): a Llama-like model's memory, FLOPs and predicted step time per
strategy, checkpointing, LM head and optimizer precision, and the fastest plan that fits.

    leaderboard_plan(), fastest_plan(plan, "B200 ~180 GB")
"""

from __future__ import annotations

import math

from helpers.formulas.checkpointing import checkpoint_memory

# A Llama-like model: per block RMSNorm, q/k/v/o projections (4d²), causal FlashAttention (saves O and one fp32
# logsumexp per row and head, never the T × T scores), RMSNorm, SwiGLU (3·d·d_ff); untied embedding and LM head.
# bf16 compute (weights, activations and gradients in bf16); the optimizer state per PLAN_PRECISIONS (below).

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
PLAN_PRECISIONS = {  # optimizer bytes per parameter beside bf16 weights + gradients (2 + 2)
    "fp32 master": 12,  # an fp32 master copy + two fp32 AdamW moments: 16 B/param in all
    "bf16 weights": 8,  # no master: the bf16 weights updated in place, two fp32 moments: 12 B/param
    "all bf16": 4,  # the 2026 handout's Config (torch_dtype = torch.bfloat16, a stock AdamW on the model's parameters,
    # whose moments take the parameters' dtype): 8 B/param
}
# Without a master, updates below bf16's resolution are lost unless rounded stochastically or compensated: a numerics
# risk a plan must state (the handout's timing harness takes it).
HANDOUT_PRECISION = "all bf16"
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
    (plain, fused and chunked) × optimizer precision (PLAN_PRECISIONS: fp32 master weights; bf16 weights with fp32
    moments; all bf16, the handout's Config): memory
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
    block_input = tokens * d * e  # a block's input (what a checkpointed segment keeps)
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
                {"fp32 master": "fp32 master + AdamW", "all bf16": "AdamW (bf16 moments)"}.get(
                    precision, "AdamW (fp32 moments)"
                ): opt_bytes * psi / (N if stage >= 1 else 1),
            }
            for ckpt in PLAN_CHECKPOINTING:
                segment = {"none": 0, "every block": 1, "sqrt(L) segments": max(1, round(math.sqrt(L)))}[ckpt]
                acts = checkpoint_memory(L, segment, block_input, A)
                flops = llama_train_flops(**m, segments=math.ceil(L / segment) if segment else 0)
                for head, hb in heads.items():
                    total = sum(states.values()) + gathered + acts + sum(hb.values())

                    def step_at(u, g, flops=flops, exposed=exposed, sent=sent):  # this row's flops and bytes
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
