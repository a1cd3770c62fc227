"""Notebook 02's sections 4 and 5, one call each: the norms' bandwidth against the copy (read from section 1's
loops), the published mark beside it, which implementation is measurably fastest, and torch.compile of the whole
model (saved beside section 2's model timings).

    bw = bandwidth_section(shapes, SCALE, device, profile)   # shapes: section 1's Timed
    assert bw.values["max_fraction_of_copy"] <= MAX_FRACTION_OF_COPY
    fraction_of_copy_figure(bw.big, SCALE["hidden"])          # the headline plot
"""

from __future__ import annotations

import pandas as pd

from helpers.env import machine_facts, usable_cores
from helpers.experiments.common import log_ticks
from helpers.experiments.rmsnorm_bench import (
    MAX_FRACTION_OF_COPY,
    bench_norm,
    check_fraction_of_copy,
    triton_timing_note,
)
from helpers.experiments.rmsnorm_compare import check_forward_le_both, fastest_lines, ratio_rows
from helpers.experiments.rmsnorm_model import COMPILE_PASSES, compare_compiled, compiled_lines
from helpers.experiments.rmsnorm_sections import Bandwidth, Timed, _ms, _named, _tidy, size_name, triton_timed, where
from helpers.results import save_results
from helpers.section import Result

TARGETS = {"fwd": 0.85, "fwd+bwd": 0.60}  # the kernels' goals on a GPU at H = TARGET_H: fractions of copy bandwidth
TARGET_H = 4096


def bandwidth_section(shapes: Timed, scale: dict, device, profile: str) -> Bandwidth:
    """Section 1's rows (plus Triton on a tiny shape where it runs in the interpreter) as achieved bandwidth over the
    copy's: saved (rmsnorm_bench), every implementation checked under MAX_FRACTION_OF_COPY. The table: fraction of
    copy and median ms per implementation at the profile's row count."""
    kernel_rows = []
    if not triton_timed(scale):  # the interpreter: a tiny shape, only to show it runs
        kernel_rows = [
            bench_norm("triton", *scale["triton_shape"], dt, device, backward, warmup=1, steps=3)
            for dt in scale["dtypes"]
            for backward in (False, True)
        ]
    bench = _ms(shapes.rows + kernel_rows)
    saved = save_results(bench, "rmsnorm_bench", profile=profile)
    big = bench[bench["rows"] == scale["rows"]]
    check_fraction_of_copy(big)  # every implementation <= MAX_FRACTION_OF_COPY of the copy bandwidth
    copy = big.groupby(["dtype", "H"])["copy_GBps"].median()
    notes = [
        triton_timing_note(scale["triton_shape"]),
        *(
            f"Triton (interpreter) {r['pass']} on {r['rows']} x {r['H']}: {r['median_s'] * 1e3:.1f} ms"
            for r in kernel_rows
        ),
        "copy bandwidth measured beside each shape: "
        + "; ".join(f"{dt} H={H}: {gbps:.1f} GB/s" for (dt, H), gbps in copy.items()),
        f"{scale['rows']} rows: fraction of copy bandwidth (checked <= {MAX_FRACTION_OF_COPY}) and median ms "
        f"· {where(profile)}",
    ]
    index = ["dtype", "pass", "H"]
    table = pd.concat(
        {
            "fraction of copy": big.pivot_table(index=index, columns="impl", values="frac_of_copy").round(2),
            "median ms": big.pivot_table(index=index, columns="impl", values="median_ms").round(3),
        },
        axis=1,
    )
    values = {"max_fraction_of_copy": float(big["frac_of_copy"].max())}
    return Bandwidth(table, notes=notes, saved=saved, values=values, bench=bench, big=big)


def fraction_of_copy_figure(big: pd.DataFrame, hidden, title: str = ""):
    """The headline plot: each implementation's fraction of copy bandwidth vs H, forward and forward+backward
    (float32), the copy's 1.0 dashed."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    f32 = big[big["dtype"] == "float32"]
    for ax, pass_ in zip(axes, ("fwd", "fwd+bwd"), strict=True):
        for impl, part in f32[f32["pass"] == pass_].groupby("impl"):
            part = part.sort_values("H")
            ax.plot(part["H"], part["frac_of_copy"], marker="o", label=impl)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set(xscale="log", xlabel="H (columns)", title=f"{pass_}, float32", ylabel="fraction of copy bandwidth")
        log_ticks(ax, hidden)
    axes[0].legend(fontsize=8)
    fig.suptitle(title or "RMSNorm bandwidth vs copy", fontsize=10)
    fig.tight_layout()
    return fig


def plot_bandwidth_mark(big: pd.DataFrame, mark, comparable: bool, title: str = ""):
    """Achieved GB/s per implementation vs H (float32, forward and forward+backward), with the published mark drawn
    as a labelled line (helpers.published): compared only on the device it was measured on."""
    import matplotlib.pyplot as plt

    from helpers.published import draw_mark

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    f32 = big[big["dtype"] == "float32"]
    for ax, pass_ in zip(axes, ("fwd", "fwd+bwd"), strict=True):
        for impl, part in f32[f32["pass"] == pass_].groupby("impl"):
            part = part.sort_values("H")
            ax.plot(part["H"], part["GBps"], marker="o", label=impl)
        draw_mark(ax, mark, comparable)
        ax.set(xscale="log", yscale="log", xlabel="H (columns)", ylabel="achieved GB/s", title=f"{pass_}, float32")
        log_ticks(ax, sorted(f32["H"].unique()))
    axes[0].legend(fontsize=7)
    fig.suptitle(title or "RMSNorm bandwidth against the published mark", fontsize=10)
    fig.tight_layout()
    return fig


def bandwidth_mark_table(big: pd.DataFrame, mark, comparable: bool) -> pd.DataFrame:
    """Beside the plot: the best GB/s per implementation and pass, and its "% of mark" where comparable."""
    from helpers.published import share_column

    best = big.groupby(["dtype", "pass", "impl"])["GBps"].max().reset_index()
    best[f"% of mark ({mark.label})"] = share_column(best["GBps"], mark, comparable)
    return best.set_index(["dtype", "pass", "impl"])


def mark_section(big: pd.DataFrame, profile: str) -> Result:
    """Achieved GB/s beside the published mark for memory-bound kernels (helpers.published), compared only where it
    was measured: an H100 at the gpu profile."""
    from helpers.published import MARKS

    mark, device = MARKS["rmsnorm_quack"], machine_facts()["device"]
    comparable = profile == "gpu" and "H100" in device
    title = f"RMSNorm achieved bandwidth · {where(profile)}"
    note = (
        f"{mark.name}: compared with this run (an H100 at the gpu profile)"
        if comparable
        else f"{mark.name}: drawn for scale only, this run ({device}, profile {profile}) is not comparable with it"
    )
    table = bandwidth_mark_table(big, mark, comparable=comparable).round(1)
    return Result(table, plot_bandwidth_mark(big, mark, comparable=comparable, title=title), notes=[note])


def _targets(big: pd.DataFrame, comps: dict, hidden) -> pd.DataFrame:
    """The Triton kernels' goals on a GPU (fractions of copy at TARGET_H; measurably faster than compiled and
    F.rms_norm at every H >= 2048), met or not."""
    at = big[big["H"] == TARGET_H].set_index(["dtype", "pass", "impl"])["frac_of_copy"]
    checks = []
    for dt in sorted(big["dtype"].unique()):
        for pass_, goal in TARGETS.items():
            checks.append((dt, f"{pass_} >= {goal:.0%} of copy at H={TARGET_H}", at[(dt, pass_, "triton")] >= goal))
        for H in [h for h in hidden if h >= 2048]:
            rs = [comps[(dt, H)].ratio("triton|fwd+bwd", f"{o}|fwd+bwd") for o in ("compiled", "F.rms_norm")]
            met = all(r.differs and r.median < 1 for r in rs)
            checks.append((dt, f"fwd+bwd measurably faster than compiled and F.rms_norm at H={H}", met))
    return pd.DataFrame(checks, columns=["dtype", "target", "met"])


def fastest_section(shapes: Timed, bandwidth: Bandwidth, scale: dict, profile: str) -> Result:
    """Per dtype, pass and H, the fastest implementation, named only when measurably faster than the runner-up in
    the same loop; on the gpu profile, the Triton kernels' targets (met or not)."""
    notes = [_tidy(line) for line in fastest_lines(shapes.rows, shapes.comps).splitlines()]
    if profile != "gpu":
        notes.append(
            f"the Triton kernels' targets (at H={TARGET_H}: forward >= {TARGETS['fwd']:.0%} and forward+backward >= "
            f"{TARGETS['fwd+bwd']:.0%} of copy bandwidth) are judged on the gpu profile, where they are compiled"
        )
        return Result(notes=notes)
    table = _targets(bandwidth.big, shapes.comps, scale["hidden"])
    notes.append(f"targets met: {int(table['met'].sum())} of {len(table)}")
    return Result(table, notes=notes, values={"targets_met": int(table["met"].sum()), "targets": len(table)})


def compile_section(models: Timed, scale: dict, sizes, device, profile: str) -> Timed:
    """The rmsnorm model eager and under torch.compile (same weights) in one interleaved loop per size of the
    profile's compile_model_sizes that the card holds (rmsnorm_sections.fit_card); forward <= forward+backward
    checked. Saved with section 2's model timings (rmsnorm_models) and every pair's ratio of both loops
    (rmsnorm_model_ratios, which the answers page reads)."""
    sizes_c = scale["compile_model_sizes"]
    B, W, S = scale["batch"], scale["warmup"], scale["steps"]
    rows, comps = [], {}
    for size in sizes_c:  # eager and compiled (sharing weights) in one interleaved loop per size
        rows_, comps[size_name(size)] = compare_compiled(size, device, B, W, S)
        rows += _named(rows_)
    whole = _ms(rows)
    saved = save_results(
        pd.concat([_ms(models.rows), whole[whole["compiled"]]], ignore_index=True), "rmsnorm_models", profile=profile
    )
    save_results(
        ratio_rows(models.comps, ("size",), loop="norms")
        + ratio_rows(comps, ("size",), passes=COMPILE_PASSES, loop="compile"),
        "rmsnorm_model_ratios",
        profile=profile,
    )  # saved first: a tripped bound below still leaves both loops' rows
    low = check_forward_le_both(comps)
    notes = [
        f"model with rmsnorm, median ms, eager and compiled interleaved in one loop per size (its eager column is "
        f"this loop's own measurement, not section 2's) · {where(profile)}",
        *(_tidy(line) for line in compiled_lines(comps).splitlines()),
        "every pair's ratio of this loop and section 2's is saved for the answers page (rmsnorm_model_ratios)",
        *scale.get("left_out", []),  # what this GPU could not hold (rmsnorm_sections.fit_card)
    ]
    if len(sizes_c) < len(sizes):
        cores = f" on {usable_cores()} cores" if profile == "cpu" else ""
        notes.insert(
            0,
            f"compiled here: {', '.join(map(size_name, sizes_c))} of the profile's {len(sizes)} sizes (compiling "
            f"each takes tens of seconds{cores})",
        )
    table = whole.pivot_table(index=["size", "pass"], columns="compiled", values="median_ms", sort=False)
    table = table.rename(columns={False: "eager", True: "compiled"}).round(2)
    return Timed(table, notes=notes, saved=saved, values={"forward_over_both_low": low}, rows=rows, comps=comps)
