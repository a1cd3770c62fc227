"""The closed forms behind helpers.experiments.gpu_plans: bytes one rank of each notebook's runs holds at its peak,
from helpers.formulas (pure arithmetic: no CUDA, nothing allocated), and the bytes per GPU with the allocator's margin
and a CUDA context per rank. tests/test_gpu_plans.py checks each against the memory tracker on a CPU preset, and the
dry run (helpers.course.dry_run) against the tracked peak of the same run at the gpu sizes on the meta device.

    peak_per_gpu(step_peak_bytes("xl-2026", 4, 512), ranks_per_gpu=1) / GB    # notebook 01's profiled step, in GB
    fits_card(step_peak_bytes("xl-2025", 4, 128), 40e9)     # False: a notebook's setup picks what this card holds
    card_note("xl-2025's profiled step", step_peak_bytes("xl-2025", 4, 128), 40e9, "large-2025 profiled instead")
"""

from __future__ import annotations

import torch

from helpers import formulas as F
from helpers.attention import score_matrix_bytes
from helpers.experiments.attention_memory import saved_bytes_formula
from helpers.model import count_parameters, get_config

GB = 1e9  # the table's unit (decimal, as the card's "80 GB")
H100_BYTES = 80e9  # one H100 80GB (torch reports about 85.5e9 bytes in total; 80e9 leaves room to spare)
CUDA_CONTEXT_BYTES = 0.5 * F.GiB  # per process: the CUDA context and cuBLAS/cuDNN workspaces, outside torch's count
ALLOCATOR_MARGIN = 0.10  # the caching allocator's rounding and fragmentation, over the tensors' bytes
ADAMW_FOREACH_TEMPS = 1  # torch's default AdamW on CUDA (foreach) allocates sqrt(v) for every element it updates
NORM_PEAK_TENSORS = 8  # fp32 (rows, H) tensors live at the worst norm's fwd+bwd peak (x, dy, intermediates, dx)
COLLECTIVE_BUFFERS = 8  # message-sized tensors per rank: up to 6 while the inputs are built (all_gather's int64
#                        index counts twice; measured on CPU: 5.25), the previous op's result, a backend scratch buffer
MEASURE_KINDS = ("fsdp", "ddp", "zero1", "torch_fsdp")  # fsdp.measure_worker's default kinds


def peak_per_gpu(tensor_bytes: float, ranks_per_gpu: int) -> float:
    """Bytes one GPU must hold: every rank's tensors plus the allocator margin, and a CUDA context per rank."""
    return ranks_per_gpu * (tensor_bytes * (1 + ALLOCATOR_MARGIN) + CUDA_CONTEXT_BYTES)


def fits_card(tensor_bytes: float, gpu_bytes: float | None, ranks_per_gpu: int = 1) -> bool:
    """Whether a run holding tensor_bytes per rank fits a card of gpu_bytes (peak_per_gpu's margins; None: no card
    known, anything fits): what the notebooks' setups ask before they pick a size for the card present."""
    return gpu_bytes is None or peak_per_gpu(tensor_bytes, ranks_per_gpu) <= gpu_bytes


def card_note(run: str, tensor_bytes: float, gpu_bytes: float, instead: str, ranks_per_gpu: int = 1) -> str:
    """The note of a run the card present cannot hold, as a cell says it: "2.7B's compiled step needs about 57 GB;
    this card has 40: left out"."""
    shared = f" ({ranks_per_gpu} ranks share the card)" if ranks_per_gpu > 1 else ""
    need = peak_per_gpu(tensor_bytes, ranks_per_gpu) / GB
    return f"{run} needs about {need:.0f} GB{shared}; this card has {gpu_bytes / GB:.0f}: {instead}"


def keep_fitting(
    need: dict, gpu_bytes: float | None, run, instead: str, ranks_per_gpu: int = 1, always=None
) -> tuple[list, list[str]]:
    """(the keys of `need` (key -> bytes per rank) whose run fits the card, `always` kept whatever its size (None:
    the first key where none fits); a card_note for each key left out, `run(key)` naming its run): a notebook's list
    of sizes cut to the card present."""
    kept = [k for k, nbytes in need.items() if k == always or fits_card(nbytes, gpu_bytes, ranks_per_gpu)]
    kept = kept or list(need)[:1]
    return kept, [card_note(run(k), need[k], gpu_bytes, instead, ranks_per_gpu) for k in need if k not in kept]


def in_place_of(size: str, sizes, need, gpu_bytes: float | None) -> str:
    """`size` where the card holds need(size), else the largest of `sizes` smaller than it (by parameters) that the
    card holds (the smallest if none: the fit summary then warns): what a notebook runs in its place."""
    if fits_card(need(size), gpu_bytes):
        return size
    smaller = [s for s in sizes if count_parameters(s) < count_parameters(size)]
    return ([s for s in smaller if fits_card(need(s), gpu_bytes)] or smaller[:1] or [size])[-1]


def retained_graph_bytes(size, batch_size: int, context_length: int, autocast: bool = False) -> int:
    """Forward + backward with no optimizer and the graph kept (nb01's "backward" pass): parameters, gradients,
    saved activations, the loss gradients and the token ids all at once; autocast adds bf16 copies of the weights."""
    parts = F.step_breakdown(size, batch_size, context_length)
    casts = 2 * F.matmul_params(get_config(size)) if autocast else 0
    return sum(parts.values()) - parts["optimizer state"] + F.loss_grad_bytes(size, batch_size, context_length) + casts


def warm_timing_bytes(size, batch_size: int, context_length: int, autocast: bool = False) -> int:
    """nb01's warm timing: the three passes interleaved on one model, so the "backward" pass's retained graph lives
    through the loop while "forward" and "both" build a second one: retained_graph_bytes plus a second graph's saved
    activations and loss gradients."""
    second = sum(F.activation_bytes(size, batch_size, context_length).values()) + F.loss_grad_bytes(
        size, batch_size, context_length
    )
    return retained_graph_bytes(size, batch_size, context_length, autocast) + second


def step_peak_bytes(size, batch_size: int, context_length: int, foreach: bool = True, autocast: bool = False) -> int:
    """Peak of a steady-state AdamW step: the larger of the start of backward (formulas.peak_breakdown) and the
    optimizer step (parameters, gradients, state, and foreach AdamW's sqrt(v) temporaries)."""
    start = sum(F.peak_breakdown(size, batch_size, context_length).values())
    start += 2 * F.matmul_params(get_config(size)) if autocast else 0
    parts = F.step_breakdown(size, batch_size, context_length)
    step = (
        parts["parameters"]
        + parts["buffers"]
        + parts["gradients"]
        + parts["optimizer state"]
        + parts["token ids"]
        + (ADAMW_FOREACH_TEMPS * parts["parameters"] if foreach else 0)
    )
    return max(start, step)


def norm_peak_bytes(rows: int, H: int) -> int:
    """Peak of one norm's fwd+bwd on (rows, H): NORM_PEAK_TENSORS fp32 tensors of that shape (bf16 needs less)."""
    return NORM_PEAK_TENSORS * rows * H * 4


def compile_loop_bytes(size, batch_size: int, context_length: int) -> int:
    """Notebook 02 §5 (rmsnorm_model.compare_compiled): one model stepped by AdamW, so its state stays beside the
    graph and gradients of every pass (a forward may run while the last step's gradients are alive): an upper bound,
    retained_graph_bytes plus the optimizer state, or the step itself (step_peak_bytes) if larger."""
    state = F.step_breakdown(size, batch_size, context_length)["optimizer state"]
    return max(
        retained_graph_bytes(size, batch_size, context_length) + state,
        step_peak_bytes(size, batch_size, context_length),
    )


def collective_bytes(size_bytes: int) -> int:
    """One rank's tensors while timing a message of size_bytes (COLLECTIVE_BUFFERS message-sized buffers)."""
    return COLLECTIVE_BUFFERS * size_bytes


def ddp_rank_bytes(size, variants: int, batch_size: int, context_length: int) -> int:
    """One speed_worker rank: the base model, per variant a copy with its gradients (or the bucket buffers they
    view), and the step in flight (activations + loss gradients, or FlatDDP's flat copy, whichever is larger)."""
    psi, masks = F.param_bytes(size), F.buffer_bytes(size)
    act = sum(F.activation_bytes(size, batch_size, context_length).values()) + F.loss_grad_bytes(
        size, batch_size, context_length
    )
    return (psi + masks) + variants * (2 * psi + masks) + max(act, psi) + 4 * F.token_bytes(batch_size, context_length)


def ranks_per_gpu(world: int, gpus: int) -> int:
    """Ranks sharing one GPU when `world` ranks run on `gpus` GPUs (the launcher puts rank r on GPU r % gpus)."""
    return -(-world // max(1, gpus))


def kind_state_bytes(kind: str, size, world: int = 2, rank: int = 0) -> int:
    """One kind's resting model states on a rank (formulas.live_bytes after a step; torch_zero as sharded)."""
    parts = F.live_bytes("sharded" if kind == "torch_zero" else kind, size, world, rank, 1, 1, "after step")
    return parts["parameters"] + parts["gradients"] + parts["optimizer state"]


def kind_peak_bytes(kind: str, size, batch_per_rank: int, context_length: int, world: int = 2) -> int:
    """Peak of one kind's step on the fullest rank: its states plus the larger of backward's start (activations,
    loss gradients) and the step's temporaries (foreach sqrt(v) over the owned state, a Ψ-sized broadcast buffer)."""
    states = max(kind_state_bytes(kind, size, world, r) for r in range(world))
    owned = max(F.state_bytes("sharded" if kind == "torch_zero" else kind, size, world, r) for r in range(world)) // 2
    act = sum(F.activation_bytes(size, batch_per_rank, context_length).values()) + F.loss_grad_bytes(
        size, batch_per_rank, context_length
    )
    step = ADAMW_FOREACH_TEMPS * owned + (0 if kind == "unsharded" else F.param_bytes(size))
    return states + max(act, step) + F.token_bytes(batch_per_rank, context_length)


def naive_pass_bytes(shape, dtype=torch.float32, is_causal: bool = False) -> int:
    """Peak of bench_attention("naive") on (B, H, T, d): q, k, v, dO, the graph pass_steps keeps for "bwd" (P, O)
    and the worst pass, fwd+bwd. With S one score matrix and X one (B, H, T, d) tensor: as its backward starts, 4 S
    and 7 X (its own P, dP, dS beside the kept P) and both causal masks; or, once the score matrices die, 2 S and
    9 X (the gradients) and one mask, where T < 2d. Exact on the CPU's tracker (tests/test_gpu_plans.py)."""
    B, H, T, d = shape
    S, X, mask = score_matrix_bytes(B * H, T, T, dtype), B * H * T * d * dtype.itemsize, T * T if is_causal else 0
    return max(4 * S + 7 * X + 2 * mask, 2 * S + 9 * X + mask)


def smallest_naive_oom(batch: int, head_dims, seq_lens, device_bytes: float) -> tuple[int, int, int, int]:
    """The (batch, 1, T, d) of the grid (fp32, not causal) with the least naive_pass_bytes above device_bytes: where
    the first out-of-memory error comes. When the whole grid fits, the first beyond it: T doubled past the grid's
    longest at its smallest head dim (answers pytorch_attention on a machine without that GPU)."""
    if not 0 < device_bytes < float("inf"):
        raise ValueError(f"device_bytes must be a positive, finite number of bytes; got {device_bytes}")
    grid = [(batch, 1, T, d) for d in head_dims for T in seq_lens]
    over = [s for s in grid if naive_pass_bytes(s) > device_bytes]
    if over:
        return min(over, key=naive_pass_bytes)
    T, d = max(seq_lens), min(head_dims)
    while naive_pass_bytes((batch, 1, T, d)) <= device_bytes:
        T *= 2
    return (batch, 1, T, d)


def fused_graph_bytes(shape, dtype=torch.float32) -> int:
    """What a fused attention (sdpa's flash kernel, FlashAttention) keeps for backward on (B, H, T, d): O and the fp32
    logsumexp (attention.saved_bytes_formula, which notebook 06 asserts byte-exact)."""
    return saved_bytes_formula("flash_triton", shape, dtype, is_causal=True)


def models_side_by_side_bytes(size, models: int, batch_size: int, context_length: int, autocast: bool) -> int:
    """compare_models: `models` copies of `size` with their gradients, one stepping (retained_graph_bytes: its
    activations, loss gradients and, under autocast, the weights' 16-bit copies)."""
    step = retained_graph_bytes(size, batch_size, context_length, autocast)
    return step + (models - 1) * (2 * F.param_bytes(size) + F.buffer_bytes(size))


def fsdp_state_bytes(size, world: int = 2) -> int:
    """helpers.fsdp.FSDP's resting states on a rank after a step (formulas.fsdp_live_bytes: shards, gradients,
    AdamW); torch's fully_shard taken as the same (whole tensors sharded, padding aside)."""
    parts = F.fsdp_live_bytes(size, world, 1, 1, "after step")
    return parts["parameters"] + parts["gradients"] + parts["optimizer state"]


def fsdp_flight_bytes(size, batch_per_rank: int, context_length: int, world: int = 2) -> int:
    """FSDP's step above its resting states: activations and loss gradients, two gathered modules, and the full
    gradient and its shard of every unit whose reduce-scatter waits for finish_gradient_synchronization (helpers.fsdp
    keeps them all to the end of backward). An upper bound: activations die as those gradients come."""
    act = sum(F.activation_bytes(size, batch_per_rank, context_length).values()) + F.loss_grad_bytes(
        size, batch_per_rank, context_length
    )
    e = F.fsdp_shard_elements(size, world)
    pending = 4 * e["sharded"] * (world + 1)  # the padded full gradients (N shards' worth) and this rank's shards
    gathered = F.fsdp_gathered_peak_bytes(size, world)
    return act + pending + gathered + F.token_bytes(batch_per_rank, context_length)


def fsdp_launch_bytes(size, batch_per_rank: int, context_length: int, world: int = 2, kinds=MEASURE_KINDS) -> int:
    """measure_worker on one rank: every kind's resting states at once (ddp = unsharded, zero1 as in notebook 05,
    FSDP's shards) plus the largest step in flight (fsdp_flight_bytes, or a kind's kind_peak_bytes above its
    states)."""
    states = {"ddp": kind_state_bytes("unsharded", size, world), "zero1": kind_state_bytes("zero1", size, world)}
    flight = {k: kind_peak_bytes(v, size, batch_per_rank, context_length, world) - states[k] for k, v in
              (("ddp", "unsharded"), ("zero1", "zero1"))}  # fmt: skip
    for k in ("fsdp", "torch_fsdp"):
        states[k] = fsdp_state_bytes(size, world)
        flight[k] = fsdp_flight_bytes(size, batch_per_rank, context_length, world)
    return sum(states[k] for k in kinds) + max(flight[k] for k in kinds)


def tp_launch_bytes(cfg, batch_size: int) -> int:
    """tensor_parallel_worker on a rank: one process's step on the whole batch (its gradients and logits kept as the
    reference) and, beside it, each mode's TP model with its gradients (at most the full model's 2Ψ) stepping with
    activations no larger than one process's. An upper bound."""
    T = cfg.context_length
    logits = batch_size * T * cfg.vocab_size * 4
    return retained_graph_bytes(cfg, batch_size, T) + 2 * F.param_bytes(cfg) + logits


def pipeline_launch_bytes(cfg, batch_size: int) -> int:
    """pipeline_worker on a rank: the one-process reference step on the whole batch, its gradients kept, and its
    stage (at most the model) with gradients and the schedule's activations (at most the whole batch's, after the
    reference's graph is gone). An upper bound."""
    return retained_graph_bytes(cfg, batch_size, cfg.context_length) + 2 * F.param_bytes(cfg)


def cp_reference_bytes(shape) -> int:
    """context_parallel_worker's reference on (B, H, T, d): naive attention's forward and backward (naive_pass_bytes,
    causal), then, its graph gone, the gradients' scales: P and |dS| (2 S) beside q, k, v, dO, o and the three
    gradients (8 X), the three scales and the temporaries of their matmuls (6 X), the causal mask and the
    logsumexp. An upper bound."""
    B, H, T, d = shape
    S, X = score_matrix_bytes(B * H, T, T, torch.float32), B * H * T * d * 4
    return max(naive_pass_bytes(shape, torch.float32, True), 2 * S + 14 * X + T * T + B * H * T * 4)


def tp_dp_launch_bytes(cfg, batch_size: int) -> int:
    """tp_dp_worker on a rank: the DP replica with its gradients and at most one process's activations on the whole
    batch (TP's step on it holds no more; one step's graph at a time), beside it the TP model with its gradients
    (at most 2Ψ) and FlatDDP's flat buffer (Ψ). An upper bound."""
    return retained_graph_bytes(cfg, batch_size, cfg.context_length) + 3 * F.param_bytes(cfg)


def tp_speed_bytes(tokens: int, d_model: int, widths: list, world: int) -> int:
    """tp_speed_worker on a rank at its widest feed-forward: both weight shards and their gradients, the hidden
    activations and their gradients, (tokens, d_model) input, output and their gradients (fp32)."""
    f = max(widths) // world
    return 4 * (4 * f * d_model + 4 * tokens * f + 4 * tokens * d_model)
