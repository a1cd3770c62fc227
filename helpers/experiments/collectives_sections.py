"""Notebook 03's sections, one call each: run or read the grid, check what must hold (every result exact, busbw =
size / time x factor), save with provenance, and return a Result (helpers.section) whose sentences are made from
the same numbers as its table.

    run = run_section(profile)                     # the profile's grid, checked and saved (03_collectives)
    run                                            # notes, the all-reduce table, where it was saved
    assert run.values["wrong"] == 0
    slopes_section(run.df); latency_section(run.df, fit_table(run.df)); ops_section(run.df)
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from helpers.budget import auto_scale
from helpers.env import machine_facts, usable_cores
from helpers.experiments.collectives import (
    METHOD,
    OPS,
    PROFILE_GRID,
    RESULTS_NAME,
    format_size,
    op_ratios,
    plan,
    plot_collectives,
    run_grid,
    two_node_rehearsal,
    unpaired_ratios,
)
from helpers.experiments.collectives_tables import fit_table
from helpers.formulas import busbw_factor
from helpers.launch import topology_label
from helpers.results import ROOT, find_results, load_results, save_results
from helpers.section import Result

MAX_MEDIAN_REL_ERR = 0.5  # the α–β fit describes a typical all-reduce point within a factor of 1.5
REHEARSAL_COLUMNS = ["backend", "device", "world_size", "nodes", "topology", "size", "time_s", "p25_s", "p75_s"]


@dataclass(repr=False)  # Result's own repr: notes and table
class Grid(Result):
    """run_section's Result, with every row (`df`) and the plan with what did not run (`todo`)."""

    df: pd.DataFrame | None = None
    todo: pd.DataFrame | None = None


@dataclass(repr=False)
class Saved(Result):
    """saved_section's Result, with every saved run (helpers.results.Results) to plot."""

    runs: list = field(default_factory=list)


def where(profile: str) -> str:
    """The plots' and tables' caption: this machine and the profile."""
    return f"{machine_facts()['device']} · {profile} profile"


def _allreduce(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["op"] == "all_reduce"]


def grid_section(profile: str) -> Result:
    """What the profile runs (sizes, process counts, calls) and what it leaves out of the seed's grid (the gpu
    profile); the table: which (backend, device, process count) can run here, or why not."""
    grid, full = PROFILE_GRID[profile], PROFILE_GRID["gpu"]
    left_out = {
        "sizes": [format_size(s) for s in full["sizes"] if s not in grid["sizes"]],
        "process counts": [n for n in full["world_sizes"] if n not in grid["world_sizes"]],
        "backend+device": [f"{b}+{d}" for b, d in full["combos"] if (b, d) not in grid["combos"]],
    }
    notes = [
        f"{profile} profile: sizes {[format_size(s) for s in grid['sizes']]}, {grid['world_sizes']} processes, "
        f"{grid['warmup']} warm-up + up to {grid['iters']} timed calls each (time budget per point: "
        f"{grid['budget_s'] or 'none'} s, at least 3 calls), on {usable_cores()} cores",
        f"left out of the seed's grid here: { ({k: v for k, v in left_out.items() if v} or 'nothing') }",
    ]
    todo = plan(grid["world_sizes"], grid["combos"])
    return Result(todo, notes=notes, values={"runnable": int(todo["run"].sum())})


def allreduce_table(df: pd.DataFrame) -> pd.DataFrame:
    """All-reduce time (ms) and busbw (GB/s) per size (rows) and configuration (columns)."""
    part = _allreduce(df)
    table = part.assign(time_ms=part["time_s"] * 1e3).pivot_table(
        index="size_bytes", columns=["backend", "device", "world_size"], values=["time_ms", "busbw_GBps"]
    )
    table.index = [format_size(s) for s in table.index]
    return table


def check_rows(df: pd.DataFrame) -> None:
    """What must hold of every row: no wrong result (inputs are integers far below 2**24, so float32 sums are exact
    in any order: tolerance zero), and busbw = size / time x the nccl-tests factor (float rounding, rtol 1e-9)."""
    assert df["wrong"].sum() == 0, df[df["wrong"] > 0]
    factor = [busbw_factor(op, n) for op, n in zip(df["op"], df["world_size"], strict=True)]
    np.testing.assert_allclose(df["busbw_GBps"], df["size_bytes"] / df["time_s"] * factor / 1e9, rtol=1e-9)


def run_section(profile: str, grid: dict | None = None) -> Grid:
    """Every runnable configuration of the profile's grid (or `grid`, shaped as PROFILE_GRID's), one launch each;
    saved (03_collectives, which the answers page and the front page read), then checked (check_rows). The table:
    all-reduce time and busbw."""
    grid = grid or PROFILE_GRID[profile]
    start = time.perf_counter()
    df, todo = run_grid(
        grid["sizes"],
        OPS,
        grid["world_sizes"],
        grid["combos"],
        grid["warmup"],
        grid["iters"],
        budget_s=grid["budget_s"] * (auto_scale() if profile == "cpu" else 1),  # make test's half, as the budgets'
    )
    took = time.perf_counter() - start
    if df.empty:
        raise RuntimeError("no configuration of the grid ran here:\n" + todo.to_string(index=False))
    saved = save_results(df, "03_collectives", profile=profile, method=METHOD)
    check_rows(df)  # after saving: a wrong row stays on disk to look at
    notes = [
        f"{len(df)} rows from {int(todo['run'].sum())} launches in {took:.0f} s; all {int(df['iters'].sum())} timed "
        f"results were exactly right, and busbw = size / time x factor in every row",
        *(
            f"not run: {r.backend}+{r.device}, {r.world_size} ranks: {r.reason}"
            for r in todo[~todo["run"]].itertuples()
        ),
        f"all_reduce on {where(profile)}: time (ms) and busbw (GB/s)",
    ]
    values = {"wrong": int(df["wrong"].sum()), "timed_calls": int(df["iters"].sum())}
    return Grid(allreduce_table(df).round(3), notes=notes, saved=saved, values=values, df=df, todo=todo)


def steadiness_section(df: pd.DataFrame) -> Result:
    """p75 / p25 of the calls per (backend, device, process count, op): 1.0 when every call took the same time."""
    ratio = df.assign(p75_over_p25=df["p75_s"] / df["p25_s"])
    groups = ratio.groupby(["backend", "device", "world_size", "op"])["p75_over_p25"]
    table = groups.describe()[["min", "50%", "max"]]
    worst = ratio.loc[ratio["p75_over_p25"].idxmax()]
    note = (
        f"p75 / p25 per point: median {ratio['p75_over_p25'].median():.2f} over the {len(ratio)} points; the least "
        f"steady, {worst['p75_over_p25']:.2f}, is {worst['op']} of {worst['size']} on {worst['backend']}+"
        f"{worst['device']} with {worst['world_size']} ranks"
    )
    return Result(table.round(2), notes=[note], values={"median": float(ratio["p75_over_p25"].median())})


def fit_section(fits: pd.DataFrame) -> Result:
    """The α–β fits (fit_table) and the worst all-reduce fit's median relative error, against MAX_MEDIAN_REL_ERR."""
    worst = fits[fits["op"] == "all_reduce"].nlargest(1, "median_rel_err").iloc[0]
    note = (
        f"worst all-reduce fit ({worst['backend']}+{worst['device']}, {worst['world_size']} ranks): median relative "
        f"error {worst['median_rel_err']:.1%}, max {worst['max_rel_err']:.1%} (bound on the median "
        f"{MAX_MEDIAN_REL_ERR:.0%})"
    )
    table = (
        fits.drop(columns="fit")
        .style.format(
            {
                "alpha_us": "{:.1f}",
                "beta_GBps": "{:.3f}",
                "crossover_bytes": "{:,.0f}",
                "median_rel_err": "{:.1%}",
                "max_rel_err": "{:.1%}",
            }
        )
        .hide(axis="index")
    )
    return Result(table, notes=[note], values={"worst_median_rel_err": float(worst["median_rel_err"])})


def slopes_section(df: pd.DataFrame) -> Result:
    """Per all-reduce configuration, the log-log slope of time (p25) over size between the two smallest and the two
    largest sizes: 0 latency-bound, 1 bandwidth-bound."""
    rows, notes = [], []
    for (backend, device, n), g in _allreduce(df).groupby(["backend", "device", "world_size"]):
        g = g.sort_values("size_bytes")
        x, t = np.log(g["size_bytes"].to_numpy()), np.log(g["p25_s"].to_numpy())
        small, large = (t[1] - t[0]) / (x[1] - x[0]), (t[-1] - t[-2]) / (x[-1] - x[-2])
        longer = g["p25_s"].iloc[-1] / g["p25_s"].iloc[0]
        more = g["size_bytes"].iloc[-1] / g["size_bytes"].iloc[0]
        rows.append(dict(backend=backend, device=device, world_size=n, slope_smallest=small, slope_largest=large))
        notes.append(
            f"{backend}+{device}, {n} ranks: slope {small:.2f} at the smallest sizes, {large:.2f} at the largest; "
            f"{g['size'].iloc[-1]} takes {longer:.0f}x as long as {g['size'].iloc[0]} for {more:.0f}x the bytes"
        )
    return Result(pd.DataFrame(rows).set_index(["backend", "device", "world_size"]).round(2), notes=notes)


def latency_section(df: pd.DataFrame, fits: pd.DataFrame) -> Result:
    """Per all-reduce fit: α, β, the size α·β below which α is more than half the time, and α's share of the
    smallest size's fitted (p25) time."""
    part, rows, notes = _allreduce(df), [], []
    for fit in fits[fits["op"] == "all_reduce"].itertuples():
        mine = part[(part.backend == fit.backend) & (part.device == fit.device) & (part.world_size == fit.world_size)]
        smallest = mine.nsmallest(1, "size_bytes").iloc[0]
        share = fit.alpha_us / 1e6 / smallest["p25_s"]
        rows.append(
            dict(backend=fit.backend, device=fit.device, world_size=fit.world_size, alpha_us=fit.alpha_us,
                 beta_GBps=fit.beta_GBps, latency_bound_below=format_size(int(fit.crossover_bytes)),
                 alpha_share_at_smallest=share)
        )  # fmt: skip
        notes.append(
            f"{fit.backend}+{fit.device}, {fit.world_size} ranks: α = {fit.alpha_us:.0f} µs, β = {fit.beta_GBps:.2f} "
            f"GB/s, so messages below α·β ≈ {format_size(int(fit.crossover_bytes))} are latency-bound; at "
            f"{smallest['size']} the fitted α is {share:.0%} of the time fitted (p25)"
        )
    table = pd.DataFrame(rows).set_index(["backend", "device", "world_size"]).round(2)
    return Result(table, notes=notes)


def ranks_section(df: pd.DataFrame) -> Result:
    """The largest all-reduce per (backend, device) at each process count: time and busbw, and where the ranks
    outnumber the cores (they take turns)."""
    part = _allreduce(df)
    largest = part[part["size_bytes"] == part["size_bytes"].max()].sort_values(["backend", "device", "world_size"])
    notes, cores = [], usable_cores()
    for (backend, device), g in largest.groupby(["backend", "device"]):
        steps = ", ".join(
            f"{n} ranks {t * 1e3:.2f} ms ({b:.2f} GB/s busbw)"
            for n, t, b in zip(g.world_size, g.time_s, g.busbw_GBps, strict=True)
        )
        notes.append(f"{backend}+{device}, all-reduce of {g['size'].iloc[0]}: {steps}")
        if g["world_size"].max() > cores and device == "cpu":
            notes.append(f"({g['world_size'].max()} ranks on {cores} cores: oversubscribed, the ranks take turns)")
    ms = {f"{q}_ms": largest[f"{q}_s"] * 1e3 for q in ("p25", "time", "p75")}
    table = largest.assign(**ms).set_index(["backend", "device", "world_size"])
    return Result(table[["size", *ms, "busbw_GBps"]].round(3), notes=notes)


def ops_section(df: pd.DataFrame) -> Result:
    """Each op's time over all-reduce's at the largest size with enough calls (op_ratios: paired by call within
    one launch); sentences for all-gather, and how often gloo's reduce-scatter was measurably faster."""
    ratios = op_ratios(df)
    notes = [
        f"{r.backend}+{r.device}, {r.world_size} ranks, {r.size}: {r.verdict}"
        for r in ratios[ratios["op"] == "all_gather"].itertuples()
    ]
    gloo_rs = ratios[(ratios["backend"] == "gloo") & (ratios["op"] == "reduce_scatter")]
    faster = int((gloo_rs["measurable"] & (gloo_rs["ratio"] < 1)).sum())
    notes.append(
        f"gloo reduce_scatter measurably faster than its all_reduce in {faster} of {len(gloo_rs)} configuration(s)"
    )
    inside = bool(((ratios["ci_low"] <= ratios["ratio"]) & (ratios["ratio"] <= ratios["ci_high"])).all())
    values = {"gloo_reduce_scatter_faster": faster, "medians_inside_intervals": inside}
    return Result(ratios.drop(columns="verdict").round(2), notes=notes, values=values)


def backends_section(df: pd.DataFrame) -> Result:
    """Every other (backend, device) against NCCL on CUDA, where this machine ran NCCL: unpaired ratios of median
    times, a winner only where the quartile ranges do not overlap."""
    part = _allreduce(df)
    combos = set(zip(part["backend"], part["device"], strict=True))
    if ("nccl", "cuda") not in combos:
        gpus = machine_facts()["gpu_count"]
        note = (
            f"not measurable here: NCCL needs one GPU per rank and this machine has {gpus}; run the gpu profile "
            "(or the torchrun entry point) on a multi-GPU node and its results appear below"
        )
        return Result(notes=[note])
    frames, notes = [], []
    for other in sorted(combos - {("nccl", "cuda")}):
        vs = unpaired_ratios(part, other)  # different launches: not paired
        frames.append(vs.assign(vs=f"{other[0]}+{other[1]} / nccl+cuda"))
        notes.append(
            f"{other[0]}+{other[1]} / NCCL: median {vs.ratio.median():.0f}x ({vs.ratio.min():.0f}x to "
            f"{vs.ratio.max():.0f}x) over {len(vs)} points; NCCL faster (quartile ranges apart) at "
            f"{int((vs.apart & (vs.ratio > 1)).sum())}, within each other's quartiles at {int((~vs.apart).sum())}"
        )
    table = pd.concat(frames, ignore_index=True) if frames else None
    return Result(table, notes=notes)


def torchrun_section(profile: str, sizes: int = 4, timeout_s: float = 300) -> Result:
    """`python -m helpers bench collectives` under torchrun, two ranks on this machine, all-reduce of the profile's
    first `sizes` sizes: it must exit 0, rank 0 alone saving its rows as RESULTS_NAME, one per size asked, two ranks
    on one node, every result exact; notes: the command and its summary. (make test runs it in notebook 03: the
    torchrun entry point's test.)"""
    asked = list(PROFILE_GRID[profile]["sizes"][:sizes])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "helpers", "bench", "collectives", "--profile", profile, "--ops", "all_reduce"]
    cmd += ["--sizes", *[f"{s}B" for s in asked]]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stdout + done.stderr
    saved = [line.removeprefix("saved ") for line in done.stdout.splitlines() if line.startswith("saved ")]
    assert len(saved) == 1, done.stdout  # rank 0 reports and saves; rank 1 stays quiet
    rows = load_results(saved[0]).frame()
    assert rows["size_bytes"].tolist() == asked, rows
    assert (rows["world_size"] == 2).all() and (rows["nodes"] == 1).all() and (rows["wrong"] == 0).all(), rows
    shown = shlex.join(["python", *cmd[1:]])
    return Result(notes=[f"ran: {shown}", done.stdout.strip().splitlines()[-1]], values={"returncode": 0})


def saved_section() -> Saved:
    """Every saved run of RESULTS_NAME (this machine's and the committed reference runs), each checked exact; the
    table: one row per run."""
    runs = [load_results(p) for kind in ("local", "reference") for p in find_results(RESULTS_NAME, kind)]
    rows = []
    for run in runs:
        df = run.frame()
        assert df["wrong"].sum() == 0, f"{run.path}: wrong results"
        rows.append({"run": run.label, "folder": run.path.parent.parent.name, "rows": len(df)})
    note = f"{len(runs)} saved run(s) of {RESULTS_NAME!r}" + ("" if runs else ": nothing to show yet")
    return Saved(pd.DataFrame(rows) if rows else None, notes=[note], runs=runs)


def plot_saved(run):
    """One saved run drawn as the grid above: time with its α–β fits, and busbw."""
    df = run.frame()
    return plot_collectives(df, fit_table(df), title=f"{run.label} ({run.path.parent.parent.name})")


def rehearsal_section(profile: str) -> Result:
    """The two-node path rehearsed on this machine (two torchrun agents, gloo, loopback): every result exact, two
    nodes, two ranks, one row per size asked, each timed, the provenance's topology saying so; saved
    (03_two_node_rehearsal); notes: the agents' commands. (make test runs it in notebook 03: the rehearsal's test.)"""
    sizes = list(PROFILE_GRID[profile]["sizes"][:2])
    rehearsal = two_node_rehearsal(sizes, profile=profile)  # raises with the stderr
    assert (rehearsal["wrong"] == 0).all() and (rehearsal["nodes"] == 2).all() and (rehearsal["world_size"] == 2).all()
    assert rehearsal["size_bytes"].tolist() == sizes and (rehearsal["time_s"] > 0).all(), rehearsal
    assert (rehearsal["topology"] == topology_label(nodes=2, hosts=1)).all(), rehearsal["topology"].unique()
    saved = save_results(rehearsal, "03_two_node_rehearsal", profile=profile)
    table = rehearsal[[*REHEARSAL_COLUMNS, "iters", "wrong"]]
    return Result(table, notes=list(rehearsal.attrs["commands"]), saved=saved, values={"rows": len(rehearsal)})
