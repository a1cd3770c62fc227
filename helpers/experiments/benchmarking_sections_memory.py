"""Notebook 01 §5, one function per cell: a step's memory timeline, the peaks per size and precision, the residual
stream, the largest tensors at the peak and the breakdown of what is live there; each returns a
helpers.section.Result (benchmarking_sections has the other sections and the Setup they take).

    tl = timeline_section(S, M)             # forward-only vs full step, live bytes per event; tl.traces
    breakdown_section(S, M, tl.traces["full step"])    # analytic vs measured bytes live at the peak
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from helpers import formulas, memory, results
from helpers.experiments import benchmarking as XB
from helpers.experiments.benchmarking_common import SEED, SEED_H100, MiB, forward_step, warm_cold
from helpers.experiments.common import train_step
from helpers.model import MODEL_SIZES, get_config
from helpers.results import device_slug, save_results
from helpers.section import Result

PEAK_TOL = 0.05  # analytic peak vs measured peak (the start-of-backward model; exact when activations dominate)


@dataclass
class TimelineResult(Result):
    """The timeline's Result, with both traces (`traces`: "forward" and "full step"), which later cells read."""

    traces: dict = field(default_factory=dict)


def timeline_section(S, m) -> TimelineResult:
    """Live tensor bytes per event (op or free) of a forward-only pass (no_grad) and of a steady-state full step
    (AdamW's state already there, gradients set to None), both counted by memory.track; on a GPU an allocator
    snapshot of the step too. values: both peaks and what was live before the step, in MiB."""
    traces = XB.step_traces(m.lm, m.opt, m.x, m.y, device=S.device)
    fwd, step = traces["forward"], traces["full step"]
    fig = XB.plot_timelines({"forward only (no_grad)": fwd, "full step": step}, title=f"{S.profile_size} · {S.where}")
    notes = [
        f"forward only peaks at {fwd.peak_bytes / MiB:.1f} MiB, the full step at {step.peak_bytes / MiB:.1f} MiB "
        f"({step.peak_bytes / fwd.peak_bytes:.1f}x); {step.baseline_bytes / MiB:.1f} MiB is there before the step "
        "(parameters, buffers, AdamW state, batch)"
    ]
    if S.device.type == "cuda":
        snap = results.DATA_DIR / "local" / device_slug(S.device_name) / "01_memory_snapshot.pickle"
        snap.parent.mkdir(parents=True, exist_ok=True)
        memory.cuda_snapshot(lambda: train_step(m.lm, m.opt, m.x, m.y), snap)
        notes.append(f"allocator snapshot saved: {snap} (drag it onto https://pytorch.org/memory_viz)")
    values = {
        "forward_peak_MiB": fwd.peak_bytes / MiB,
        "step_peak_MiB": step.peak_bytes / MiB,
        "before_step_MiB": step.baseline_bytes / MiB,
    }
    return TimelineResult(figure=fig, notes=notes, values=values, traces=traces)


def peaks_section(S, times: pd.DataFrame, m) -> Result:
    """Peak live tensor MiB of forward-only and of the full step per size, fp32 and each autocast dtype, the sizes
    the budget fits (section 1's fp32 times estimate them); the profiled model waits on the CPU meanwhile. Saved as
    01_memory_peaks. values["full_below_forward"]: how many (size, precision) have a full step below its forward."""
    fp32_s = warm_cold(times, S.warmup)[1].xs("both", level="pass")["median_s"].to_dict()  # section 1
    sizes, contexts = ([S.memory_size], list(S.memory_contexts)) if S.memory_size else (S.sizes, None)
    with XB.offloaded(m.lm, m.opt):  # each size gets the whole card
        peaks, table, plan_notes = XB.planned_peaks(
            S.budget, sizes, S.batch, S.context, fp32_s, S.autocast, S.device, contexts=contexts
        )
    peaks["profile"] = S.profile
    saved = save_results(peaks, "01_memory_peaks", **S.provenance(memory_size=S.memory_size))
    below = int((table["full step"] < table["forward"]).sum().sum())  # OOM or left-out sizes: nan, never below
    what = f"{S.memory_size} by context (the {S.edition} handout's)" if S.memory_size else "per size"
    notes = [f"peak live tensor memory (MiB) incl. parameters and AdamW state, {what}, {S.where}"]
    notes += plan_notes + [XB.peak_summary(table)]  # what the budget left out, then the summary
    return Result(
        table=table.round(1).style.format("{:.1f}", na_rep="—"),
        notes=notes,
        saved=saved,
        values={"full_below_forward": below},
    )


def seed_peaks() -> pd.DataFrame:
    """The seed's full-step fp32 peaks on one H100 (GiB), cited beside section 5's table."""
    name = f"seed H100, full step fp32, GiB ({SEED}, cited)"
    return pd.Series(SEED_H100["peak_full_step_GiB"], name=name).to_frame().T


def handout_residual(edition: str) -> tuple[str, int, int]:
    """The model, batch and context at which an edition's memory_profiling(d) asks the residual stream's size: 2024
    the 2.7B at the seed's 16 × 128; 2025 the 2.7B at batch 4 and the first of its contexts (it names none for (d));
    2026 the xl at its reference 4 × 512."""
    plan = XB.EDITIONS[edition]
    return plan.memory_size or "2.7B", plan.batch, plan.context


def residual_section(S, m) -> Result:
    """The residual stream's bytes, B·T·d_model·4 (formulas.residual_stream_bytes), against the storage of the first
    block's output a forward hook sees; and the formula at the seed's 2.7B, 16 × 128."""
    seen = {}
    hook = m.lm.blocks[0].register_forward_hook(lambda mod, i, out: seen.update(bytes=out.untyped_storage().nbytes()))
    try:
        forward_step(m.lm, m.x)
    finally:
        hook.remove()
    formula = formulas.residual_stream_bytes(S.batch, S.context, m.lm.cfg.d_model)
    ref_27 = formulas.residual_stream_bytes(16, 128, MODEL_SIZES["2.7B"].d_model)
    asked, b, t = handout_residual(S.edition)
    asked_bytes = formulas.residual_stream_bytes(b, t, get_config(asked).d_model)
    notes = [
        f"{S.profile_size}: B·T·d·4 = {S.batch}·{S.context}·{m.lm.cfg.d_model}·4 = {formula / MiB:.3f} MiB; "
        f"measured {seen['bytes'] / MiB:.3f} MiB",
        f"2.7B at 16 × 128: {ref_27 / MiB:g} MiB; the seed states {SEED_H100['residual stream 2.7B MiB']} MiB ({SEED})",
        f"the {S.edition} handout's {asked} at its batch {b} × context {t}: {asked_bytes / MiB:g} MiB",
    ]
    values = {
        "measured_bytes": seen["bytes"],
        "formula_bytes": formula,
        "2.7B_MiB": ref_27 / MiB,
        "handout_MiB": asked_bytes / MiB,
    }
    return Result(notes=notes, values=values)


def largest_section(S, trace: memory.MemoryTrace, n: int = 8) -> Result:
    """The n largest tensors live at the full step's peak: MiB, the op and the module that allocated each; saved as
    01_largest_tensors."""
    largest = pd.DataFrame(trace.largest(n, at_peak=True))
    saved = save_results(
        largest, "01_largest_tensors", **S.provenance(size=S.profile_size, peak_MiB=trace.peak_bytes / MiB)
    )
    return Result(table=largest.style.format({"MiB": "{:.3f}"}), saved=saved, values={"MiB": largest["MiB"].tolist()})


def breakdown_section(S, m, trace: memory.MemoryTrace) -> Result:
    """MiB per kind of tensor (benchmarking.breakdown_table): the whole step and what is live at its peak, analytic,
    against the tracker's; values["error"]: the analytic peak's relative error, within values["tolerance"]."""
    breakdown = XB.breakdown_table(trace, m.lm, m.opt, m.x, m.y)  # MiB
    analytic = formulas.peak_breakdown(m.lm.cfg, S.batch, S.context)
    error = abs(trace.peak_bytes - sum(analytic.values())) / trace.peak_bytes
    notes = [
        f"at the peak the tracker finds {breakdown.loc[XB.ACTIVATIONS_ROW, 'live at the peak (measured)']:.3f} MiB "
        f"of other tensors; the analytic saved activations are {analytic['activations'] / MiB:.3f} MiB plus "
        f"{analytic['loss gradients (B·T·V ×2)'] / MiB:.3f} MiB of loss gradients",
        f"{S.profile_size}, fp32, {S.where}: analytic peak {sum(analytic.values()) / MiB:.2f} MiB vs measured "
        f"{trace.peak_bytes / MiB:.2f} MiB, error {error:.2%} (tolerance {PEAK_TOL:.0%})",
    ]
    if trace.allocator_peak_bytes is not None:
        notes.append(f"CUDA allocator peak over the step: {trace.allocator_peak_bytes / MiB:.2f} MiB")
    return Result(table=breakdown.round(3), notes=notes, values={"error": error, "tolerance": PEAK_TOL})
