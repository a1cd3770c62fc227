"""Closed forms of model parallelism (notebook 08): bytes per step, activation memory, bubbles, exactness bounds.

    tp_collectives(cfg, batch_size=4, context_length=32, world=2, sequence_parallel=True)   # {op: (calls, bytes)}
    tp_bytes_sent(cfg, 4, 32, 2)                    # bytes one rank puts on the wire per step (ring collectives)
    dp_collectives(cfg, world=2)                    # plain data parallelism: one all-reduce of every gradient
    tp_dp_equal_bytes_tokens(cfg)                   # tokens per step where TP and DP send the same bytes
    block_activation_bytes(cfg, 4, 32, world=2, sequence_parallel=False)   # saved by one block's forward
    bubble_fraction(stages=4, micro_batches=8)      # (p - 1) / (m + p - 1); chunks=v: (p - 1) / (v m + p - 1)
    reduction_length(cfg, 32)                       # terms along a step's longest chain of sums (the fp32 bound)

Imported directly (helpers.formulas.model_parallel), not re-exported by the package.
"""

from __future__ import annotations

import torch

from helpers.formulas.collectives import busbw_factor
from helpers.formulas.step_bytes import param_bytes
from helpers.formulas.units import dtype_bytes

UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}


def tp_collectives(
    cfg, batch_size: int, context_length: int, world: int, sequence_parallel: bool = False, dtype=torch.float32
) -> dict[str, tuple[int, int]]:
    """{op: (calls, bytes)} of one training step of helpers.tensor_parallel.TensorParallelLM, in count_collectives'
    sizes (all-reduce buffer, all-gather output, reduce-scatter input). Per block, TP: f and g are one all-reduce
    of the (B, T, C) activations each, in forward (g) and in backward (f): 4. SP: forward 2 all-gathers + 2
    reduce-scatters; backward the 2 reduce-scatters' all-gathers, 2 all-gathers again (the saved T/N input) and 2
    reduce-scatters; plus the model's entry and exit (one all-gather each) and the 2 gains' all-reduces."""
    if world == 1:
        return {}
    act = batch_size * context_length * cfg.d_model * dtype_bytes(dtype)  # one (B, T, C) tensor
    L = cfg.n_layers
    if not sequence_parallel:
        return {"all_reduce": (4 * L, 4 * L * act)}
    gains = 2 * L * cfg.d_model * dtype_bytes(dtype)
    return {
        "all_gather": (6 * L + 2, (6 * L + 2) * act),
        "reduce_scatter": (4 * L, 4 * L * act),
        "all_reduce": (2 * L, gains),
    }


def tp_bytes_sent(
    cfg, batch_size: int, context_length: int, world: int, sequence_parallel: bool = False, dtype=torch.float32
) -> float:
    """Bytes one rank sends per step with ring collectives: all-reduce 2(N-1)/N of its buffer, all-gather and
    reduce-scatter (N-1)/N (notebook 03's busbw factors). TP: 8 L (N-1)/N · BTC·b; SP: (10 L + 2) (N-1)/N · BTC·b
    and the gains, so SP as Megatron builds it sends 2 L more activations per step (the backward's re-gather) for
    its 1/N activation memory."""
    return sent_bytes(tp_collectives(cfg, batch_size, context_length, world, sequence_parallel, dtype), world)


def sent_bytes(calls: dict[str, tuple[int, int]], world: int) -> float:
    """Bytes one rank sends for {op: (calls, bytes)} with ring collectives (notebook 03's busbw factors)."""
    return sum(busbw_factor(op, world) * nbytes for op, (_, nbytes) in calls.items())


def dp_collectives(cfg, world: int, dtype=torch.float32) -> dict[str, tuple[int, int]]:
    """{op: (calls, bytes)} of one step of plain data parallelism with one flat gradient buffer (helpers.ddp.FlatDDP):
    one all-reduce of every gradient, Ψ·b bytes, whatever the batch."""
    return {} if world == 1 else {"all_reduce": (1, param_bytes(cfg, dtype))}


def tp_dp_equal_bytes_tokens(cfg) -> float:
    """Tokens per step (B·T) at which TP's all-reduces (4 L of B·T·C per step) carry as many bytes as DP's gradient
    all-reduce (Ψ), both 2(N − 1)/N on a ring: Ψ / (4 L C), whatever N. Fewer tokens: TP sends less; more: DP does."""
    return param_bytes(cfg) / dtype_bytes(torch.float32) / (4 * cfg.n_layers * cfg.d_model)


def block_activation_bytes(
    cfg, batch_size: int, context_length: int, world: int = 1, sequence_parallel: bool = False
) -> int:
    """Bytes one block's forward leaves alive for backward (with its output), fp32, helpers.model's naive attention.
    In the style of Korthikanti et al. 2022 (§4, Eq. 1-4: sbh(34 + 5as/h) per layer, sbh(10 + 24/t + 5as/(ht))
    with TP, sbh/t(34 + 5as/h) with TP+SP), with this block's tensors, 4 bytes each, in units of sbh:

        replicated under TP: norm1's normalized x and output (2), the residual x1 (1), norm2's (2), the output (1)
        split by t:          q, k, v, y copies for the matmuls (4), w1's and gelu's outputs (2 f/h), softmax a s/h

    plus each norm's 1/rms (s b) and the causal mask (s², bool). SP divides everything per position by t."""
    s, b, h, a, f = context_length, batch_size, cfg.d_model, cfg.n_heads, cfg.d_ff
    t = world
    split = 4 + 2 * f / h + a * s / h  # in units of s·b·h
    units = (6 + split) / t if sequence_parallel else 6 + split / t
    rsqrt = 2 * s * b / (t if sequence_parallel else 1)
    return round(4 * s * b * h * units + 4 * rsqrt + s * s)


def korthikanti_bytes(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False) -> float:
    """Korthikanti et al. 2022's activation bytes per layer (16-bit, dropout, 4h FFN): Eq. 1 (t=1), Eq. 2 (TP),
    Eq. 4 (TP + SP); for comparison with the fp32, dropout-free block above."""
    if sequence_parallel:
        return s * b * h / t * (34 + 5 * a * s / h)
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def reduction_length(cfg, context_length: int) -> int:
    """Terms along the longest chain of sums in one training step: per block qkv (C), scores (D), att@v (T), proj
    (C), w1 (C), w2 (d_ff); the head (C) and the loss's softmax (V); backward the same again. Two fp32 evaluations
    of the step that differ only in summation order (TP's partial sums, all-reduces) are each within n·u of the
    exact value, normwise, to first order (Higham, Accuracy and Stability, §3.1/3.5), so within 2·n·u of each
    other: the bound `tp_bound` uses."""
    c, T = cfg.d_model, context_length
    per_block = 3 * c + cfg.head_dim + T + cfg.d_ff
    return 2 * (cfg.n_layers * per_block + c + cfg.vocab_size)


def tp_bound(cfg, context_length: int, scale: float, dtype=torch.float32) -> float:
    """|tensor-parallel − one process| ≤ 2·n·u·max|one process| for a tensor of the step (n: reduction_length)."""
    return 2 * reduction_length(cfg, context_length) * UNIT_ROUNDOFF[dtype] * scale


def bound_columns(diff: float, bound: float) -> dict:
    """An exactness check's row: the largest |difference| from one process, its bound and their ratio (≤ 1 passes)."""
    return {"max_abs_diff": diff, "bound": bound, "diff/bound": diff / bound}


def worst_against(diffs: dict, bound_of) -> tuple[str, dict]:
    """Of {name: (max |difference|, scale)}, the name nearest its bound bound_of(scale), with its bound_columns."""
    bounds = {n: bound_of(scale) for n, (_, scale) in diffs.items()}
    worst = max(diffs, key=lambda n: diffs[n][0] / bounds[n])
    return worst, bound_columns(diffs[worst][0], bounds[worst])


def bubble_fraction(stages: int, micro_batches: int, chunks: int = 1) -> float:
    """Idle share of a pipeline step, GPipe and 1F1B alike: (p − 1) / (m + p − 1) (Huang et al. 2019; Narayanan et
    al. 2021 §2.2); interleaved 1F1B with v chunks per rank: (p − 1) / (v·m + p − 1), its bubble time (p − 1)/v
    passes of a stage's whole work over the step's m + (p − 1)/v (Narayanan et al. 2021 §2.2.1)."""
    return (stages - 1) / (chunks * micro_batches + stages - 1)


def pipeline_peak_micro_batches(schedule: str, stages: int, micro_batches: int, stage: int, chunks: int = 1) -> float:
    """Micro-batches whose activations a stage holds at once: GPipe all m; 1F1B at most p − stage (stage 0: p);
    interleaved 1F1B, chunks of equal size: its w = 2(p − s − 1) + (v − 1)p warm-up passes and one more (all v·m
    when m = p or w reaches them), each 1/v of a micro-batch (Megatron-LM's warm-up count)."""
    if schedule == "gpipe":
        return micro_batches
    if schedule == "1f1b":
        return min(micro_batches, stages - stage)
    if schedule == "interleaved":
        passes = micro_batches * chunks
        held = passes if micro_batches == stages else min(2 * (stages - stage - 1) + (chunks - 1) * stages + 1, passes)
        return held / chunks
    raise ValueError(f"unknown schedule {schedule!r}; expected 'gpipe', '1f1b' or 'interleaved'")


def reorder_bound(cfg, context_length: int, micro_batches: int, scale: float, dtype=torch.float32) -> float:
    """Pipeline gradients against one process on the whole batch: the step's chains of sums (reduction_length) and
    the m micro-batches' gradients accumulated one by one: 2·(n + m)·u·max|one process|."""
    n = reduction_length(cfg, context_length) + micro_batches
    return 2 * n * UNIT_ROUNDOFF[dtype] * scale


def cp_bytes_sent(
    batch_heads: int, context_length: int, head_dim: int, world: int, dtype=torch.float32, backward: bool = False
) -> int:
    """Bytes one rank sends in a ring-attention forward: N − 1 steps, each passing its K and V blocks of T/N rows:
    2 (N − 1)/N · T · BH · d · b, an all-gather of K and V spread over the steps. Backward: K and V again N − 1
    steps, and dK, dV N steps (the last one home): (4N − 2)/N · T · BH · d · b."""
    blocks = 2 * (world - 1) + (2 * world if backward else 0)  # (T/N, BH, d) blocks sent
    return blocks * (context_length // world) * batch_heads * head_dim * dtype_bytes(dtype)


def cp_work(world: int, rank: int, causal: bool, balanced: bool = True) -> float:
    """(query, key) chunk pairs rank `rank` computes, in (T/N)² units (a causal diagonal counts half): N without a
    mask; causal, contiguous chunks r + 1/2; causal, chunks r and 2N − 1 − r: N/2 on every rank."""
    if not causal:
        return float(world)
    return world / 2 if balanced else rank + 0.5


def tp_ffn_seconds(*, B: int, D: int, D_FF: int, N: int, C: float, alpha: float, beta: float, b: int = 4) -> dict:
    """One training step of a Megatron feed-forward (two matrices) on N ranks, B tokens: compute 12·B·D·D_FF/(N·C)
    (forward 4, backward 8 FLOPs per weight and token), communication two all-reduces of B·D·b bytes (g forward, f
    backward), each α + 2(N−1)/N·S/β on the α-β model; and the width D_FF* where the two are equal, above which the
    step is compute-bound (notebook 07's tp_calcs, with α and this FFN's FLOPs)."""
    compute = 12 * B * D * D_FF / (N * C)
    comm = 2 * (alpha + 2 * (N - 1) / N * B * D * b / beta)
    return dict(
        compute_s=compute, comm_s=comm, comm_share=comm / (compute + comm), d_ff_star=comm * N * C / (12 * B * D)
    )
