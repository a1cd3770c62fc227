"""Notebook 01 §4, one function per cell: fp32 against autocast per size, the dtypes autocast gives the toy
model's tensors, and why norms stay in fp32; each returns a helpers.section.Result (benchmarking_sections has the
other sections and the Setup they take).

    amp = precision_section(S, timed.times, M)    # 01_mixed_precision, 01_precision_ratios; a verdict per size
"""

from __future__ import annotations

import pandas as pd
import torch

from helpers import env, formulas
from helpers.experiments import benchmarking as XB
from helpers.results import save_results
from helpers.section import Result


def bf16_line(S) -> str:
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


def precision_section(S, times: pd.DataFrame, m) -> Result:
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
        bf16_line(S),
    ]
    styled = table.style.format(
        {c: (lambda v: f"{v * 1e3:.1f}") for c in table.columns if not c.startswith("speed")}
        | {c: "{:.2f}x" for c in speedups.columns},
        na_rep="—",
    )
    return Result(table=styled, notes=notes, saved=saved, values={"speedups": speedups.stack().tolist()})


def dtype_section(S) -> Result:
    """Section 4: the dtype autocast gives each tensor of the handout's toy model (a fresh one per autocast dtype),
    read by forward hooks and from the tensors; saved as 01_autocast_dtypes. Both 16-bit dtypes on every device
    (a toy: instant), fp16 being the one the handout asks."""
    dtypes = XB.autocast_dtype_table([torch.bfloat16, torch.float16], S.device)
    saved = save_results(dtypes.rename_axis("tensor").reset_index(), "01_autocast_dtypes", profile=S.profile)
    kept = dtypes.loc[["parameters", "gradients"]]
    return Result(
        table=dtypes, saved=saved, values={"fp32_parameters_and_grads": bool((kept == "torch.float32").all().all())}
    )


def norm_precision_section(S) -> Result:
    """Section 4: the largest relative error of mean(x²) over 4096 values in fp32, bf16 and fp16 (against fp64):
    why norms stay in fp32; saved as 01_norm_precision."""
    err = XB.mean_square_errors(S.device)
    saved = save_results(
        [{"dtype": k, "max_rel_error": v} for k, v in err.items()], "01_norm_precision", profile=S.profile
    )
    line = "largest relative error of mean(x²) over 4096 values: " + ", ".join(f"{k} {v:.1e}" for k, v in err.items())
    return Result(notes=[line], saved=saved, values=err)
