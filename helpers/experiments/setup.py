"""Notebook 00's sections: the model sizes (parameter formula against the modules), the CPU presets' ratios beside
the reference sizes' (each checked by a tolerance), and one forward pass timed cold and warmed up.

sizes = sizes_section()                                   # Result: one row per size; values["mismatched"]
table = preset_table(contexts={"gpu": 128, "cpu": 32})   # one row per reference size and ratio
check_presets(table)                                      # raises if a ratio leaves its stated tolerance
warm = warmup_section("cpu")                              # Result: cold and warm Timings, saved as 00_warmup
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd
import torch

from helpers import formulas, launch, timing
from helpers.model import MODEL_SIZES, REFERENCE_SIZES, build_model, count_parameters, random_batch, sizes_for
from helpers.profiling import counted_flops
from helpers.results import save_results
from helpers.section import Result


def sizes_section() -> Result:
    """Every model size's shape and parameter count, from the formula (count_parameters) and from the modules built
    on the meta device (no memory, even for 2.7B); values["mismatched"]: the sizes where the two differ."""
    rows = []
    for name, cfg in MODEL_SIZES.items():
        counted = sum(p.numel() for p in build_model(cfg, device="meta").parameters())
        rows.append(
            {
                "size": name,
                "d_model": cfg.d_model,
                "d_ff": cfg.d_ff,
                "layers": cfg.n_layers,
                "heads": cfg.n_heads,
                "params (formula)": count_parameters(cfg),
                "params (modules)": counted,
                "used by profile": "gpu" if name in REFERENCE_SIZES else "cpu",
            }
        )
    sizes = pd.DataFrame(rows).set_index("size")
    mismatched = list(sizes.index[sizes["params (formula)"] != sizes["params (modules)"]])
    note = (
        f"The formula and the modules disagree for {', '.join(mismatched)}."
        if mismatched
        else f"The formula and the modules agree for all {len(sizes)} sizes."
    )
    table = sizes.style.format({"params (formula)": "{:,}", "params (modules)": "{:,}"})
    return Result(table=table, notes=[note], values={"mismatched": mismatched})


# relative tolerance per ratio (cpu / reference - 1), and why it is what it is
TOLERANCES = {
    "head_dim": (0.0, "kept exactly: a quarter of the heads at the reference head_dim"),
    "d_ff / d_model": (0.0, "kept exactly"),
    "LM head share of FLOPs": (0.02, "the vocabulary is chosen to keep it; rounding V to a whole token"),
    "attention share of FLOPs": (0.10, "T/d kept at context ÷ 4; xl rounds 6.25 heads to 6 (d 384, not 400)"),
    "softmax elements per kFLOP": (0.10, "as attention, and it scales with T/(head_dim·d)"),
    "layers per 1000 of width": (
        None,
        "not kept: layers ÷ 8 against width ÷ 4 halves it to stay in the time budget; "
        "no share above depends on it (L cancels), only how many layers there are",
    ),
}


def counted_head_share(size, context_length: int) -> float:
    """The LM head's share of the forward FLOPs as FlopCounterMode counts them, on the meta device (no memory)."""
    lm = build_model(size, device="meta")
    x, _ = random_batch(lm.cfg, 1, context_length, device="meta")  # (1, T)
    h = torch.empty(1, context_length, lm.cfg.d_model, device="meta")  # (1, T, d): what the head sees
    return counted_flops(lambda: lm.lm_head(h)) / counted_flops(lambda: lm(x))


def preset_table(contexts: dict[str, int]) -> pd.DataFrame:
    """Every ratio of `formulas.shape_ratios` for each reference size (at contexts["gpu"]) and its CPU preset (at
    contexts["cpu"]), with their ratio, the tolerance, and the LM head's share as FlopCounterMode counts it."""
    rows = []
    for ref in REFERENCE_SIZES:
        cpu = ref + "/cpu"
        r, c = formulas.shape_ratios(ref, contexts["gpu"]), formulas.shape_ratios(cpu, contexts["cpu"])
        for name, (tol, why) in TOLERANCES.items():
            rows.append(
                {
                    "size": ref,
                    "ratio": name,
                    "reference": r[name],
                    "cpu preset": c[name],
                    "cpu / reference": c[name] / r[name],
                    "tolerance": "—" if tol is None else f"±{tol:.0%}",
                    "why": why,
                }
            )
        rows.append(
            {
                "size": ref,
                "ratio": "LM head share, counted",
                "reference": counted_head_share(ref, contexts["gpu"]),
                "cpu preset": counted_head_share(cpu, contexts["cpu"]),
                "tolerance": "±1% of the formula",
                "why": "FlopCounterMode on the meta device, against the formula's row above",
            }
        )
        rows[-1]["cpu / reference"] = rows[-1]["cpu preset"] / rows[-1]["reference"]
    return pd.DataFrame(rows).set_index(["size", "ratio"])


def check_presets(table: pd.DataFrame) -> str:
    """Assert every kept ratio within its tolerance and the counted LM head shares within 1% of the formula."""
    for (size, name), row in table.iterrows():
        tol = TOLERANCES.get(name, (None,))[0]
        if tol is not None:
            assert abs(row["cpu / reference"] - 1) <= tol + 1e-12, (
                f"{size}: {name} off by {row['cpu / reference']:.3f}x"
            )
        if name == "LM head share, counted":
            formula = table.loc[(size, "LM head share of FLOPs")]
            for col in ("reference", "cpu preset"):
                assert abs(row[col] / formula[col] - 1) <= 0.01, (
                    f"{size} {col}: counted {row[col]:.4f} vs {formula[col]:.4f}"
                )
    layers = table.xs("layers per 1000 of width", level="ratio")["cpu / reference"]
    return (
        f"All kept ratios are within tolerance. Layers per unit of width are {layers.min():.2f}x to "
        f"{layers.max():.2f}x the reference's (layers ÷ 8 against width ÷ 4)."
    )


def wide(table: pd.DataFrame) -> pd.DataFrame:
    """The table for reading: one row per ratio, a (reference, cpu preset) column pair per size, and the tolerance."""
    out = table[["reference", "cpu preset"]].unstack("size").swaplevel(axis=1)
    out = out[[(s, c) for s in REFERENCE_SIZES for c in ("reference", "cpu preset")]]
    out[("", "tolerance")] = table["tolerance"].groupby(level="ratio").first()
    return out.loc[list(table.index.get_level_values("ratio").unique())]


WARMUP_BATCH, WARMUP_STEPS, WARMUP_WARM = 4, 10, 3  # the warm-up demo: batch, timed steps, warm-up steps


@dataclass
class WarmupResult(Result):
    """The warm-up demo's Result, with both runs' Timings (every sample kept) and what was timed."""

    cold: timing.Timing | None = None
    warm: timing.Timing | None = None
    title: str = ""


def warmup_section(profile: str, device=None) -> WarmupResult:
    """One forward pass (no graph) of the profile's first size, batch 4 at its context, timed 10 times from a cold
    start (warmup=0) and 10 times after 3 warm-up steps on the same model; saved as 00_warmup. The notes compare the
    first cold step with the warm ones; values: first_ms, warm_median_ms, warm_max_ms, first_over_warm_median."""
    size = sizes_for(profile)[0]
    device = launch.device() if device is None else device
    lm = build_model(size, device=device)
    inputs, _ = random_batch(lm.cfg, batch_size=WARMUP_BATCH, device=device)
    with torch.no_grad():
        runs = [
            timing.benchmark(lambda: lm(inputs), warmup=w, steps=WARMUP_STEPS, device=device, label=f"{size} {label}")
            for w, label in ((0, "forward, no warm-up"), (WARMUP_WARM, f"forward, {WARMUP_WARM} warm-up steps"))
        ]
    cold, warm = runs
    saved = save_results(
        [cold.as_row(warmup_kind="none"), warm.as_row(warmup_kind=f"{WARMUP_WARM} steps")],
        "00_warmup",
        profile=profile,
        model=size,
    )
    first, slowest = cold.samples[0], max(warm.samples)
    notes = [
        str(cold),
        str(warm),
        f"first cold step: {first * 1e3:.1f} ms = {first / warm.median:.1f}x the warm median "
        f"({warm.median * 1e3:.1f} ms); cold mean {cold.mean * 1e3:.1f} ms vs warm mean {warm.mean * 1e3:.1f} ms",
        f"The first cold step is slower than every warm step (the slowest: {slowest * 1e3:.1f} ms): a one-time cost."
        if first > slowest
        else f"The first cold step is within the warm steps' range (up to {slowest * 1e3:.1f} ms): no measurable "
        "one-time cost here.",
    ]
    return WarmupResult(
        notes=notes,
        saved=saved,
        values={
            "first_ms": first * 1e3,
            "warm_median_ms": warm.median * 1e3,
            "warm_max_ms": slowest * 1e3,
            "first_over_warm_median": first / warm.median,
        },
        cold=cold,
        warm=warm,
        title=f"{size}, batch {WARMUP_BATCH} × {lm.cfg.context_length} on {device} ({profile} profile)",
    )


def plot_warmup(r: WarmupResult):
    """Each step's time, cold and after the warm-up steps, one line each; returns the figure."""
    fig, ax = plt.subplots(figsize=(6, 3))
    steps = range(1, len(r.cold.samples) + 1)
    ax.plot(steps, [s * 1e3 for s in r.cold.samples], "o-", label="no warm-up")
    ax.plot(steps, [s * 1e3 for s in r.warm.samples], "s-", label=f"after {r.warm.warmup} warm-up steps")
    ax.set(xlabel="step", ylabel="time (ms)", title=r.title)
    ax.legend()
    return fig
