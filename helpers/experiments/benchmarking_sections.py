"""Notebook 01, one function per section: each plans its budget, runs, checks its physical bounds, saves with
provenance and returns a helpers.section.Result (notes made from the same values as its table), so a notebook cell
is that call, the display and the asserts of the section's claim. The measurements themselves are
helpers.experiments.benchmarking's (re-exported there); this module only puts each section together.

    S = Setup.resolve("auto", "auto")       # profile, device, budget, sizes, batch x context, steps (PROFILES)
    timing = time_section(S)                # 01_timing: one row per size, pass and warm-up; .times the frame
    M = profiled_model(S)                   # the profiled size, its AdamW, one batch: sections 2, 3 and 5
    prof = profile_section(S, M)            # 01_profile: op tables of forward, forward+backward, full step
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import torch

from helpers import env, formulas, launch, profiling, results
from helpers.budget import Budget
from helpers.experiments import benchmarking as XB
from helpers.experiments.benchmarking_sections_memory import (
    breakdown_section,
    largest_section,
    peaks_section,
    residual_section,
    seed_peaks,
    timeline_section,
)
from helpers.experiments.benchmarking_sections_precision import (
    bf16_line,
    dtype_section,
    norm_precision_section,
    precision_section,
)
from helpers.experiments.common import train_step
from helpers.model import build_model, get_config, random_batch, sizes_for
from helpers.results import ROOT, save_results
from helpers.section import Result

__all__ = [
    "FLOP_TOL",
    "PROF_STEPS",
    "SEED",
    "SEED_H100",
    "Profiled",
    "ProfileResult",
    "Setup",
    "TimingResult",
    "attention_section",
    "budget_section",
    "breakdown_section",
    "bf16_line",
    "dtype_section",
    "flame_section",
    "flop_count_section",
    "flops_section",
    "largest_section",
    "norm_precision_section",
    "peaks_section",
    "precision_section",
    "profile_section",
    "profiled_model",
    "residual_section",
    "seed_matmul_shares",
    "seed_peaks",
    "time_section",
    "timeline_section",
]

SEED, SEED_H100 = XB.SEED, XB.SEED_H100
PROF_STEPS = {"cpu": 2, "gpu": 5}  # section 2's profiled steps per run
FLOP_TOL = 0.01  # the closed-form training FLOPs against FlopCounterMode (they agree exactly for this model)


@dataclass
class Setup:
    """What every section of notebook 01 runs at: the profile and device, the time budget, the sizes, batch x
    context, warm-up and timed steps (benchmarking.PROFILES), the profiled size and the autocast dtypes."""

    profile: str
    device: torch.device
    device_name: str
    budget: Budget
    sizes: list
    batch: int
    context: int
    warmup: int
    steps: int
    cold_steps: int  # the no-warm-up runs' steps
    profile_size: str  # the size sections 2, 3 and 5 profile (the seed profiled xl)
    prof_steps: int  # profiled steps per run
    autocast: list = field(default_factory=list)
    edition: str = "2024"  # whose model, sizes, batch and context (benchmarking.EDITIONS; resolve's default: 2026)
    kinds: tuple = XB.PASSES  # section 1's passes ("step" where the edition times the optimizer step too)
    memory_size: str | None = None  # section 5's model when the edition profiles one size over contexts
    memory_contexts: tuple = ()
    left_out: list = field(default_factory=list)  # what the card present could not hold, as notes (profiled_on)

    @classmethod
    def resolve(cls, profile: str = "auto", budget: str | float = "auto", edition: str = "2026") -> Setup:
        """The notebook's parameters made concrete: the profile ("auto": gpu when CUDA is present), this device, the
        budget (on cpu it calibrates this machine, about a second), the edition's model, sizes, batch and context
        (benchmarking.EDITIONS), the profiled size this GPU holds (EditionPlan.profiled_on: the edition's, or a smaller
        one where its step does not fit the card) and the seed 0 everywhere."""
        edition = str(edition)
        if edition not in XB.EDITIONS:
            raise ValueError(f"EDITION = {edition!r}: the course's editions here are {', '.join(XB.EDITIONS)}")
        profile = env.resolve_profile(profile)
        device = launch.device()
        env.seed_everything(0)
        c, plan = XB.PROFILES[profile], XB.EDITIONS[edition]
        e = plan.for_profile(profile)
        profile_size, left_out = plan.profiled_on(profile, env.card_bytes())
        return cls(
            profile=profile,
            device=device,
            device_name=env.machine_facts()["device"],
            budget=Budget.resolve(budget, "01", profile),
            sizes=sizes_for(profile, edition),  # the '/cpu' presets on cpu, the edition's Table 1 on gpu
            batch=e["batch"],
            context=e["context"],
            warmup=c["warmup"],
            steps=c["steps"],
            cold_steps=c["cold_steps"],
            profile_size=profile_size,
            prof_steps=PROF_STEPS[profile],
            autocast=[torch.bfloat16, torch.float16] if device.type == "cuda" else [torch.bfloat16],
            edition=edition,
            kinds=plan.kinds,
            memory_size=e["memory_size"],
            memory_contexts=e["memory_contexts"],
            left_out=left_out,
        )

    @property
    def arch(self) -> str:
        """The edition's architecture (model.ARCHS): "gpt" (2024) or "basics" (2025, 2026)."""
        return get_config(self.sizes[0]).arch

    @property
    def where(self) -> str:
        """One line naming the machine, the profile, the edition's model and the batch: every table's caption."""
        return (
            f"{self.device_name} · {self.profile} profile · {self.edition} model ({self.arch}) · batch {self.batch} × "
            f"context {self.context}"
        )

    def provenance(self, **extra) -> dict:
        """save_results' keyword arguments for a run at this batch and context of this edition's model."""
        return dict(profile=self.profile, batch=self.batch, context=self.context, **self.model_provenance(), **extra)

    def model_provenance(self) -> dict:
        """The edition and architecture every result measured on notebook 01's model carries (the answers page says
        which edition's model an answer ran)."""
        return dict(edition=self.edition, arch=self.arch)


@dataclass
class Profiled:
    """The model sections 2, 3 and 5 profile: the profiled size, its AdamW and one batch."""

    lm: torch.nn.Module
    opt: torch.optim.Optimizer
    x: torch.Tensor  # (B, T) token ids
    y: torch.Tensor  # (B, T) targets


def profiled_model(S: Setup) -> Profiled:
    """A fresh model of S.profile_size on S.device, its AdamW and one random batch of S.batch x S.context."""
    lm = build_model(S.profile_size, device=S.device)
    return Profiled(lm, torch.optim.AdamW(lm.parameters()), *random_batch(lm.cfg, S.batch, S.context, device=S.device))


# --- 1 · timing ------------------------------------------------------------------------------------


@dataclass
class TimingResult(Result):
    """Section 1's Result, with every timed row (`times`), which sections 4 and 6 read."""

    times: pd.DataFrame | None = None


def time_section(S: Setup) -> TimingResult:
    """Section 1: per size a cold run (a fresh model per pass, no warm-up) and a warm one (the three passes
    interleaved on one model), the sizes the budget fits (the smallest always); saved as 01_timing. Asserts forward
    <= forward+backward on paired samples; values["forward_vs_both_low"]: the largest lower bound of forward's time
    over forward+backward's (paired per round, 95%), which is not above 1."""
    runs = [dict(warmup=0, steps=S.cold_steps, kinds=S.kinds), dict(warmup=S.warmup, steps=S.steps, kinds=S.kinds)]
    plan = XB.plan_timing(
        S.budget,
        S.sizes,
        S.batch,
        S.context,
        S.warmup,
        S.steps,
        S.cold_steps,
        run=lambda size: XB.time_sizes([size], S.batch, S.context, runs, S.device),
        kinds=S.kinds,
    )
    times = pd.concat(plan.results, ignore_index=True)
    times["profile"] = S.profile
    saved = save_results(times, "01_timing", **S.provenance())
    checked = XB.check_forward_le_both(times, S.warmup)  # asserts it
    table = times.pivot_table(index=["size", "pass"], columns="warm-up", values=["mean_s", "std_s"], sort=False)
    fwd = XB.warm_cold(times, S.warmup)[1].xs("forward", level="pass")
    return TimingResult(
        table=(table * 1e3).round(2).rename(columns={"mean_s": "mean ms", "std_s": "std ms"}),
        notes=[checked, S.where, plan.note or f"every size timed ({S.budget.summary()})"],
        saved=saved,
        values={"forward_vs_both_low": float(fwd["ratio_low_vs_both"].max())},
        times=times,
    )


# --- 2, 3 · profiler tables and stacks ------------------------------------------------------------


@dataclass
class ProfileResult(Result):
    """Section 2's Result, with the profiles (`profs`) and their op tables (`tables`) per profiled step."""

    profs: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)


def profile_section(S: Setup, m: Profiled) -> ProfileResult:
    """Section 2: torch.profiler over S.prof_steps steps (after one warm-up) of the forward, forward+backward and the
    full step with AdamW; op tables (top 8 by self time) and each step's share per op class; saved as 01_profile.
    values["share_sum_error"]: how far the classes' shares of a step are from summing to 1."""
    runs = {
        "forward": lambda: XB.forward_step(m.lm, m.x),
        "forward+backward": lambda: train_step(m.lm, m.opt, m.x, m.y, optimizer_step=False),
        "full step": lambda: train_step(m.lm, m.opt, m.x, m.y),
    }
    profs = {
        name: profiling.run_profiler(fn, steps=S.prof_steps, warmup=1, model=m.lm, device=S.device)
        for name, fn in runs.items()
    }
    tables = {name: profiling.op_table(p, S.prof_steps, top=8) for name, p in profs.items()}
    shares = XB.class_share_table(profs)  # rows: forward, forward+backward, full step
    shares.index.name = f"{S.profile_size} ({S.device_name})"
    error = float((shares.sum(axis=1) - 1).abs().max())
    assert error < 1e-9, f"the op classes' shares sum to 1 ± {error:.2g}"
    saved = save_results(
        XB.profile_rows(tables, shares), "01_profile", **S.provenance(size=S.profile_size, steps=S.prof_steps)
    )
    return ProfileResult(
        table=shares.style.format("{:.1%}"),
        notes=S.left_out + XB.profile_summary(tables, shares).splitlines(),
        saved=saved,
        values={"share_sum_error": error, "matmul_share": shares["matmul"].to_dict()},
        profs=profs,
        tables=tables,
    )


def seed_matmul_shares():
    """The seed's aten::mm shares on one H100 (xl), cited beside section 2's table."""
    ref = pd.Series(
        {"forward+backward": SEED_H100["mm share, fwd+bwd"], "full step": SEED_H100["mm share, full step"]},
        name=f"seed H100 xl, aten::mm share ({SEED})",
    )
    return ref.to_frame().style.format("{:.0%}")


def flame_section(S: Setup, prof: ProfileResult, m: Profiled) -> Result:
    """Section 3: the full step's stacks (module → … → op), written as collapsed stacks for speedscope, drawn as a
    flame graph; RMSNorm's and softmax's shares (forward and backward) beside the seed's; saved as 01_flame."""
    stacks = profiling.module_stacks(prof.profs["full step"])
    collapsed = profiling.write_collapsed(stacks, results.DATA_DIR / "local" / f"01_flame_{S.profile}.collapsed")
    n_norms, n_softmax = 2 * m.lm.cfg.n_layers + 1, m.lm.cfg.n_layers
    rms = profiling.module_share(stacks, "RMSNormTorch")
    softmax = profiling.op_share(stacks, "aten::softmax", "aten::_softmax", "SoftmaxBackward0") + (
        profiling.module_share(stacks, "Softmax")  # the staff's exp / sum ("basics"), helpers.model.Softmax
    )
    assert 0 < rms < 1 and 0 < softmax < 1, (rms, softmax)
    parts = {"RMSNorm": (rms, n_norms), "softmax": (softmax, n_softmax)}
    saved = save_results(XB.flame_rows(stacks, parts), "01_flame", **S.provenance(size=S.profile_size))
    ax = profiling.plot_flame(stacks, title=f"full step, {S.profile_size} · {S.where}")
    ax.figure.tight_layout()
    notes = [
        f"collapsed stacks (open in speedscope.app or flamegraph.pl): "
        f"{collapsed.relative_to(ROOT) if collapsed.is_relative_to(ROOT) else collapsed}",
        f"RMSNorm (forward and backward, {n_norms} layers): {rms:.2%} of the step, {rms / n_norms:.3%} per layer; "
        f"seed on H100 (xl): {SEED_H100['RMSNorm share']:.2%} ({SEED})",
        f"softmax (forward and backward, {n_softmax} calls): {softmax:.2%} of the step, "
        f"{softmax / n_softmax:.3%} per call; seed on H100 (xl): {SEED_H100['softmax share']:.2%} ({SEED})",
    ]
    return Result(
        table=XB.stage_shares(stacks).to_frame().style.format("{:.1%}"),
        figure=ax.figure,
        notes=notes,
        saved=saved,
        values={"rmsnorm_share": rms, "softmax_share": softmax},
    )


def attention_section(S: Setup, m: Profiled) -> Result:
    """Section 3: QKᵀ, the masked scores' softmax and PV of one attention forward at the profiled model's shapes,
    each timed alone, interleaved (benchmarking.attention_parts); saved as 01_attention_parts. values: softmax's
    time over the two matmuls' (median of ratios paired per round) and its FLOPs over theirs."""
    parts = XB.attention_parts(m.lm.cfg, S.batch, S.context, S.device, profile=S.profile, **S.model_provenance())
    fmt = {"median_s": "{:.3g}", "p25_s": "{:.3g}", "p75_s": "{:.3g}", "GFLOP/s": "{:.3g}"}
    return Result(
        table=parts.table.style.format(fmt),
        notes=[parts.summary()],
        saved=parts.saved,
        values={"time_ratio": parts.ratio.median, "flop_ratio": parts.flop_ratio},
    )


def budget_section(S: Setup) -> Result:
    """What the time budget left out of this run (cpu profile), each with the command that runs it."""
    return Result(notes=[S.budget.summary()] + [f"- {plan.note}" for plan in S.budget.plans if plan.note])


# --- 6 · FLOPs and utilisation --------------------------------------------------------------------


def flop_count_section(S: Setup) -> Result:
    """Section 6: the closed-form training FLOPs (formulas.train_flops) of the smallest size against what
    FlopCounterMode counts over one forward and backward; values["error"] (relative) against values["tolerance"]."""
    cfg = get_config(S.sizes[0])
    lm = build_model(cfg, device=S.device)
    x, y = random_batch(cfg, S.batch, S.context, device=S.device)
    counted = profiling.counted_flops(XB.pass_fn(lm, x, y, "both"))  # loss, then backward
    formula = formulas.train_flops(cfg, S.batch, S.context)
    error = abs(counted - formula) / counted
    note = (
        f"{S.sizes[0]}, batch {S.batch} × {S.context}: formula {formula:.4g} vs FlopCounterMode {counted:.4g} FLOPs, "
        f"error {error:.2%} (tolerance {FLOP_TOL:.0%})"
    )
    return Result(notes=[note], values={"error": error, "tolerance": FLOP_TOL})


def flops_section(S: Setup, times: pd.DataFrame) -> Result:
    """Section 6: per size the training FLOPs, the FLOP/s section 1's warm forward+backward median reaches and its
    MFU against the device's datasheet peak (fp32, or TF32 when switched on; nan where no peak is known); saved as
    01_flops. values["max_mfu"]: the largest MFU (nan when none is defined)."""
    precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    both = XB.warm_cold(times, S.warmup)[1].xs("both", level="pass")["median_s"]  # warm fwd+bwd, section 1
    flops = XB.flops_table({s: both.get(s, math.nan) for s in S.sizes}, S.batch, S.context, S.device_name, precision)
    saved = save_results(
        flops.reset_index().assign(device=S.device_name, profile=S.profile), "01_flops", **S.provenance()
    )
    note = f"{S.where}, section 1's warm forward+backward medians: " + XB.flops_summary(flops, S.device_name, precision)
    return Result(
        table=flops.style.format(XB.FLOPS_FORMAT, na_rep="n/a"),
        notes=[note],
        saved=saved,
        values={"max_mfu": float(flops["MFU"].max())},
    )
