"""Will each notebook's gpu profile fit the card? Peak bytes per GPU of every run, from the closed forms in
helpers.experiments.gpu_plans_bytes and the models, batches and contexts each notebook builds for an edition on a card
(pure arithmetic: no CUDA, nothing allocated). tests/test_gpu_plans.py checks the estimators against the memory
tracker and the models named here against each notebook's own setup, per edition; the notebooks' gpu configuration
cells call fit_summary with their EDITION and the card's memory. The setups themselves pick what the card present
holds from the same estimates (01's profiled size, 02's compiled and 06's side-by-side models, 04's speed sizes, 05's
models, 07's checkpointed model: issue 47 item 4), so every plan here is of what its card runs; 80 and 141 GB cards
run the profiles' own sizes.

    gpu_plan(141e9, edition="2025")               # one row per run of notebooks 01-08 on an H200, 2025's models
    fit_summary("01", torch.cuda.mem_get_info()[1], edition=EDITION)   # a line per run that will not fit this card

What coexists in each run (read from the experiment code):
    01  warm timing: one model per size, the "backward" pass's graph kept while the others build theirs (cold: a
        fresh model per pass); the profiled model waits on the CPU while the sizes are measured; §5 profiles its
        model built as long as the context (benchmarking.profiled_config)
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

Notebooks 01, 04 and 05 build the models of their EDITION (NOTEBOOK_EDITIONS); 07 builds 2026's (FSDP is asked by
2026 only); the others have no edition. Some runs record an out-of-memory error as a row: notebook 06's naive
attention (the handout asks at which length it runs out) and notebook 01's guarded runs. Those rows carry
oom_by_design where they exceed the card present, and fit_summary calls them expected, not a warning.
"""

from __future__ import annotations

import pandas as pd
import torch

from helpers import formulas as F
from helpers.experiments import (
    attention,
    benchmarking,
    collectives,
    ddp,
    model_parallel,
    model_parallel_pipeline,
    rmsnorm,
    sharding,
)
from helpers.experiments.gpu_configs import (  # noqa: F401  (re-exported)
    DEFAULT_EDITION,
    EDITIONS,
    NOTEBOOK_EDITIONS,
    built_edition,
    check_edition,
    config_01,
    config_04,
    config_05,
    config_07,
)
from helpers.experiments.gpu_plans_bytes import (  # noqa: F401  (re-exported: the plans' arithmetic, one import)
    ADAMW_FOREACH_TEMPS,
    ALLOCATOR_MARGIN,
    COLLECTIVE_BUFFERS,
    CUDA_CONTEXT_BYTES,
    GB,
    H100_BYTES,
    MEASURE_KINDS,
    NORM_PEAK_TENSORS,
    collective_bytes,
    compile_loop_bytes,
    cp_reference_bytes,
    ddp_rank_bytes,
    fsdp_flight_bytes,
    fsdp_launch_bytes,
    fsdp_state_bytes,
    fused_graph_bytes,
    kind_peak_bytes,
    kind_state_bytes,
    models_side_by_side_bytes,
    naive_pass_bytes,
    norm_peak_bytes,
    peak_per_gpu,
    pipeline_launch_bytes,
    ranks_per_gpu,
    retained_graph_bytes,
    smallest_naive_oom,
    step_peak_bytes,
    tp_dp_launch_bytes,
    tp_launch_bytes,
    tp_speed_bytes,
    warm_timing_bytes,
)
from helpers.model import get_config

DDP_SPEED_RUNS = len(ddp.SPEED_VARIANTS)  # variants every speed launch holds (the sweep model adds the sweep's)
SEED_BUCKETS_MB = ddp.SEED_BUCKETS_MB  # the seed's sweep, as notebook 04 runs it


def _row(notebook: str, run: str, tensor_bytes: float, ranks_per_gpu: int = 1, oom_by_design: bool = False) -> dict:
    return {
        "notebook": notebook,
        "run": run,
        "ranks_per_gpu": ranks_per_gpu,
        "peak_per_gpu_GB": peak_per_gpu(tensor_bytes, ranks_per_gpu) / GB,
        "oom_by_design": oom_by_design,
    }


# ---- notebook 01: one model per pass; the profiled one stays ----


def plan_01(
    profile: str = "gpu", gpus: int = 1, edition: str = DEFAULT_EDITION, gpu_bytes: float = H100_BYTES
) -> list[dict]:
    """Notebook 01 at `edition`'s sizes, batch and context (config_01): timing (a fresh model per pass; the warm
    loop's two graphs, then the full step with AdamW where the edition times it), the profiled step, then mixed
    precision and memory per size (or the edition's model per context, built that long) with the profiled model moved
    to the CPU (benchmarking.offloaded), so each size has the card to itself. Every per-size run is guarded (an OOM is
    recorded as a row): one that outgrows gpu_bytes (on an H100, 2026's 10B; its xl at context 2048 in fp32) is an
    OOM by design; the profiled model is not guarded, so the edition's plan profiles a size that fits, and a card that
    cannot hold it a smaller one (benchmarking.EditionPlan.profiled_on)."""
    c = config_01(profile, edition, gpu_bytes)
    B, T, sizes = c["batch"], c["context"], c["sizes"]

    def row(run: str, nbytes: float, guarded: bool = True) -> dict:
        return _row("01", run, nbytes, oom_by_design=guarded and peak_per_gpu(nbytes, 1) > gpu_bytes)

    def timing(s) -> float:
        step = step_peak_bytes(s, B, T) if "step" in c["kinds"] else 0
        return max(warm_timing_bytes(s, B, T), step)

    rows = [row(f"timing {s} (warm: two graphs)", timing(s)) for s in sizes]
    profiled = c["profile_size"]
    rows.append(row(f"profiled step {profiled}", step_peak_bytes(profiled, B, T), guarded=False))
    rows += [row(f"mixed precision {s}", retained_graph_bytes(s, B, T, autocast=True)) for s in sizes]
    for s, t in c["memory"]:
        cfg = benchmarking.profiled_config(s, t)
        peak = max(step_peak_bytes(cfg, B, t), step_peak_bytes(cfg, B, t, autocast=True))
        rows.append(row(f"memory peaks {s} at T {t}", peak))
    return rows


# ---- notebook 02: norms on (rows, H), then the model per size ----


def plan_02(
    profile: str = "gpu", gpus: int = 1, edition: str = DEFAULT_EDITION, gpu_bytes: float = H100_BYTES
) -> list[dict]:
    """Notebook 02: every norm on (rows, H) for each H; each model size with each norm, eager and compiled (§5: the
    sizes a card of gpu_bytes holds, rmsnorm.fit_card)."""
    c = rmsnorm.PROFILES[profile]
    rows = [_row("02", f"norms {c['rows']} x {H} fwd+bwd", norm_peak_bytes(c["rows"], H)) for H in c["hidden"]]
    T = lambda s: get_config(s).context_length  # noqa: E731  (bench_model uses the model's context)
    rows += [
        _row("02", f"model {s} fwd+bwd, batch {c['batch']}", retained_graph_bytes(s, c["batch"], T(s)))
        for s in c["compile_model_sizes"]
    ]
    rows += [  # §5 adds a training step: AdamW's state on the shared weights, beside a forward's graph and gradients
        _row("02", f"compile {s}: fwd+bwd+opt, batch {c['batch']}", compile_loop_bytes(s, c["batch"], T(s)))
        for s in rmsnorm.fit_card(c, gpu_bytes)["compile_model_sizes"]
    ]
    return rows


# ---- notebook 03: message buffers per rank; gloo+cuda puts every rank on the one GPU ----


def plan_03(
    profile: str = "gpu", gpus: int = 1, edition: str = DEFAULT_EDITION, gpu_bytes: float = H100_BYTES
) -> list[dict]:
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


def sweep_buckets_mb(profile: str = "gpu") -> list:
    """The bucket sizes of nb04's sweep: the profile's extra sizes and the seed's."""
    return sorted(ddp.PROFILES[profile]["extra_buckets_mb"] + SEED_BUCKETS_MB)


def ddp_variants(size, profile: str = "gpu", edition: str = DEFAULT_EDITION) -> int:
    """How many variants nb04's speed launch for `size` holds at once (the sweep model adds the bucket sweep)."""
    return ddp.speed_variants(config_04(profile, edition), size)


def plan_04(
    profile: str = "gpu", gpus: int = 1, edition: str = DEFAULT_EDITION, gpu_bytes: float = H100_BYTES, world: int = 2
) -> list[dict]:
    """Notebook 04: one speed launch per size of `edition` that the card holds (config_04; 2 ranks, each with its half
    of the batch; on one GPU both share it)."""
    c = config_04(profile, edition, gpus, gpu_bytes)

    def launch(s) -> float:
        return ddp_rank_bytes(s, ddp_variants(s, profile, edition), c["batch"] // world, c["context"])

    shared = ranks_per_gpu(world, gpus)
    return [
        _row("04", f"speed {s}, {ddp_variants(s, profile, edition)} variants", launch(s), shared) for s in c["sizes"]
    ]


# ---- notebook 05: each kind's model states (sharded or not), 2 ranks on one GPU ----


def plan_05(
    profile: str = "gpu", gpus: int = 1, edition: str = DEFAULT_EDITION, gpu_bytes: float = H100_BYTES, world: int = 2
) -> list[dict]:
    """Notebook 05: the equivalence check (kinds one after another, the unsharded gradients kept), the memory runs
    (kinds one after another: the largest counts) and each speed launch (its kinds side by side), at the models its
    setting picks for `edition` on GPUs of gpu_bytes (config_05)."""
    shared = ranks_per_gpu(world, gpus)
    c = config_05(profile, edition, gpus, gpu_bytes)
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


def plan_06(
    profile: str = "gpu", gpus: int = 1, edition: str = DEFAULT_EDITION, gpu_bytes: float = H100_BYTES
) -> list[dict]:
    """Notebook 06: §1's naive grid (fp32, not causal) and §4's benchmark (causal, each dtype), where an OOM is
    recorded as a row (by design); the compile comparison, §6's models (the sizes a card of gpu_bytes holds:
    attention.fit_card) and the leaderboard, where it is not."""
    c = attention.fit_card(attention.PROFILES[profile], gpu_bytes)
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


def plan_07(
    profile: str = "gpu", gpus: int = 1, edition: str = DEFAULT_EDITION, gpu_bytes: float = H100_BYTES, world: int = 2
) -> list[dict]:
    """Notebook 07 with the models it builds (config_07; 2026's: no EDITION knob): §2-§4's measure launch (2 ranks),
    the checkpoint sweep (one process, no checkpointing is its largest, on a model a card of gpu_bytes holds), the
    ring's messages (NCCL with a GPU per rank; otherwise gloo on the CPU, none on the GPU)."""
    c = config_07(profile, built_edition("07", edition), gpu_bytes)
    launch = fsdp_launch_bytes(c["model"], c["batch"] // world, c["context"], world)
    sweep = retained_graph_bytes(c["ckpt_model"], c["ckpt_batch"], c["ckpt_context"])
    rows = [
        _row("07", f"measure {c['model']}: {', '.join(MEASURE_KINDS)}", launch, ranks_per_gpu(world, gpus)),
        _row("07", f"checkpoint sweep {c['ckpt_model']}, {c['ckpt_batch']} x {c['ckpt_context']}", sweep),
    ]
    if gpus >= max(c["ring_worlds"]):
        rows.append(_row("07", "ring all-reduce", COLLECTIVE_BUFFERS * 4 * max(c["ring_sizes"])))
    return rows


# ---- notebook 08: every rank's one-process reference beside its share of the model ----


def plan_08(
    profile: str = "gpu", gpus: int = 1, edition: str = DEFAULT_EDITION, gpu_bytes: float = H100_BYTES
) -> list[dict]:
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


def gpu_plan(
    gpu_bytes: float = H100_BYTES, profile: str = "gpu", gpus: int = 1, edition: str = DEFAULT_EDITION
) -> pd.DataFrame:
    """Every notebook's runs at `edition` on `gpus` GPUs of gpu_bytes each: peak per GPU, whether it fits, how much
    more it needs (multi-rank runs share a GPU only when there are fewer GPUs than ranks)."""
    if not 0 < gpu_bytes < float("inf"):
        raise ValueError(f"gpu_bytes must be the card's memory in bytes (e.g. 80e9); got {gpu_bytes}")
    where = dict(profile=profile, gpus=gpus, edition=check_edition(edition), gpu_bytes=gpu_bytes)
    plan = pd.DataFrame([row for fn in PLANS.values() for row in fn(**where)])
    by_design = plan.pop("oom_by_design")
    plan["budget_GB"] = gpu_bytes / GB
    plan["fits"] = plan["peak_per_gpu_GB"] <= plan["budget_GB"]
    plan["needs"] = [
        ("" if ok else f"+{peak - budget:.1f} GB")
        for peak, budget, ok in zip(plan["peak_per_gpu_GB"], plan["budget_GB"], plan["fits"], strict=True)
    ]
    plan["oom_by_design"] = by_design  # an OOM there is recorded as a row, not a failure (06's naive runs, 01's)
    return plan


def fits_here(notebook: str, gpu_bytes: float, gpus: int | None = None, edition: str = DEFAULT_EDITION) -> pd.DataFrame:
    """One notebook's gpu runs at `edition`, judged against the memory present (e.g. torch.cuda.mem_get_info()[1]) on
    this machine's GPUs (gpus: default those CUDA sees)."""
    if notebook not in PLANS:
        raise ValueError(f"unknown notebook {notebook!r}; expected one of {', '.join(PLANS)}")
    plan = gpu_plan(gpu_bytes, gpus=gpus_here() if gpus is None else gpus, edition=edition)
    return plan[plan["notebook"] == notebook].reset_index(drop=True)


def fit_summary(notebook: str, gpu_bytes: float, gpus: int | None = None, edition: str = DEFAULT_EDITION) -> str:
    """A line per run of `notebook` (its models for `edition`) that will not fit gpu_bytes (with what it needs): a
    warning, or for a run whose OOM the notebook records as a row, an expected OOM; or one line saying all fit."""
    plan = fits_here(notebook, gpu_bytes, gpus, edition)
    built = built_edition(notebook, edition)
    models = f" ({built} models)" if built else ""
    short = plan[~plan["fits"]]
    if short.empty:
        return (
            f"gpu plan: all {len(plan)} runs of notebook {notebook}{models} fit this GPU's {gpu_bytes / GB:.1f} GB "
            f"(largest {plan['peak_per_gpu_GB'].max():.1f} GB, with a {ALLOCATOR_MARGIN:.0%} margin)"
        )
    return "\n".join(
        f"expected OOM (recorded as a row, by design): {r.run}{models} needs about {r.peak_per_gpu_GB:.1f} GB "
        f"({r.needs} over this GPU's {r.budget_GB:.1f} GB)"
        if r.oom_by_design
        else f"warning: {r.run}{models} needs about {r.peak_per_gpu_GB:.1f} GB per GPU ({r.needs} over this GPU's "
        f"{r.budget_GB:.1f} GB): expect an OOM there"
        for r in short.itertuples()
    )
