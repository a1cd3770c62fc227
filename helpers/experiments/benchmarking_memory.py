"""Notebook 01 §5: memory: a step's live tensor bytes tracked op by op (helpers.memory.track), the peaks per size and
precision, and the analytic breakdown of what is live at the peak against the tracker's.

    traces = step_traces(lm, opt, x, y)                     # {"forward": MemoryTrace, "full step": MemoryTrace}
    breakdown_table(traces["full step"], lm, opt, x, y)     # analytic vs measured bytes live at the peak
"""

from __future__ import annotations

import contextlib
import functools

import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch.nn as nn

from helpers import formulas
from helpers.experiments.benchmarking_common import MiB, forward_step, guarded, precision_name, step_estimate
from helpers.experiments.common import train_step
from helpers.memory import MemoryTrace, model_state, track
from helpers.model import ModelConfig, build_model, get_config, random_batch

TRACK_OVERHEAD = 1.5  # memory.track's dispatch mode runs Python per op; PEAK_FIXED_S: the model, first calls. Planning
PEAK_FIXED_S = 1.0  # estimates from one run (step_peaks on one thread: small/cpu 1.5 s, large/cpu 3.0x a step)


def plan_peaks(budget, sizes, batch_size: int, context_length: int, fp32_s: dict, bf16: bool, run=None, contexts=None):
    """Section 5's peak sizes (fp32, or bf16 autocast) within the budget, the smallest always: per size a model built
    and three tracked steps (AdamW's state, forward, full step). contexts: one size (sizes[0]) at each of these
    contexts instead, the first always (an edition that profiles one model over its contexts)."""
    items = list(sizes) if contexts is None else [(sizes[0], t) for t in contexts]

    def cost(item):
        size, t_ = item if contexts is not None else (item, context_length)
        measured = fp32_s.get(size) if t_ == context_length else None
        t = step_estimate(size, batch_size, t_, budget.calibration, bf16=bf16, fp32_s=measured)
        return PEAK_FIXED_S + 3 * TRACK_OVERHEAD * t

    return budget.fit(
        items, cost, what="autocast memory peaks at" if bf16 else "memory peaks at", keep_first=True, run=run
    )


def step_traces(lm, opt, x, y, autocast_dtype=None, device=None) -> dict[str, MemoryTrace]:
    """Traces of forward-only and of a steady-state step (opt's state exists; grads are set to None first)."""
    lm.zero_grad(set_to_none=True)
    state = model_state(lm, opt, x, y)
    return {
        "forward": track(lambda: forward_step(lm, x, autocast_dtype), existing=state, model=lm, device=device),
        "full step": track(
            lambda: train_step(lm, opt, x, y, autocast_dtype=autocast_dtype), existing=state, model=lm, device=device
        ),
    }


def profiled_config(size, context_length: int) -> ModelConfig:
    """The model section 5 profiles at `context_length`: `size`, built for that many positions where its own
    context_length is shorter, as the handouts build the model they profile (2026: the xl at 2048, 2025: the 2.7B at
    512). A RoPE model has no position table, so only its causal masks and RoPE tables grow (formulas.buffer_bytes)."""
    cfg = get_config(size)
    return cfg if cfg.context_length >= context_length else get_config(cfg, context_length=context_length)


def step_peaks(size, batch_size: int, context_length: int, autocast_dtype=None, device=None) -> dict[str, MemoryTrace]:
    """step_traces of a fresh model of `size` (profiled_config: as long as the context) after one step has created
    its AdamW state."""
    lm = build_model(profiled_config(size, context_length), device=device)
    opt = torch.optim.AdamW(lm.parameters())
    x, y = random_batch(lm.cfg, batch_size, context_length, device=device)
    train_step(lm, opt, x, y, autocast_dtype=autocast_dtype)  # creates the AdamW state
    return step_traces(lm, opt, x, y, autocast_dtype, device)


def plot_timelines(traces: dict[str, MemoryTrace], title: str = ""):
    """Live tensor memory (MiB) per event (op or free), one line per trace; returns the figure."""
    fig, ax = plt.subplots(figsize=(10, 3.5))
    for name, tr in traces.items():
        events, live = zip(*tr.timeline, strict=True)
        ax.plot(events, [v / MiB for v in live], label=name)
    ax.set(xlabel="event (op or free)", ylabel="live tensor memory (MiB)", title=title)
    ax.legend()
    return fig


@contextlib.contextmanager
def offloaded(model: nn.Module, optimizer=None, to: str = "cpu"):
    """Move a model (parameters, gradients, buffers) and its optimizer's state to `to` for the duration, then back,
    so the runs inside have the card to themselves (section 5 keeps the profiled model for later cells)."""
    home = next(model.parameters()).device
    if home.type == torch.device(to).type:
        yield
        return
    moved = [
        (s, k)
        for s in (optimizer.state.values() if optimizer else [])
        for k, v in s.items()
        if torch.is_tensor(v) and v.device == home
    ]  # AdamW's fp32 `step` counters stay on the CPU
    model.to(to)  # parameters keep their identity, so the optimizer's references stay valid
    for s, k in moved:
        s[k] = s[k].to(to)
    if home.type == "cuda":
        torch.cuda.empty_cache()
    try:
        yield
    finally:
        model.to(home)
        for s, k in moved:
            s[k] = s[k].to(home)


def peak_rows(sizes, batch_size: int, context_length: int, dtypes, device=None, fp32: bool = True) -> pd.DataFrame:
    """Peak MiB of forward-only and of the full step per size and precision (fp32 unless fp32=False, then each
    autocast dtype)."""
    rows = []
    for size in sizes:
        for dtype in [None, *dtypes] if fp32 else dtypes:
            traces = guarded(functools.partial(step_peaks, size, batch_size, context_length, dtype, device))
            for kind in ("forward", "full step"):
                tr = None if traces == "OOM" else traces[kind]
                rows.append(
                    {
                        "size": size,
                        "precision": precision_name(dtype),
                        "pass": kind,
                        "peak_MiB": None if tr is None else tr.peak_bytes / MiB,
                        "allocator_peak_MiB": None
                        if tr is None or tr.allocator_peak_bytes is None
                        else tr.allocator_peak_bytes / MiB,
                        "status": "OOM" if tr is None else "ok",
                        "device": str(device),
                    }
                )
            del traces
    return pd.DataFrame(rows)


def planned_peaks(
    budget, sizes, batch_size: int, context_length: int, fp32_s: dict, dtypes, device=None, contexts=None
):
    """Section 5: the fp32 and the autocast peaks of the sizes each plan fits in the budget (or of sizes[0] at each of
    `contexts`): (rows, the table of peak MiB by size or context x (pass, precision), the plans' notes on what they
    left out)."""

    def run(item, bf16):
        size, t = item if contexts is not None else (item, context_length)
        rows = peak_rows([size], batch_size, t, dtypes if bf16 else [], device, fp32=not bf16)
        return rows.assign(context=t)

    plans = [
        plan_peaks(
            budget,
            sizes,
            batch_size,
            context_length,
            fp32_s,
            bf16=bf16,
            contexts=contexts,
            run=lambda item, bf16=bf16: run(item, bf16),
        )
        for bf16 in (False, True)
    ]
    peaks = pd.concat([r for plan in plans for r in plan.results], ignore_index=True)
    by, order = ("size", sizes) if contexts is None else ("context", contexts)
    table = peaks.pivot_table(index=by, columns=["pass", "precision"], values="peak_MiB", sort=False).reindex(order)
    return peaks, table, [plan.note for plan in plans if plan.note]


def peak_summary(peak_table: pd.DataFrame) -> str:
    """Full-step peak of each autocast dtype vs fp32, and full step vs forward in fp32, as ranges over sizes."""
    full, fwd = peak_table["full step"], peak_table["forward"]
    lines = [
        f"{col}: full-step peak {(full[col] / full['fp32']).min():.2f}x to {(full[col] / full['fp32']).max():.2f}x fp32"
        for col in full.columns.drop("fp32")
    ]
    ratio = full["fp32"] / fwd["fp32"]
    return "\n".join(lines + [f"full step / forward (fp32): {ratio.min():.1f}x to {ratio.max():.1f}x"])


ACTIVATIONS_ROW = "activations (+ loss gradients at the peak)"  # breakdown_table's row of everything else


def breakdown_table(trace: MemoryTrace, lm, opt, x, y) -> pd.DataFrame:
    """MiB per kind of tensor: the whole step and what is live at its peak (analytic), against the tracker's peak."""
    B, T = x.shape
    whole, analytic = formulas.step_breakdown(lm.cfg, B, T), formulas.peak_breakdown(lm.cfg, B, T)
    measured = trace.categorize(
        **{
            "parameters": lm.parameters(),
            "buffers": lm.buffers(),
            "optimizer state": [t for s in opt.state.values() for t in s.values()],
            "gradients": [p.grad for p in lm.parameters()],
            "token ids": [x, y],
        }
    )
    kinds = ["parameters", "buffers", "token ids", "optimizer state", "gradients"]
    table = (
        pd.DataFrame(
            {
                "whole step (analytic)": [whole[k] for k in kinds] + [whole["activations"]],
                "live at the peak (analytic)": [analytic[k] for k in kinds]
                + [analytic["activations"] + analytic["loss gradients (B·T·V ×2)"]],
                "live at the peak (measured)": [measured[k] for k in kinds] + [measured["activations & other"]],
            },
            index=kinds + [ACTIVATIONS_ROW],
        )
        / MiB
    )
    table.loc["total"] = table.sum()
    return table
