"""Notebook 04 §4: the bucket-size model (formulas.bucket_overhead with this machine's backward time and all-reduce
α, β) against the measured sweep of DDPBucketed's bucket sizes.

    fit_ab, where = alpha_beta("cpu", "gloo", "cpu")      # notebook 03's all-reduce fit, or measured here
    sweep, fit = bucket_sweep(speed, "small/cpu", alpha_s=fit_ab.alpha_s, beta_Bps=fit_ab.beta_Bps)
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from helpers import formulas
from helpers.ddp import MB, plan_buckets
from helpers.experiments.common import (
    make_model,
    slowest_rank,
)
from helpers.experiments.ddp_speed import paired_variants
from helpers.model import count_parameters
from helpers.timing import identical_noise


@dataclass
class BucketModel:
    """formulas.bucket_overhead's inputs for one model, and its optimum."""

    grad_bytes: float  # S, from count_parameters
    tensor_bytes: list[int]  # every gradient tensor's bytes, from the model itself
    planned: list[int]  # plan_buckets' bucket count at each swept size
    backward_s: float  # T_b: backward with no communication (local)
    local_step_s: float
    alpha_s: float
    beta_Bps: float
    n_star: float

    def overhead(self, n_buckets):
        """formulas.bucket_overhead with these S, T_b, α, β."""
        return formulas.bucket_overhead(n_buckets, self.grad_bytes, self.backward_s, self.alpha_s, self.beta_Bps)


def bucket_sweep(
    speed: pd.DataFrame, model: str, *, alpha_s: float, beta_Bps: float
) -> tuple[pd.DataFrame, BucketModel]:
    """The swept DDPBucketed rows of `model` (bucket_MB, buckets, measured and predicted step_s) and the fitted
    model."""
    s = speed[speed["model"] == model]
    sweep = s[s["variant"].str.match(r"bucketed [\d.]+ MB")].copy()
    sweep["bucket_MB"] = [float(v.split()[1]) for v in sweep["variant"]]
    sweep = sweep.sort_values("bucket_MB").reset_index(drop=True)
    local = s[s["variant"] == "local"].iloc[0]
    sizes = [p.numel() * 4 for p in make_model(model, 0).parameters() if p.requires_grad]  # float32 gradients
    S = count_parameters(model) * 4
    fit = BucketModel(
        S,
        sizes,
        [len(plan_buckets(sizes, mb * MB)) for mb in sweep["bucket_MB"]],
        local["backward_s"],
        local["step_s"],
        alpha_s,
        beta_Bps,
        formulas.optimal_buckets(S, local["backward_s"], alpha_s, beta_Bps),
    )
    sweep["predicted_s"] = fit.local_step_s + fit.overhead(sweep["buckets"])
    return sweep, fit


def sweep_display(sweep: pd.DataFrame, caption: str):
    """The sweep in ms: bucket size, bucket count, measured step and comm, modelled step."""
    ms = sweep[["bucket_MB", "buckets"]].assign(
        step_ms=sweep.step_s * 1e3, comm_ms=sweep.comm_s * 1e3, predicted_ms=sweep.predicted_s * 1e3
    )
    return ms.style.format(precision=2).hide(axis="index").set_caption(caption)


def plot_bucket_sweep(sweep: pd.DataFrame, fit: BucketModel, buckets_mb, *, title: str):
    """Modelled step time over bucket size (equal buckets, at most one per tensor), the built counts, the measured."""
    mb_curve = np.geomspace(min(buckets_mb) / 2, max(buckets_mb), 400)
    n_curve = np.clip(np.ceil(fit.grad_bytes / (mb_curve * MB)), 1, len(fit.tensor_bytes))
    b_star_mb = fit.grad_bytes / fit.n_star / MB
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(mb_curve, (fit.local_step_s + fit.overhead(n_curve)) * 1e3, label="model: compute-only step + o(n)")
    ax.plot(
        sweep["bucket_MB"], sweep["predicted_s"] * 1e3, "x", color="tab:blue", label="model at the built bucket count"
    )
    ax.plot(sweep["bucket_MB"], sweep["step_s"] * 1e3, "o", color="tab:orange", label="measured DDPBucketed")
    ax.axvline(b_star_mb, ls="--", color="gray", label=f"model optimum b* = {b_star_mb:.2g} MB")
    ax.axhline(fit.local_step_s * 1e3, ls=":", color="k", label="compute only (local)")
    ax.set_xscale("log")
    ax.set(xlabel="bucket_size_mb", ylabel="ms per step", ylim=(0, None))
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return fig


def describe_bucket_model(fit: BucketModel, sweep: pd.DataFrame, model: str, seed_mb) -> str:
    """§4's sentences: S, T_b, S/β, α, the optimum n*, b*, and which swept sizes hold every gradient in one bucket."""
    S, n_star = fit.grad_bytes, fit.n_star
    text = (
        f"{model}: S = {S / MB:.2f} MiB of gradients in {len(fit.tensor_bytes)} tensors, T_b = "
        f"{fit.backward_s * 1e3:.1f} ms, S/β = {S / fit.beta_Bps * 1e3:.1f} ms, α = {fit.alpha_s * 1e6:.0f} µs → "
        f"n* = {n_star:.1f} buckets, b* = {S / n_star / MB:.3g} MiB "
        f"(predicted overhead {fit.overhead(n_star) * 1e3:.2f} ms)"
    )
    if n_star > len(fit.tensor_bytes):
        text += (
            f"\nthe model asks for more buckets ({n_star:.1f}) than {model} has gradient tensors "
            f"({len(fit.tensor_bytes)}): the finest split DDPBucketed can build is one tensor per bucket "
            f"(as DDPIndividualParameters, in fixed order)"
        )
    one = [mb for mb, n in zip(sweep["bucket_MB"], sweep["buckets"], strict=True) if n == 1]
    return text + (
        f"\nbucket sizes that hold every gradient in one bucket here: {', '.join(f'{mb:g}' for mb in one)} MiB "
        f"({len([m for m in one if m in seed_mb])} of the seed's {len(seed_mb)} sizes)"
    )


def sweep_optimum_text(per_rank, sweep: pd.DataFrame) -> str:
    """The swept bucket size with the lowest median step, its bucket count, and the sizes it does not beat: a size is
    ranked only when its paired ratio to the best lies beyond both 1 and the spread of the sizes that build the same
    single bucket (identical configurations: timing.identical_noise), with at least MIN_PAIRS steps."""
    labels = dict(zip(sweep["variant"], sweep["bucket_MB"], strict=True))
    buckets = dict(zip(sweep["variant"], sweep.get("buckets", [None] * len(sweep)), strict=True))
    med = {k: float(np.median(slowest_rank([r[k].step for r in per_rank]))) for k in labels}
    best = min(med, key=med.get)
    one = [k for k in labels if buckets[k] == 1]
    noise = identical_noise(paired_variants(per_rank, a, b) for a in one for b in one if a < b)
    tied = [f"{labels[k]:g}" for k in labels if k != best and not paired_variants(per_rank, k, best).beyond(noise)]
    floor = f" or the {noise:.1%} the one-bucket sizes (identical) differ by" if noise else ""
    n = buckets[best]
    count = "" if n is None else f", {int(n)} bucket{'s' * (n != 1)}"
    return f"lowest median step: {labels[best]:g} MiB ({med[best] * 1e3:.1f} ms{count}); " + (
        f"not measurably slower (paired 95% interval of the ratio within 1{floor}): {', '.join(tied)} MiB"
        if tied
        else "every other swept size is measurably slower"
    )


def alpha_beta(profile: str, backend: str, device: str):
    """The 2-rank all-reduce α–β fit for (backend, device): notebook 03's saved fit when its results are present, else
    collectives.run_grid + fit_table on notebook 03's grid for this profile. Returns (fit, where it came from)."""
    from helpers.experiments import collectives
    from helpers.results import load_results

    key = dict(backend=backend, device=device, world_size=2, op="all_reduce")
    try:
        run = load_results("03_collectives")
        saved = run.frame() if run.provenance.get("profile") == profile else pd.DataFrame(columns=list(key))
        part = saved[np.logical_and.reduce([saved[k] == v for k, v in key.items()])]
        if "nodes" in part:
            part = part[part["nodes"] == 1]
        if len(part) >= 2:
            fit = collectives.fit_table(part).iloc[0]["fit"]
            return fit, f"notebook 03's saved fit ({run.label}, fit_table on the lower quartile of the calls)"
    except FileNotFoundError:
        pass
    grid = collectives.PROFILE_GRID[profile]
    df, _ = collectives.run_grid(
        grid["sizes"],
        ops=("all_reduce",),
        world_sizes=(2,),
        combos=((backend, device),),
        warmup=grid["warmup"],
        iters=grid["iters"],
        budget_s=grid["budget_s"],
    )
    assert df["wrong"].sum() == 0
    return collectives.fit_table(df).iloc[0]["fit"], f"measured here with notebook 03's {profile} grid and fit_table"
