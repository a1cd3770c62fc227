"""Notebook 00's one table: the CPU presets' ratios beside the reference sizes', each checked by a tolerance.

table = preset_table(contexts={"gpu": 128, "cpu": 32})   # one row per reference size and ratio
check_presets(table)                                      # raises if a ratio leaves its stated tolerance
"""

from __future__ import annotations

import pandas as pd
import torch

from helpers import formulas
from helpers.model import REFERENCE_SIZES, build_model, random_batch
from helpers.profiling import counted_flops

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
