"""Will each notebook's gpu profile fit the card? Peak bytes per GPU of every run, from the closed forms in
helpers.formulas and the notebooks' own PROFILES (pure arithmetic: no CUDA, nothing allocated). tests/test_gpu_plans.py
checks each estimator against the memory tracker or a measured quantity on a CPU preset; the notebooks' gpu
configuration cells call fits_here.

    gpu_plan()                                   # one row per run of notebooks 01-05: peak per GPU, fits, needs
    fits_here("04", torch.cuda.mem_get_info()[1])  # notebook 04's runs, with `fits` for the memory present

What coexists in each run (read from the experiment code):
    01  warm timing: one model per size, the "backward" pass's graph kept while the others build theirs (cold: a
        fresh model per pass); the profiled model waits on the CPU while the sizes are measured
    02  (rows, H) tensors of one norm's fwd+bwd; one model (no optimizer) per size and norm
    03  per rank and message: source, work, output, expected and the inputs' temporaries; gloo+cuda: all ranks on 1 GPU
    04  per rank: the base model, a copy per variant with its gradients (or bucket buffers); 2 ranks on one GPU (gloo)
    05  per rank: each kind's model, gradient buckets and (sharded) AdamW state; 2 ranks on one GPU (gloo)
"""

from __future__ import annotations

import pandas as pd

from helpers import formulas as F
from helpers.experiments import benchmarking, collectives, ddp, rmsnorm, sharding
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


def _row(notebook: str, run: str, tensor_bytes: float, ranks_per_gpu: int = 1) -> dict:
    return {
        "notebook": notebook,
        "run": run,
        "ranks_per_gpu": ranks_per_gpu,
        "peak_per_gpu_GB": peak_per_gpu(tensor_bytes, ranks_per_gpu) / GB,
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


def plan_01(profile: str = "gpu", gpus: int = 1) -> list[dict]:
    """Notebook 01: timing (a fresh model per pass), the profiled step, then mixed precision and memory per size with
    the profiled model moved to the CPU (benchmarking.offloaded), so each size has the card to itself."""
    c = benchmarking.PROFILES[profile]
    B, T = c["batch"], c["context"]
    rows = [_row("01", f"timing {s} (warm: two graphs)", warm_timing_bytes(s, B, T)) for s in sizes_for(profile)]
    rows.append(_row("01", f"profiled step {c['profile_size']}", step_peak_bytes(c["profile_size"], B, T)))
    rows += [
        _row("01", f"mixed precision {s}", retained_graph_bytes(s, B, T, autocast=True)) for s in sizes_for(profile)
    ]
    rows += [
        _row("01", f"memory peaks {s}", max(step_peak_bytes(s, B, T), step_peak_bytes(s, B, T, autocast=True)))
        for s in sizes_for(profile)
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
    return rows


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


def ddp_variants(size, profile: str = "gpu") -> int:
    """How many variants nb04's speed launch for `size` holds at once (the sweep model adds the bucket sweep)."""
    c = ddp.PROFILES[profile]
    if size != c["sweep_model"]:
        return DDP_SPEED_RUNS
    sweep = sorted(c["extra_buckets_mb"] + [1, 5, 10, 25, 50, 100, 500])  # + the notebook's SEED_BUCKETS_MB
    return DDP_SPEED_RUNS + len([v for v in ddp.sweep_variants(sweep) if v not in ddp.SPEED_VARIANTS])


def ranks_per_gpu(world: int, gpus: int) -> int:
    """Ranks sharing one GPU when `world` ranks run on `gpus` GPUs (the launcher puts rank r on GPU r % gpus)."""
    return -(-world // max(1, gpus))


def plan_04(profile: str = "gpu", gpus: int = 1, world: int = 2) -> list[dict]:
    """Notebook 04: one speed launch per size (2 ranks, each with its half of the batch; on one GPU both share it)."""
    c = ddp.PROFILES[profile]
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


def plan_05(profile: str = "gpu", gpus: int = 1, world: int = 2) -> list[dict]:
    """Notebook 05: the equivalence check (kinds one after another, the unsharded gradients kept), the memory runs
    (kinds one after another: the largest counts) and each speed launch (its kinds side by side)."""
    c = sharding.PROFILES[profile]
    b, check, shared = c["batch"] // world, c["check_model"], ranks_per_gpu(world, gpus)
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


# ---- the table ----

PLANS = {"01": plan_01, "02": plan_02, "03": plan_03, "04": plan_04, "05": plan_05}


def gpus_here() -> int:
    """GPUs this process sees (1 without CUDA: the plans are for one card unless told otherwise)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 1


def gpu_plan(gpu_bytes: float = H100_BYTES, profile: str = "gpu", gpus: int = 1) -> pd.DataFrame:
    """Every notebook's runs on `gpus` GPUs of gpu_bytes each: peak per GPU, whether it fits, how much more it needs
    (multi-rank runs share a GPU only when there are fewer GPUs than ranks)."""
    plan = pd.DataFrame([row for fn in PLANS.values() for row in fn(profile, gpus=gpus)])
    plan["budget_GB"] = gpu_bytes / GB
    plan["fits"] = plan["peak_per_gpu_GB"] <= plan["budget_GB"]
    plan["needs"] = [
        ("" if ok else f"+{peak - budget:.1f} GB")
        for peak, budget, ok in zip(plan["peak_per_gpu_GB"], plan["budget_GB"], plan["fits"], strict=True)
    ]
    return plan


def fits_here(notebook: str, gpu_bytes: float, gpus: int | None = None) -> pd.DataFrame:
    """One notebook's gpu runs, judged against the memory present (e.g. torch.cuda.mem_get_info()[1]) on this
    machine's GPUs (gpus: default those CUDA sees)."""
    if notebook not in PLANS:
        raise ValueError(f"unknown notebook {notebook!r}; expected one of {', '.join(PLANS)}")
    plan = gpu_plan(gpu_bytes, gpus=gpus_here() if gpus is None else gpus)
    return plan[plan["notebook"] == notebook].reset_index(drop=True)


def fit_summary(notebook: str, gpu_bytes: float, gpus: int | None = None) -> str:
    """A line per run of `notebook` that will not fit gpu_bytes (with what it needs), or one line saying all fit."""
    plan = fits_here(notebook, gpu_bytes, gpus)
    short = plan[~plan["fits"]]
    if short.empty:
        return (
            f"gpu plan: all {len(plan)} runs of notebook {notebook} fit this GPU's {gpu_bytes / GB:.1f} GB "
            f"(largest {plan['peak_per_gpu_GB'].max():.1f} GB, with a {ALLOCATOR_MARGIN:.0%} margin)"
        )
    return "\n".join(
        f"warning: {r.run} needs about {r.peak_per_gpu_GB:.1f} GB per GPU ({r.needs} over this GPU's "
        f"{r.budget_GB:.1f} GB): expect an OOM there"
        for r in short.itertuples()
    )
