"""Will each notebook's gpu profile fit the card? Peak bytes per GPU of every run, from the closed forms in
helpers.formulas and the notebooks' own PROFILES (pure arithmetic: no CUDA, nothing allocated). tests/test_gpu_plans.py
checks each estimator against the memory tracker or a measured quantity on a CPU preset; the notebooks' gpu
configuration cells call fits_here.

    gpu_plan()                                   # one row per run of notebooks 01-08: peak per GPU, fits, needs
    fits_here("04", torch.cuda.mem_get_info()[1])  # notebook 04's runs, with `fits` for the memory present

What coexists in each run (read from the experiment code):
    01  warm timing: one model per size, the "backward" pass's graph kept while the others build theirs (cold: a
        fresh model per pass); the profiled model waits on the CPU while the sizes are measured
    02  (rows, H) tensors of one norm's fwd+bwd; one model (no optimizer) per size and norm
    03  per rank and message: source, work, output, expected and the inputs' temporaries; gloo+cuda: all ranks on 1 GPU
    04  per rank: the base model, a copy per variant with its gradients (or bucket buffers); 2 ranks on one GPU (gloo)
    05  per rank: each kind's model, gradient buckets and (sharded) AdamW state; 2 ranks on one GPU (gloo)
    06  one implementation's q, k, v, dO with the graph pass_steps keeps for "bwd" and the pass in flight (naive: four
        T x T matrices at once); the section 6 models side by side with their gradients, one step in flight
    07  per rank: FSDP, DDP, ZeRO-1 and fully_shard built side by side, one step in flight; the checkpoint sweep's
        model without checkpointing; the ring's messages (on one GPU the ring runs on the CPU)
    08  per rank: a one-process reference step on the whole batch beside the rank's share (TP model, pipeline
        stage); naive attention on the whole sequence beside ring attention; the widest TP feed-forward timed

Some runs are meant to run out of memory on a smaller card: notebook 06's naive attention rows (the handout asks at
which length it does) catch the OOM and record it as a row. Those rows carry oom_by_design, and fit_summary calls
them expected, not a warning.
"""

from __future__ import annotations

import pandas as pd
import torch

from helpers import formulas as F
from helpers.attention import score_matrix_bytes
from helpers.experiments import (
    attention,
    benchmarking,
    collectives,
    ddp,
    fsdp,
    model_parallel,
    model_parallel_pipeline,
    rmsnorm,
    sharding,
)
from helpers.model import get_config, sizes_for

GB = 1e9  # the table's unit (decimal, as the card's "80 GB")
H100_BYTES = 80e9  # one H100 80GB (torch reports about 85.5e9 bytes in total; 80e9 leaves room to spare)
CUDA_CONTEXT_BYTES = 0.5 * F.GiB  # per process: the CUDA context and cuBLAS/cuDNN workspaces, outside torch's count
ALLOCATOR_MARGIN = 0.10  # the caching allocator's rounding and fragmentation, over the tensors' bytes
ADAMW_FOREACH_TEMPS = 1  # torch's default AdamW on CUDA (foreach) allocates sqrt(v) for every element it updates
NORM_PEAK_TENSORS = 8  # fp32 (rows, H) tensors live at the worst norm's fwd+bwd peak (x, dy, intermediates, dx)
COLLECTIVE_BUFFERS = 8  # message-sized tensors per rank: up to 6 while the inputs are built (all_gather's int64
#                        index counts twice; measured on CPU: 5.25), the previous op's result, a backend scratch buffer
DDP_SPEED_RUNS = len(ddp.SPEED_VARIANTS)  # variants every speed launch holds (the sweep model adds the sweep's)


def peak_per_gpu(tensor_bytes: float, ranks_per_gpu: int) -> float:
    """Bytes one GPU must hold: every rank's tensors plus the allocator margin, and a CUDA context per rank."""
    return ranks_per_gpu * (tensor_bytes * (1 + ALLOCATOR_MARGIN) + CUDA_CONTEXT_BYTES)


def _row(notebook: str, run: str, tensor_bytes: float, ranks_per_gpu: int = 1, oom_by_design: bool = False) -> dict:
    return {
        "notebook": notebook,
        "run": run,
        "ranks_per_gpu": ranks_per_gpu,
        "peak_per_gpu_GB": peak_per_gpu(tensor_bytes, ranks_per_gpu) / GB,
        "oom_by_design": oom_by_design,
    }


# ---- notebook 01: one model per pass; the profiled one stays ----


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


def plan_01(profile: str = "gpu", gpus: int = 1, edition: str = "2026") -> list[dict]:
    """Notebook 01 at `edition`'s sizes, batch and context (benchmarking.EDITIONS): timing (a fresh model per pass;
    the warm loop's two graphs, then the full step with AdamW where the edition times it), the profiled step, then
    mixed precision and memory per size (or the edition's memory model per context) with the profiled model moved to
    the CPU (benchmarking.offloaded), so each size has the card to itself. Every per-size run is guarded (an OOM is
    recorded as a row): one that outgrows an H100 (2026's 10B; its xl at context 2048 in fp32) is an OOM by design;
    the profiled model is not guarded, so the edition's plan profiles a size that fits."""
    plan = benchmarking.EDITIONS[edition]
    e = plan.for_profile(profile)
    B, T, sizes = e["batch"], e["context"], sizes_for(profile, edition)

    def row(run: str, size, nbytes: float, guarded: bool = True) -> dict:
        return _row("01", run, nbytes, oom_by_design=guarded and peak_per_gpu(nbytes, 1) > H100_BYTES)

    def timing(s) -> float:
        step = step_peak_bytes(s, B, T) if "step" in plan.kinds else 0
        return max(warm_timing_bytes(s, B, T), step)

    rows = [row(f"timing {s} (warm: two graphs)", s, timing(s)) for s in sizes]
    profiled = e["profile_size"]
    rows.append(row(f"profiled step {profiled}", profiled, step_peak_bytes(profiled, B, T), guarded=False))
    rows += [row(f"mixed precision {s}", s, retained_graph_bytes(s, B, T, autocast=True)) for s in sizes]
    memory = [(e["memory_size"], t) for t in e["memory_contexts"]] or [(s, T) for s in sizes]
    rows += [
        row(f"memory peaks {s} at T {t}", s, max(step_peak_bytes(s, B, t), step_peak_bytes(s, B, t, autocast=True)))
        for s, t in memory
    ]
    return rows


# ---- notebook 02: norms on (rows, H), then the model per size ----


def norm_peak_bytes(rows: int, H: int) -> int:
    """Peak of one norm's fwd+bwd on (rows, H): NORM_PEAK_TENSORS fp32 tensors of that shape (bf16 needs less)."""
    return NORM_PEAK_TENSORS * rows * H * 4


def plan_02(profile: str = "gpu", gpus: int = 1) -> list[dict]:
    """Notebook 02: every norm on (rows, H) for each H; each model size with each norm, eager and compiled."""
    c = rmsnorm.PROFILES[profile]
    rows = [_row("02", f"norms {c['rows']} x {H} fwd+bwd", norm_peak_bytes(c["rows"], H)) for H in c["hidden"]]
    T = lambda s: get_config(s).context_length  # noqa: E731  (bench_model uses the model's context)
    rows += [
        _row("02", f"model {s} fwd+bwd, batch {c['batch']}", retained_graph_bytes(s, c["batch"], T(s)))
        for s in c["compile_model_sizes"]
    ]
    rows += [  # §5 adds a training step: AdamW's state on the shared weights, beside a forward's graph and gradients
        _row("02", f"compile {s}: fwd+bwd+opt, batch {c['batch']}", compile_loop_bytes(s, c["batch"], T(s)))
        for s in c["compile_model_sizes"]
    ]
    return rows


def compile_loop_bytes(size, batch_size: int, context_length: int) -> int:
    """Notebook 02 §5 (rmsnorm_model.compare_compiled): one model stepped by AdamW, so its state stays beside the
    graph and gradients of every pass (a forward may run while the last step's gradients are alive): an upper bound,
    retained_graph_bytes plus the optimizer state, or the step itself (step_peak_bytes) if larger."""
    state = F.step_breakdown(size, batch_size, context_length)["optimizer state"]
    return max(
        retained_graph_bytes(size, batch_size, context_length) + state,
        step_peak_bytes(size, batch_size, context_length),
    )


# ---- notebook 03: message buffers per rank; gloo+cuda puts every rank on the one GPU ----


def collective_bytes(size_bytes: int) -> int:
    """One rank's tensors while timing a message of size_bytes (COLLECTIVE_BUFFERS message-sized buffers)."""
    return COLLECTIVE_BUFFERS * size_bytes


def plan_03(profile: str = "gpu", gpus: int = 1) -> list[dict]:
    """Notebook 03: every (backend, cuda, world size) of the grid at its largest message; gloo shares `gpus` GPUs."""
    grid = collectives.PROFILE_GRID[profile]
    size, rows = max(grid["sizes"]), []
    for backend, device in grid["combos"]:
        if device != "cuda":
            continue
        for n in grid["world_sizes"]:
            per_gpu = 1 if backend == "nccl" else -(-n // gpus)  # NCCL: one GPU per rank (it runs where there are n)
            rows.append(
                _row(
                    "03",
                    f"{backend}+cuda, {n} ranks, {collectives.format_size(size)} messages",
                    collective_bytes(size),
                    per_gpu,
                )
            )
    return rows


# ---- notebook 04: a model copy per variant on each rank, 2 ranks on one GPU ----


def ddp_rank_bytes(size, variants: int, batch_size: int, context_length: int) -> int:
    """One speed_worker rank: the base model, per variant a copy with its gradients (or the bucket buffers they
    view), and the step in flight (activations + loss gradients, or FlatDDP's flat copy, whichever is larger)."""
    psi, masks = F.param_bytes(size), F.buffer_bytes(size)
    act = sum(F.activation_bytes(size, batch_size, context_length).values()) + F.loss_grad_bytes(
        size, batch_size, context_length
    )
    return (psi + masks) + variants * (2 * psi + masks) + max(act, psi) + 4 * F.token_bytes(batch_size, context_length)


SEED_BUCKETS_MB = ddp.SEED_BUCKETS_MB  # the seed's sweep, as notebook 04 runs it


def sweep_buckets_mb(profile: str = "gpu") -> list:
    """The bucket sizes of nb04's sweep: the profile's extra sizes and the seed's."""
    return sorted(ddp.PROFILES[profile]["extra_buckets_mb"] + SEED_BUCKETS_MB)


def ddp_variants(size, profile: str = "gpu") -> int:
    """How many variants nb04's speed launch for `size` holds at once (the sweep model adds the bucket sweep)."""
    if size != ddp.config_for(profile)["sweep_model"]:
        return DDP_SPEED_RUNS
    extra = [v for v in ddp.sweep_variants(sweep_buckets_mb(profile)) if v not in ddp.SPEED_VARIANTS]
    return DDP_SPEED_RUNS + len(extra)


def ranks_per_gpu(world: int, gpus: int) -> int:
    """Ranks sharing one GPU when `world` ranks run on `gpus` GPUs (the launcher puts rank r on GPU r % gpus)."""
    return -(-world // max(1, gpus))


def plan_04(profile: str = "gpu", gpus: int = 1, world: int = 2) -> list[dict]:
    """Notebook 04: one speed launch per size (2 ranks, each with its half of the batch; on one GPU both share it)."""
    c = ddp.config_for(profile)  # the default edition's sizes
    return [
        _row(
            "04",
            f"speed {s}, {ddp_variants(s, profile)} variants",
            ddp_rank_bytes(s, ddp_variants(s, profile), c["batch"] // world, c["context"]),
            ranks_per_gpu(world, gpus),
        )
        for s in c["sizes"]
    ]


# ---- notebook 05: each kind's model states (sharded or not), 2 ranks on one GPU ----


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


def plan_05(
    profile: str = "gpu", gpus: int = 1, world: int = 2, edition: str = "2026", gpu_bytes: float = H100_BYTES
) -> list[dict]:
    """Notebook 05: the equivalence check (kinds one after another, the unsharded gradients kept), the memory runs
    (kinds one after another: the largest counts) and each speed launch (its kinds side by side), at the models its
    setting picks for `edition` on GPUs of gpu_bytes (sharding.config_for)."""
    shared = ranks_per_gpu(world, gpus)
    c = sharding.config_for(profile, edition, shared=shared, gpu_bytes=gpu_bytes if profile == "gpu" else None)
    b, check = c["batch"] // world, c["check_model"]
    ref = 3 * F.param_bytes(check)  # equivalence: 3 steps of the unsharded run's averaged gradients
    rows = [
        _row(
            "05",
            f"equivalence {check}",
            ref + 2 * max(kind_peak_bytes(k, check, b, 64, world) for k in sharding.KINDS),
            shared,
        )
    ]
    rows += [
        _row(
            "05",
            f"memory {m}",
            max(kind_peak_bytes(k, m, b, c["context"], world) for k in ("unsharded", "sharded", "zero1")),
            shared,
        )
        for m in c["memory_models"]
    ]
    for kinds in c["speed_launches"]:
        m = c["speed_model"]
        held = sum(kind_state_bytes(k, m, world) for k in kinds)
        peak = held + max(kind_peak_bytes(k, m, b, 64, world) - kind_state_bytes(k, m, world) for k in kinds)
        rows.append(_row("05", f"speed {m}: {', '.join(kinds)}", peak, shared))
    return rows


# ---- notebook 06: one attention's pass with pass_steps' kept graph; the models side by side ----


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
    return attention.saved_bytes_formula("flash_triton", shape, dtype, is_causal=True)


def models_side_by_side_bytes(size, models: int, batch_size: int, context_length: int, autocast: bool) -> int:
    """compare_models: `models` copies of `size` with their gradients, one stepping (retained_graph_bytes: its
    activations, loss gradients and, under autocast, the weights' 16-bit copies)."""
    step = retained_graph_bytes(size, batch_size, context_length, autocast)
    return step + (models - 1) * (2 * F.param_bytes(size) + F.buffer_bytes(size))


def plan_06(profile: str = "gpu", gpus: int = 1) -> list[dict]:
    """Notebook 06: §1's naive grid (fp32, not causal) and §4's benchmark (causal, each dtype), where an OOM is
    recorded as a row (by design); the compile comparison, §6's models and the leaderboard, where it is not."""
    c = attention.PROFILES[profile]
    rows = [
        _row("06", f"naive grid {shape} fp32", naive_pass_bytes(shape), 1, True)
        for shape in attention.naive_shapes(c)[0]
    ]
    for dt in c["bench_dtypes"]:
        for shape in c["bench_shapes"] if "naive" in c["bench_impls"] else ():
            rows.append(_row("06", f"bench naive {shape} {str(dt)[6:]}", naive_pass_bytes(shape, dt, True), 1, True))
    shape = c["compile_shape"]  # naive and compiled, each with its kept graph (compiled's taken as naive's P and O)
    rows.append(_row("06", f"compile {shape}", naive_pass_bytes(shape) + naive_pass_bytes(shape) // 4))
    n, B, ac = len(c["model_impls"]), c["model_batch"], c["model_dtype"] is not None
    rows += [
        _row(
            "06", f"models {s}: {n} side by side", models_side_by_side_bytes(s, n, B, get_config(s).context_length, ac)
        )
        for s in c["model_sizes"]
    ]
    if profile == "gpu":  # the leaderboard: flash_triton, sdpa and naive on one input, each with its kept graph
        lb = attention.LEADERBOARD
        shape, dt = tuple(lb[k] for k in ("batch", "heads", "T", "d")), lb["dtype"]
        peak = naive_pass_bytes(shape, dt, True) + 2 * fused_graph_bytes(shape, dt)
        rows.append(_row("06", f"leaderboard {shape} {str(dt)[6:]}", peak))
    return rows


# ---- notebook 07: every kind side by side per rank; the checkpoint sweep's model alone ----

MEASURE_KINDS = ("fsdp", "ddp", "zero1", "torch_fsdp")  # fsdp.measure_worker's default kinds


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


def plan_07(profile: str = "gpu", gpus: int = 1, world: int = 2) -> list[dict]:
    """Notebook 07: §2-§4's measure launch (2 ranks), the checkpoint sweep (one process, no checkpointing is its
    largest), the ring's messages (NCCL with a GPU per rank; otherwise gloo on the CPU, none on the GPU)."""
    c = fsdp.PROFILES[profile]
    launch = fsdp_launch_bytes(c["model"], c["batch"] // world, c["context"], world)
    sweep = retained_graph_bytes(c["ckpt_model"], c["ckpt_batch"], c["ckpt_context"])
    rows = [
        _row("07", f"measure {c['model']}: {', '.join(MEASURE_KINDS)}", launch, ranks_per_gpu(world, gpus)),
        _row("07", f"checkpoint sweep {c['ckpt_model']}, no checkpointing", sweep),
    ]
    if gpus >= max(c["ring_worlds"]):
        rows.append(_row("07", "ring all-reduce", COLLECTIVE_BUFFERS * 4 * max(c["ring_sizes"])))
    return rows


# ---- notebook 08: every rank's one-process reference beside its share of the model ----


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


def plan_08(profile: str = "gpu", gpus: int = 1) -> list[dict]:
    """Notebook 08: the TP launch, the pipeline launch (p ranks, all on one GPU when there is one), TP against DP,
    ring attention
    against naive attention on the whole sequence (its T x T scores bound the ring's blocks), the TP speed launch."""
    c = model_parallel.PROFILES[profile]
    cfg, world, p = c["model"], c["world"], c["pipe_world"]
    pipe_cfg, batch = model_parallel_pipeline.pipe_model(c), c.get("pipe_batch", c["batch"] * c["pipe_micro"])
    cp = (1, c["cp_batch_heads"], c["cp_context"], c["cp_head_dim"])
    speed = tp_speed_bytes(c["speed_tokens"], c["speed_d_model"], c["speed_widths"], world)
    shared = ranks_per_gpu(world, gpus)
    return [
        _row("08", f"tensor parallel {cfg.name}, batch {c['batch']}", tp_launch_bytes(cfg, c["batch"]), shared),
        _row(
            "08", f"pipeline {p} stages, batch {batch}", pipeline_launch_bytes(pipe_cfg, batch), ranks_per_gpu(p, gpus)
        ),
        _row("08", f"tp against dp {cfg.name}, batch {c['batch']}", tp_dp_launch_bytes(cfg, c["batch"]), shared),
        _row("08", f"ring attention {cp[1:]}", cp_reference_bytes(cp), shared),
        _row("08", f"tp speed, d_ff up to {max(c['speed_widths'])}", speed, shared),
    ]


# ---- the table ----

PICKS_BY_CARD = ("05",)  # notebooks whose models depend on the card's memory (sharding.config_for)
PLANS = {
    "01": plan_01,
    "02": plan_02,
    "03": plan_03,
    "04": plan_04,
    "05": plan_05,
    "06": plan_06,
    "07": plan_07,
    "08": plan_08,
}


def gpus_here() -> int:
    """GPUs this process sees (1 without CUDA: the plans are for one card unless told otherwise)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 1


def gpu_plan(gpu_bytes: float = H100_BYTES, profile: str = "gpu", gpus: int = 1) -> pd.DataFrame:
    """Every notebook's runs on `gpus` GPUs of gpu_bytes each: peak per GPU, whether it fits, how much more it needs
    (multi-rank runs share a GPU only when there are fewer GPUs than ranks)."""
    card = {nb: {"gpu_bytes": gpu_bytes} for nb in PICKS_BY_CARD}
    plan = pd.DataFrame([row for nb, fn in PLANS.items() for row in fn(profile, gpus=gpus, **card.get(nb, {}))])
    by_design = plan.pop("oom_by_design")
    plan["budget_GB"] = gpu_bytes / GB
    plan["fits"] = plan["peak_per_gpu_GB"] <= plan["budget_GB"]
    plan["needs"] = [
        ("" if ok else f"+{peak - budget:.1f} GB")
        for peak, budget, ok in zip(plan["peak_per_gpu_GB"], plan["budget_GB"], plan["fits"], strict=True)
    ]
    plan["oom_by_design"] = by_design  # an OOM there is recorded as a row, not a failure (notebook 06's naive runs)
    return plan


def fits_here(notebook: str, gpu_bytes: float, gpus: int | None = None) -> pd.DataFrame:
    """One notebook's gpu runs, judged against the memory present (e.g. torch.cuda.mem_get_info()[1]) on this
    machine's GPUs (gpus: default those CUDA sees)."""
    if notebook not in PLANS:
        raise ValueError(f"unknown notebook {notebook!r}; expected one of {', '.join(PLANS)}")
    plan = gpu_plan(gpu_bytes, gpus=gpus_here() if gpus is None else gpus)
    return plan[plan["notebook"] == notebook].reset_index(drop=True)


def fit_summary(notebook: str, gpu_bytes: float, gpus: int | None = None) -> str:
    """A line per run of `notebook` that will not fit gpu_bytes (with what it needs): a warning, or for a run whose
    OOM the notebook records by design, an expected OOM; or one line saying all fit."""
    plan = fits_here(notebook, gpu_bytes, gpus)
    short = plan[~plan["fits"]]
    if short.empty:
        return (
            f"gpu plan: all {len(plan)} runs of notebook {notebook} fit this GPU's {gpu_bytes / GB:.1f} GB "
            f"(largest {plan['peak_per_gpu_GB'].max():.1f} GB, with a {ALLOCATOR_MARGIN:.0%} margin)"
        )
    return "\n".join(
        f"expected OOM (recorded as a row, by design): {r.run} needs about {r.peak_per_gpu_GB:.1f} GB "
        f"({r.needs} over this GPU's {r.budget_GB:.1f} GB)"
        if r.oom_by_design
        else f"warning: {r.run} needs about {r.peak_per_gpu_GB:.1f} GB per GPU ({r.needs} over this GPU's "
        f"{r.budget_GB:.1f} GB): expect an OOM there"
        for r in short.itertuples()
    )
