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
    "breakdown_section",
    "cpu_bf16_line",
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

    @classmethod
    def resolve(cls, profile: str = "auto", budget: str | float = "auto") -> Setup:
        """The notebook's parameters made concrete: the profile ("auto": gpu when CUDA is present), this device, the
        budget (on cpu it calibrates this machine, about a second), and the seed 0 everywhere."""
        profile = env.resolve_profile(profile)
        device = launch.device()
        env.seed_everything(0)
        c = XB.PROFILES[profile]
        return cls(
            profile=profile,
            device=device,
            device_name=env.machine_facts()["device"],
            budget=Budget.resolve(budget, "01", profile),
            sizes=sizes_for(profile),  # the '/cpu' presets on cpu, the five reference sizes on gpu
            batch=c["batch"],
            context=c["context"],
            warmup=c["warmup"],
            steps=c["steps"],
            cold_steps=c["cold_steps"],
            profile_size=c["profile_size"],
            prof_steps=PROF_STEPS[profile],
            autocast=[torch.bfloat16, torch.float16] if device.type == "cuda" else [torch.bfloat16],
        )

    @property
    def where(self) -> str:
        """One line naming the machine, the profile and the batch: the caption of every table here."""
        return f"{self.device_name} · {self.profile} profile · batch {self.batch} × context {self.context}"

    def provenance(self, **extra) -> dict:
        """save_results' keyword arguments for a run at this batch and context."""
        return dict(profile=self.profile, batch=self.batch, context=self.context, **extra)


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
    runs = [dict(warmup=0, steps=S.cold_steps), dict(warmup=S.warmup, steps=S.steps)]
    plan = XB.plan_timing(
        S.budget,
        S.sizes,
        S.batch,
        S.context,
        S.warmup,
        S.steps,
        S.cold_steps,
        run=lambda size: XB.time_sizes([size], S.batch, S.context, runs, S.device),
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
        XB.profile_rows(tables, shares), "01_profile", profile=S.profile, size=S.profile_size, steps=S.prof_steps
    )
    return ProfileResult(
        table=shares.style.format("{:.1%}"),
        notes=XB.profile_summary(tables, shares).splitlines(),
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
    softmax = profiling.op_share(stacks, "aten::softmax", "aten::_softmax", "SoftmaxBackward0")
    assert 0 < rms < 1 and 0 < softmax < 1, (rms, softmax)
    parts = {"RMSNorm": (rms, n_norms), "softmax": (softmax, n_softmax)}
    saved = save_results(XB.flame_rows(stacks, parts), "01_flame", profile=S.profile, size=S.profile_size)
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


# --- 4 · mixed precision ------------------------------------------------------------------------------


def cpu_bf16_line(S: Setup) -> str:
    """Which case this machine is for bf16: on a GPU its datasheet's bf16 peak over fp32's; on a CPU its bf16
    instructions (from /proc/cpuinfo's flags) and the calibration's own bf16 matmuls."""
    if S.device.type == "cuda":
        bf16, fp32 = formulas.peak_flops(S.device_name, "bf16"), formulas.peak_flops(S.device_name, "fp32")
        if not bf16:
            return f"no datasheet peak known for {S.device_name}"
        return f"dense peak on {S.device_name}: bf16 is {bf16 / fp32:.0f}x the fp32 peak"
    units = sorted({"avx512_bf16", "amx_bf16"} & env.cpu_flags())
    cal = S.budget.calibration
    return (
        f"this CPU's bf16 instructions: {', '.join(units) or 'none (no avx512_bf16, no amx_bf16 in /proc/cpuinfo)'}; "
        f"{cal.bf16_sentence() if cal else 'not calibrated (no budget)'}"
    )


def precision_section(S: Setup, times: pd.DataFrame, m: Profiled) -> Result:
    """Section 4: per size ONE model whose forward+backward runs in fp32 and under each autocast dtype in one
    interleaved loop, the sizes the budget fits (section 1's fp32 times and the calibration's bf16 rate estimate
    them); the profiled model waits on the CPU meanwhile. Saved as 01_mixed_precision and, every pair of precisions
    per size paired per round, as 01_precision_ratios. The notes give each speed-up with its interval, a winner only
    outside the noise."""
    fp32_s = XB.warm_cold(times, S.warmup)[1].xs("both", level="pass")["median_s"].to_dict()  # section 1
    with XB.offloaded(m.lm, m.opt):  # each size gets the whole card
        plan = XB.plan_precision(
            S.budget,
            S.sizes,
            S.batch,
            S.context,
            S.warmup,
            S.steps,
            fp32_s,
            run=lambda size: XB.compare_precisions([size], S.batch, S.context, S.autocast, S.warmup, S.steps, S.device),
        )
    amp, comps = XB.planned_precisions(plan, S.autocast, S.warmup, S.device)  # left-out sizes: NOT_TIMED
    amp["profile"] = S.profile
    saved = save_results(amp, "01_mixed_precision", **S.provenance())
    cal = S.budget.calibration
    save_results(
        XB.precision_ratios(comps),
        "01_precision_ratios",
        **S.provenance(bf16_slowdown=cal.bf16_slowdown if cal else None),
    )  # for the answers page
    table = XB.speedup_table(amp, S.sizes)
    speedups = table[[c for c in table.columns if c.startswith("speed")]]
    notes = [f"{cal.bf16_sentence()}.\n{plan.note}"] if plan.dropped else []  # why: bf16's rate here
    notes += [
        XB.same_quantity_note(times, amp, S.warmup),
        f"forward+backward median (ms), fp32 and autocast interleaved, {S.where} (—: not timed, budget, or OOM)",
        XB.speedup_lines(comps, skipped=plan.dropped),  # paired per round, 95% interval
        cpu_bf16_line(S),
    ]
    styled = table.style.format(
        {c: (lambda v: f"{v * 1e3:.1f}") for c in table.columns if not c.startswith("speed")}
        | {c: "{:.2f}x" for c in speedups.columns},
        na_rep="—",
    )
    return Result(table=styled, notes=notes, saved=saved, values={"speedups": speedups.stack().tolist()})


def dtype_section(S: Setup) -> Result:
    """Section 4: the dtype autocast gives each tensor of the handout's toy model (a fresh one per autocast dtype),
    read by forward hooks and from the tensors; saved as 01_autocast_dtypes."""
    dtypes = XB.autocast_dtype_table(S.autocast, S.device)
    saved = save_results(dtypes.rename_axis("tensor").reset_index(), "01_autocast_dtypes", profile=S.profile)
    kept = dtypes.loc[["parameters", "gradients"]]
    return Result(
        table=dtypes, saved=saved, values={"fp32_parameters_and_grads": bool((kept == "torch.float32").all().all())}
    )


def norm_precision_section(S: Setup) -> Result:
    """Section 4: the largest relative error of mean(x²) over 4096 values in fp32, bf16 and fp16 (against fp64):
    why norms stay in fp32; saved as 01_norm_precision."""
    err = XB.mean_square_errors(S.device)
    saved = save_results(
        [{"dtype": k, "max_rel_error": v} for k, v in err.items()], "01_norm_precision", profile=S.profile
    )
    line = "largest relative error of mean(x²) over 4096 values: " + ", ".join(f"{k} {v:.1e}" for k, v in err.items())
    return Result(notes=[line], saved=saved, values=err)


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
