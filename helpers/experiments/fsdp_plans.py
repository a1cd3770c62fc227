"""Notebook 07 §7-8: what the closed forms say, as tables and a plot (no measurement): memory and bytes per strategy
(DDP, ZeRO-1/2, FSDP) for the calculator, a gated FFN under DP/FSDP/TP, the memory calculator's inputs, and the 2026
leaderboard plans with the published marks (`leaderboard_section`, the notebook's headline)."""

from __future__ import annotations

import pandas as pd

from helpers import formulas as F
from helpers.calculator import Calculator
from helpers.published import MARKS
from helpers.section import Result


def strategies_table(
    model, world_size: int, gpu_bytes: float, batch_size: int = 4, context_length=None, precision: str = "mixed"
) -> pd.DataFrame:
    """Per strategy (DDP, ZeRO-1, ZeRO-2, FSDP = ZeRO-3): GB (10⁹ bytes) of model states + saved activations per rank,
    what is left of `gpu_bytes` and whether they fit, and the GB each rank sends per step (ring) (notebook 07's table
    and calculator)."""
    acts = sum(F.activation_bytes(model, batch_size, context_length).values()) * (0.5 if precision == "mixed" else 1)
    rows = []
    for stage, name in enumerate(["DDP", "ZeRO-1", "ZeRO-2", "FSDP (ZeRO-3)"]):
        z = F.zero_memory(model, world_size, stage, precision)
        total = z["total"] + acts
        rows.append(
            {
                "strategy": name,
                "model states (GB)": z["total"] / 1e9,
                "activations (GB)": acts / 1e9,
                "total (GB)": total / 1e9,
                "left on GPU (GB)": (gpu_bytes - total) / 1e9,
                "fits": total <= gpu_bytes,
                "sent per step (GB)": z["communication"] / 1e9,
            }
        )
    return pd.DataFrame(rows).set_index("strategy").round(4)


def ffn_table(*, tokens, d, f, n, C, W, n_tp) -> pd.DataFrame:
    """formulas.gated_ffn for DP, FSDP, TP and FSDP×TP side by side (per device)."""
    rows = [
        {"strategy": s, **F.gated_ffn(s, tokens=tokens, d=d, f=f, n=n, C=C, W=W, n_tp=n_tp)}
        for s in ("dp", "fsdp", "tp", "fsdp_tp")
    ]
    return pd.DataFrame(rows).set_index("strategy")


def strategies_calculator() -> Calculator:
    """§7's calculator over `strategies_table`: model, world size, GPU memory and batch size."""
    return Calculator(
        strategies_table,
        {
            "model": ["small", "medium", "large", "xl", "2.7B"],
            "world_size": [2**i for i in range(11)],
            "gpu_bytes": {f"{gb} GB": gb * 1e9 for gb in (16, 24, 40, 80, 141)},
            "batch_size": [1, 4, 16],
        },
        default={"model": "xl", "world_size": 8, "gpu_bytes": 80e9, "batch_size": 4},
        names={"gpu_bytes": "GPU memory"},
        title="Which strategy fits: memory per rank and bytes sent per step, mixed precision + Adam",
        note="GB = 10⁹ bytes. Activations: one batch (batch size × the model's full context in tokens), saved in bf16, "
        "not sharded; sent per step: the bytes each rank sends in a ring.",
    )


def memory_calculator() -> Calculator:
    """§7's calculator over formulas.memory_calculator: preset, ZeRO over dp replicas, pp stages, micro-batches and
    recomputation."""
    return Calculator(
        F.memory_calculator,
        {
            "preset": list(F.CALCULATOR_PRESETS),
            "dp": [1, 2, 8, 64],
            "pp": [1, 2, 4, 8],
            "micro_batch": [1, 2, 4],
            "n_micro": [4, 16],
            "recompute": list(F.RECOMPUTATION),
        },
        default={
            "preset": "Llama-3-8B-like (MHA)",
            "dp": 8,
            "pp": 4,
            "micro_batch": 1,
            "n_micro": 4,
            "recompute": "selective",
        },
        names={
            "dp": "data-parallel replicas",
            "pp": "pipeline stages",
            "micro_batch": "micro-batch (sequences)",
            "n_micro": "micro-batches per step",
            "recompute": "recomputation",
        },
        title="Memory per GPU: ZeRO stage × recomputation × micro-batch × pipeline stages (mixed precision + Adam)",
        note="GB = 10⁹ bytes; each preset at its full context; activations in 16 bits, GPT-style blocks.",
    )


# ---- 8 · the 2026 leaderboard as a plan (formulas.leaderboard_plan), with the published marks ----


def plan_table(plan: list[dict], marks=()) -> pd.DataFrame:
    """One row per strategy × checkpointing × LM head × optimizer precision: GB per GPU, fits per GPU (with the plan's
    margin), predicted step seconds per GPU, and for each mark (helpers.published, a time) the share of its speed the
    plan would reach on the B200 (notebook 07 §8)."""
    rows = []
    for r in plan:
        row = {
            "strategy": r["strategy"],
            "checkpointing": r["checkpointing"],
            "head": r["head"],
            "precision": r["precision"],
            "GB per GPU": r["memory_GB"],
            "TFLOP per step": r["flops"] / 1e12,
        }
        row.update({f"fits {g}": ok for g, ok in r["fits"].items()})
        row.update({f"step s, {g}": s for g, s in r["step_s"].items()})
        b200 = next(g for g in r["step_s"] if g.startswith("B200"))
        row.update({f"% of {m.name}": round(100 * m.share(r["step_s"][b200] * 1e3), 1) for m in marks})
        rows.append(row)
    return pd.DataFrame(rows).set_index(["strategy", "checkpointing", "head", "precision"])


def plot_plan(plan: list[dict], marks=(), gpu: str = "B200 ~180 GB", title: str = ""):
    """Predicted step time of each plan on `gpu` at the stated MFU, whiskers over the MFU band (grey: does not fit with
    the plan's margin), with the published marks as lines labelled with their source and year."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    labels = [f"{r['strategy']} · {r['checkpointing']} · {r['head']} head · {r['precision']}" for r in plan]
    colors = ["#4a7" if r["fits"][gpu] else "#ccc" for r in plan]
    steps = [r["step_s"][gpu] for r in plan]
    band = [sorted(r["step_band_s"][gpu].values()) for r in plan]  # fastest (highest MFU) to slowest
    ax.bar(
        range(len(plan)),
        steps,
        color=colors,
        edgecolor="#555",
        yerr=[
            [s - b[0] for s, b in zip(steps, band, strict=True)],
            [b[-1] - s for s, b in zip(steps, band, strict=True)],
        ],
        error_kw=dict(elinewidth=0.6, capsize=0),
    )  # whiskers: the band over formulas.PLAN_MFUS
    for m, style in zip(marks, ("--", ":", "-."), strict=False):  # three line styles: a fourth mark is not drawn
        ax.axhline(m.value / 1e3, color="#c33", linestyle=style, label=m.label)
    ax.set_xticks(range(len(plan)), labels, fontsize=5, rotation=90)
    ax.set(ylabel="predicted step (s)", title=title or f"2026 leaderboard plans on 2× {gpu} (grey: does not fit)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def leaderboard_section() -> Result:
    """§8: every plan of formulas.leaderboard_plan as a table and a plot beside the published marks; per GPU, the
    fastest plan that fits, 10% of the card kept free, ties to less memory (formulas.fastest_plan, as the answers page
    chooses)."""
    plan = F.leaderboard_plan()
    marks = [MARKS["leaderboard_2026_best"], MARKS["leaderboard_2026_baseline"]]
    notes, best = [], {}
    for gpu, spec in F.LEADERBOARD_GPUS.items():
        b = best[gpu] = F.fastest_plan(plan, gpu)
        if b is not None and b["step_s"][gpu] < b["flops"] / 2 / spec["flops"]:  # two GPUs at their peak
            raise AssertionError(f"{gpu}: a plan faster than two GPUs at peak FLOP/s: {b}")
        notes.append(
            f"{gpu}: fastest that fits (ties to less memory): {b['strategy']}, checkpointing {b['checkpointing']}, "
            f"{b['head']} LM head, {b['precision']}, {b['memory_GB']:.0f} GB per GPU, "
            f"{b['step_s'][gpu]:.2f} s predicted"
            if b
            else f"{gpu}: no plan fits"
        )
    notes.append(
        f"Ψ = {plan[0]['params'] / 1e9:.2f} B; MFU {F.LEADERBOARD_MFU:.0%} (stated); marks: "
        + "; ".join(m.label for m in marks)
    )
    return Result(
        table=plan_table(plan, marks).round(2),
        figure=plot_plan(plan, marks),
        notes=notes,
        values={"best": best, "plans": len(plan), "params": plan[0]["params"]},
    )
