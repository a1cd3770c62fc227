"""Notebook 04 §3: how much of the all-reduce time falls inside backward, per wrapper, from the profiler's trace
(gloo) and from each all-reduce's launch -> done interval, and the timeline plot of one step.

    overlap = overlap_table(raw["small/cpu"], shown_variants(speed, "small/cpu"), traced=True)
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from helpers.experiments.ddp_speed import SpeedRun, shown_labels


def overlap_fraction(backward: tuple[float, float], spans: list) -> float:
    """Share of the time with an all-reduce in flight (union of [launch, done]) that falls inside backward."""
    spans = sorted((a, b) for a, b in spans if b is not None)
    merged = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    total = sum(b - a for a, b in merged)
    inside = sum(max(0.0, min(b, backward[1]) - max(a, backward[0])) for a, b in merged)
    return inside / total if total > 0 else 0.0


def shown_variants(speed: pd.DataFrame, model: str) -> list[str]:
    """The variants §3 shows for `model` (shown_labels on the speed table's bucket counts)."""
    rows = speed[speed["model"] == model]
    return shown_labels(dict(zip(rows["variant"], rows["buckets"], strict=True)))


def overlap_table(per_rank: list[dict[str, SpeedRun]], shown, *, traced: bool) -> pd.DataFrame:
    """Per variant, mean/min/max overlap_fraction over ranks and recorded steps, from the profiler trace (when
    `traced`: gloo) and from launch -> done (not for torch DDP, whose launches happen inside torch)."""
    rows = []
    for label in shown:
        row = {"variant": label, "buckets": per_rank[0][label].buckets}
        for name, source in (("trace", "traced"), ("launch→done", "timeline")):
            if (source == "traced" and not traced) or (source == "timeline" and label.startswith("torch_ddp")):
                continue
            f = [overlap_fraction(t.backward, t.comm) for r in per_rank for t in getattr(r[label], source)]
            row.update({f"{name} overlap": float(np.mean(f)), f"{name} min": min(f), f"{name} max": max(f)})
        rows.append(row)
    return pd.DataFrame(rows).set_index("variant")


def plot_timelines(run: dict[str, SpeedRun], shown, *, traced: bool, title: str):
    """One row per variant: the last recorded step's backward bar and its all-reduces, in ms since backward began."""
    source, to_ms = ("traced", 1e-3) if traced else ("timeline", 1e3)  # profiler µs, or perf_counter seconds
    fig, axes = plt.subplots(len(shown), 1, figsize=(8, 1.0 + 0.7 * len(shown)), sharex=True)
    for ax, label in zip(axes, shown, strict=True):
        t = getattr(run[label], source)[-1]
        t0 = t.backward[0]
        ax.barh(1, (t.backward[1] - t0) * to_ms, left=0, color="tab:blue", label="backward")
        for a, b in t.comm:
            if b is not None:
                ax.barh(0, (b - a) * to_ms, left=(a - t0) * to_ms, color="tab:orange", alpha=0.5, edgecolor="k", lw=0.3)
        ax.set_yticks([0, 1], ["all-reduce", "backward"])
        ax.set_title(label, fontsize=9, loc="left")
    axes[-1].set_xlabel(f"ms since backward started (rank 0, last {'profiled' if traced else 'timed'} step)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
