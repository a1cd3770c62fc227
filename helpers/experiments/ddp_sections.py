"""Notebook 04's sections, one call each: plan within the budget, run, save with provenance, and return a Result
(helpers.section) whose notes are made from the same numbers as its table. The workers, tables and plots they call
live in ddp_equivalence, ddp_speed, ddp_overlap and ddp_buckets.

    s = setting("cpu", "auto")                       # profile, 2 ranks' backend and device, config, budget, caption
    checks = correctness_section(s)                  # §1: every wrapper against one process
    speed = speed_section(s)                         # §2: one interleaved launch per model size (raw, speed)
    overlap = overlap_section(s, speed)              # §3: share of communication inside backward, and the timeline
    bucket = bucket_section(s, speed, alpha_beta_section(s).values["fit"])   # §4: the model against the sweep
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pandas as pd
import torch

from helpers import env, formulas, results
from helpers.budget import Budget
from helpers.ddp import MB
from helpers.experiments.common import RankSetting, name_models
from helpers.experiments.ddp_buckets import (
    BucketModel,
    alpha_beta,
    bucket_sweep,
    describe_bucket_model,
    plot_bucket_sweep,
    sweep_display,
    sweep_optimum_text,
)
from helpers.experiments.ddp_equivalence import assert_equivalent, check_equivalence, toy_variants, transformer_variants
from helpers.experiments.ddp_overlap import overlap_table, plot_timelines, shown_variants
from helpers.experiments.ddp_speed import (
    SPEED_VARIANTS,
    backward_lines,
    ratio_rows,
    speed_lines,
    speed_pivot,
    speed_table,
    sweep_variants,
)
from helpers.experiments.gpu_plans_bytes import ddp_rank_bytes, keep_fitting, ranks_per_gpu
from helpers.model import count_parameters, for_edition
from helpers.section import Result

SEED_BUCKETS_MB = [1, 5, 10, 25, 50, 100, 500]  # the seed's bucket-size sweep


PROFILES = {  # notebook 04 per profile: speed-table models, the sweep's model, batch (global) and context, steps
    "cpu": dict(
        sizes=["small/cpu", "medium/cpu", "large/cpu"],
        sweep_model="large/cpu",
        batch=4,  # global: 2 sequences per rank (8 took 53 s of make test's 83 s for the notebook on one AVX2 core)
        context=32,
        warmup=2,  # one untimed round past the first call is enough on a CPU (no JIT, no autotuning)
        steps=10,
        extra_buckets_mb=[0.03125, 0.0625, 0.125, 0.25, 0.5],
    ),
    # the sweep on small: medium's 12 variants side by side (SwiGLU's third matrix, 2025/2026) overflow one H100
    # shared by both ranks
    "gpu": dict(
        sizes=["small", "medium"], sweep_model="small", batch=8, context=128, warmup=3, steps=10, extra_buckets_mb=[]
    ),
}


def plan_speed(
    budget,
    sizes,
    sweep_model: str,
    extra_buckets_mb,
    seed_buckets_mb,
    warmup: int,
    steps: int,
    batch_size: int,
    context_length: int,
    world: int = 2,
) -> tuple[int, list]:
    """Notebook 04's speed runs within the budget: the speed table and the seed's sweep at timing.MIN_PAIRS steps
    (always), then the sweep's extra bucket sizes below the seed's grid (largest first), then more timed steps. A
    variant's step on a rank (one thread each): its share of the batch forward+backward and an all-reduce of the
    gradients. Returns (steps, extra bucket sizes kept); the plans (budget.plans[-2:]) name what was left out."""
    from helpers.timing import MIN_PAIRS

    cal = budget.calibration.per_rank(world) if budget.calibration else None
    base_steps = min(steps, MIN_PAIRS)

    def variant_step(model):
        return cal.step_s(formulas.train_flops(model, batch_size // world, context_length)) + cal.allreduce_time(
            count_parameters(model) * 4
        )

    variants = {
        m: len(SPEED_VARIANTS) + (len(sweep_variants(seed_buckets_mb)) if m == sweep_model else 0) for m in sizes
    }

    def round_s(extra):  # one round of every variant, plus `extra` swept bucket sizes of the sweep model
        return sum(n * variant_step(m) for m, n in variants.items()) + extra * variant_step(sweep_model)

    base = f"the speed table at {base_steps} steps"
    sweep = budget.fit(
        [base] + sorted(extra_buckets_mb, reverse=True),
        lambda item: (warmup + base_steps) * (round_s(0) if item == base else variant_step(sweep_model)),
        what=f"{sweep_model}'s bucket sweep at (MB)",
        keep_first=True,
    )
    extra = sorted(sweep.kept[1:])
    sweep.dropped = [mb for mb in sweep.dropped if mb != base]
    more = budget.fit(
        [f"step {i}" for i in range(base_steps + 1, steps + 1)],
        lambda item: round_s(len(extra)),
        what="the speed table's timed",
    )
    return base_steps + len(more.kept), extra


@dataclass
class Setting(RankSetting):
    """Where notebook 04 runs (RankSetting: profile, ranks' backend and device, config, budget, caption) and where
    §3's Chrome traces go, one folder per model."""

    MODEL_KEYS: ClassVar[tuple[str, ...]] = ("sizes", "sweep_model")

    trace_dir: object = None


def speed_variants(config: dict, size) -> int:
    """How many variants §2's speed launch of `size` holds side by side: SPEED_VARIANTS, and for the sweep model the
    bucket sizes of its sweep beyond them (the profile's extra sizes and the seed's)."""
    if size != config["sweep_model"]:
        return len(SPEED_VARIANTS)
    swept = sweep_variants(sorted(config["extra_buckets_mb"] + SEED_BUCKETS_MB))
    return len(SPEED_VARIANTS) + len([v for v in swept if v not in SPEED_VARIANTS])


def config_for(profile: str, edition: str = "2026", shared: int = 1, gpu_bytes: float | None = None) -> dict:
    """PROFILES[profile] with its sizes as `edition`'s Table 1 names them (model.for_edition). Where `shared` ranks
    share one GPU of gpu_bytes, a size whose speed launch the card cannot hold (gpu_plans_bytes.ddp_rank_bytes per
    rank: the model, a copy per variant, the step in flight) is left out of the speed table, named in
    config["left_out"]; the sweep model always runs (§3 and §4 read it)."""
    config = name_models(PROFILES[profile], Setting.MODEL_KEYS, edition)
    b, T = config["batch"] // 2, config["context"]
    need = {m: ddp_rank_bytes(m, speed_variants(config, m), b, T) for m in config["sizes"]}
    kept, notes = keep_fitting(
        need,
        gpu_bytes,
        lambda m: f"{m}'s speed launch ({speed_variants(config, m)} variants per rank)",
        instead="not timed here",
        ranks_per_gpu=shared,
        always=config["sweep_model"],
    )
    return config if len(kept) == len(need) else {**config, "sizes": kept, "left_out": notes}


def setting(profile: str, budget: str | float = "auto", edition: str = "2026") -> Setting:
    """Notebook 04's setting from its parameters cell (PROFILE, BUDGET, EDITION): 2 ranks, gloo on CPU (on one GPU
    the ranks share it through gloo); on cpu the budget calibrates this machine (about a second); the sizes as
    `edition`'s Table 1 names them, those the GPU holds where the ranks share one (config_for)."""
    from helpers.launch import choose_backend

    profile, machine = env.resolve_profile(profile), env.machine_facts()["device"]
    backend, device = choose_backend(2)
    gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
    where = f"{machine} · {profile} profile · {edition} model · {backend} on {device}, 2 ranks"
    traces = results.DATA_DIR / "local" / results.device_slug(machine) / "04_traces"
    budget = Budget.resolve(budget, "04", profile)
    config = config_for(profile, edition, ranks_per_gpu(2, gpus), env.card_bytes() if gpus else None)
    return Setting(profile, backend, device, config, budget, where, traces)


def correctness_section(s: Setting) -> Result:
    """§1: every wrapper on the toy model (tied, frozen, unused parameters) and on small/cpu against one process on
    the full batch; one row per (model, wrapper), saved as 04_ddp_checks. values: the worst gradient and SGD-weight
    ratios to their bound, and the toy's bucket counts by variant."""
    start = time.perf_counter()
    checks = pd.concat(
        [
            check_equivalence("toy", toy_variants(), backend=s.backend, device=s.device),
            check_equivalence(
                for_edition("small/cpu", s.edition), transformer_variants(), backend=s.backend, device=s.device
            ),
        ],
        ignore_index=True,
    )
    saved = s.save(checks, "04_ddp_checks", device_used=s.device)
    return correctness_result(checks, saved, seconds=time.perf_counter() - start, where=s.where)


def correctness_result(checks: pd.DataFrame, saved=None, *, seconds: float, where: str) -> Result:
    """§1's Result from its checks: the sentence states the worst ratios, and only says 'compute one process's
    gradients' when every row is within its bound (assert_equivalent is the cell's claim)."""
    worst_g, worst_w = float(checks["grad_ratio"].max()), float(checks["weight_ratio"].max())
    try:
        assert_equivalent(checks)
        what = "compute one process's gradients on both ranks"
    except AssertionError:
        what = "were compared with one process; NOT all within bound (rows below)"
    note = (
        f"{len(checks)} (model, wrapper) runs {what} ({seconds:.0f} s); largest |difference| / bound: "
        f"{worst_g:.2g} (gradients), {worst_w:.2g} (SGD weights) · {where}"
    )
    toy = checks[checks["model"] == "toy"].set_index("variant")["buckets"]
    values = {"grad_ratio": worst_g, "weight_ratio": worst_w, "toy_buckets": toy.to_dict()}
    return Result(checks, None, [note], saved, values)


@dataclass(repr=False)  # shown as a Result: notes, table, where it was saved
class SpeedResult(Result):
    """§2's Result, with what later sections read: the per-rank runs by model (raw), one row per (model, variant)
    (speed), the swept bucket sizes and the sweep model."""

    raw: dict = field(default_factory=dict)
    speed: pd.DataFrame | None = None
    buckets_mb: list = field(default_factory=list)
    sweep_model: str = ""


def speed_section(s: Setting) -> SpeedResult:
    """§2: the budget's plan (timed steps, then the sweep's extra bucket sizes), one interleaved launch per model
    size, saved as 04_ddp_speed; the table is ms per step and in finish, per variant and model."""
    c, planned = s.config, len(s.budget.plans)
    steps, extra_mb = plan_speed(
        s.budget,
        c["sizes"],
        c["sweep_model"],
        c["extra_buckets_mb"],
        SEED_BUCKETS_MB,
        c["warmup"],
        c["steps"],
        c["batch"],
        c["context"],
    )
    buckets_mb = sorted(extra_mb + SEED_BUCKETS_MB)
    start = time.perf_counter()
    raw, speed = speed_table(
        c["sizes"],
        sweep_model=c["sweep_model"],
        buckets_mb=buckets_mb,
        steps=steps,
        warmup=c["warmup"],
        batch_size=c["batch"],
        context_length=c["context"],
        backend=s.backend,
        device=s.device,
        trace_dir=s.trace_dir,
    )
    saved = s.save(
        speed,
        "04_ddp_speed",
        device_used=s.device,
        batch=c["batch"],
        context=c["context"],
    )
    notes = [p.note for p in s.budget.plans[planned:] if p.note] + [
        f"{len(speed)} rows in {time.perf_counter() - start:.0f} s, {steps} timed steps per variant",
        f"median ms per step / in finish (global batch {c['batch']} × {c['context']} tokens) · {s.where}",
        *c.get("left_out", []),  # the sizes this GPU could not hold (config_for)
    ]
    table = speed_pivot(speed).round(2)
    return SpeedResult(table, None, notes, saved, {"steps": steps}, raw, speed, buckets_mb, c["sweep_model"])


def ratios_section(s: Setting, sp: SpeedResult) -> Result:
    """§2's comparisons: every pair of variants' step time per model, paired step by step with its 95% interval
    (saved as 04_ddp_ratios, which the answers page reads); the notes name a winner only outside the noise."""
    rows = ratio_rows(sp.raw)
    saved = s.save(rows, "04_ddp_ratios", device_used=s.device)
    return ratios_result(sp, rows, saved)


def ratios_result(sp: SpeedResult, rows: list[dict], saved=None) -> Result:
    """The step-time ratios against naive and against torch DDP (25 MB), per model, and speed_lines' sentences."""
    table = pd.DataFrame(rows)
    if not table.empty:
        keep = (table["field"] == "step") & table["b"].isin(["naive", "torch_ddp 25 MB"]) & (table["a"] != table["b"])
        table = table[keep].set_index(["model", "b", "a"]).sort_index()
    return Result(table, None, speed_lines(sp.speed, sp.raw, list(sp.raw)).splitlines(), saved, {"rows": rows})


def backward_section(sp: SpeedResult) -> Result:
    """Backward's median time (ms) per variant and model, and whether the overlapped variants' backward is
    measurably slower than compute alone (paired per step)."""
    table = sp.speed.pivot_table(index="variant", columns="model", values="backward_s", sort=False) * 1e3
    return Result(table.round(2), None, backward_lines(sp.speed, sp.raw, list(sp.raw)).splitlines())


def overlap_section(s: Setting, sp: SpeedResult) -> Result:
    """§3: per shown variant, the share of communication time inside backward (profiler trace on gloo, launch -> done
    always), saved as 04_ddp_overlap, and the last step's timeline. values["overlap"]: the unformatted table."""
    model = sp.sweep_model
    shown = shown_variants(sp.speed, model)  # naive, per-parameter, a few buckets, 25 MB, torch DDP
    traced = s.backend == "gloo"  # gloo's worker threads record each all-reduce; NCCL's run on the GPU
    overlap = overlap_table(sp.raw[model], shown, traced=traced)
    table = overlap.reset_index()
    saved = s.save(table, "04_ddp_overlap", model=model)
    notes = [f"share of communication time inside backward, {model} · {s.where}"]
    if traced:
        folder = (s.trace_dir / model.replace("/", "_")).relative_to(results.DATA_DIR.parent)
        notes.append(f"Chrome traces, one per variant and rank: {folder}/")
    styled = overlap.style.format({c: "{:.0f}" if c == "buckets" else "{:.0%}" for c in overlap.columns}, na_rep="–")
    fig = plot_timelines(sp.raw[model][0], shown, traced=traced, title=f"{model} · {s.where}")
    return Result(styled, fig, notes, saved, {"overlap": overlap})


def alpha_beta_section(s: Setting) -> Result:
    """§4's α and β for 2 ranks on this backend and device: notebook 03's saved fit, else its grid measured here.
    values: alpha_s, beta_Bps and the fit."""
    start = time.perf_counter()
    ab, source = alpha_beta(s.profile, s.backend, s.device)
    note = (
        f"all-reduce, 2 ranks, {s.backend} on {s.device}: α = {ab.alpha_s * 1e6:.0f} µs, β = {ab.beta_Bps / 1e9:.2f} "
        f"GB/s (median relative error of the fit {ab.median_rel_err:.0%}); from {source} "
        f"({time.perf_counter() - start:.0f} s)"
    )
    return Result(None, None, [note], None, {"alpha_s": ab.alpha_s, "beta_Bps": ab.beta_Bps, "fit": ab})


@dataclass(repr=False)  # shown as a Result: notes, table, where it was saved
class BucketResult(Result):
    """§4's Result, with the measured sweep beside the model (sweep) and the fitted model (fit); plot() draws both."""

    sweep: pd.DataFrame | None = None
    fit: BucketModel | None = None
    buckets_mb: list = field(default_factory=list)
    title: str = ""

    def plot(self):
        """Modelled and measured step time over bucket size (the notebook's headline figure)."""
        return plot_bucket_sweep(self.sweep, self.fit, self.buckets_mb, title=self.title)


def bucket_section(s: Setting, sp: SpeedResult, ab) -> BucketResult:
    """§4: the bucket-size model (this machine's backward time, α, β) beside the measured DDPBucketed sweep, saved as
    04_ddp_bucket_sweep; the notes say where the measured optimum is, where the model's is, and how far apart."""
    model = sp.sweep_model
    sweep, fit = bucket_sweep(sp.speed, model, alpha_s=ab.alpha_s, beta_Bps=ab.beta_Bps)
    saved = s.save(
        sweep,
        "04_ddp_bucket_sweep",
        model=model,
        alpha_s=ab.alpha_s,
        beta_Bps=ab.beta_Bps,
        backward_s=fit.backward_s,
        grad_bytes=fit.grad_bytes,
        n_star=fit.n_star,
    )
    notes = describe_bucket_model(fit, sweep, model, SEED_BUCKETS_MB).splitlines() + sweep_lines(
        sp.raw[model], sweep, fit
    )
    title = f"{model} · {s.where}"
    return BucketResult(sweep_display(sweep, s.where), None, notes, saved, {}, sweep, fit, sp.buckets_mb, title)


def sweep_lines(per_rank, sweep: pd.DataFrame, fit: BucketModel) -> list[str]:
    """The measured optimum against the model's, measured minus predicted, the sweep's spread, backward's slowdown
    under bucketed, and the spread of sizes that build the same single bucket (the noise floor of the sweep)."""
    rel = (sweep["step_s"] - sweep["predicted_s"]) / sweep["predicted_s"]
    lines = [
        f"{sweep_optimum_text(per_rank, sweep)}; model optimum: "
        f"{fit.grad_bytes / fit.n_star / MB:.3g} MiB ({fit.n_star:.1f} buckets). Measured minus predicted step time: "
        f"median {rel.median():+.0%}, from {rel.min():+.0%} to {rel.max():+.0%} over {len(rel)} sizes.",
        f"spread of the measured sweep: {sweep['step_s'].min() * 1e3:.1f} to {sweep['step_s'].max() * 1e3:.1f} ms "
        f"({sweep['step_s'].max() / sweep['step_s'].min() - 1:.0%}); backward under bucketed ran "
        f"{sweep['backward_s'].median() / fit.backward_s:.2f}x as long as alone (median over sizes)",
    ]
    one = sweep[sweep["buckets"] == 1]["step_s"]
    if len(one) > 1:
        lines.append(
            f"the {len(one)} sizes that all build one bucket (the same configuration) spread "
            f"{one.max() / one.min() - 1:.0%}: differences in the sweep smaller than that are noise on this machine"
        )
    return lines


def optimum_is_minimal(fit: BucketModel, rtol: float = 1e-9) -> bool:
    """The model's n* minimizes o(n) over a dense grid from 1 to 10·n* (relative tolerance rtol)."""
    grid = np.linspace(1, 10 * fit.n_star, 200001)
    return bool(fit.overhead(fit.n_star) <= fit.overhead(grid).min() * (1 + rtol))
