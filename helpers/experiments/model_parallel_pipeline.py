"""Notebook 08's pipeline section: GPipe, 1F1B and interleaved 1F1B on p ranks, one launch, then one Result per claim.

run = pipeline_run(CONFIG, profile)      # p = CONFIG["pipe_world"] ranks, m = CONFIG["pipe_micro"] micro-batches,
                                         # v = CONFIG["pipe_chunks"] chunks per rank in the interleaved schedule
gradients_section(run)                   # each stage's gradients within the bound of one process, whole batch
bubble_section(run)                      # measured idle share per rank against (p − 1)/(v·m + p − 1), timelines
memory_section(run)                      # peak activations per stage in micro-batches: GPipe m, 1F1B p − s, ...
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist

from helpers import launch as L
from helpers.env import usable_cores
from helpers.formulas import model_parallel as FM
from helpers.memory import track
from helpers.model import ModelConfig, build_model, lm_loss, random_batch
from helpers.pipeline import (
    SCHEDULES,
    FixedCostStage,
    PipelineStage,
    bubble_of,
    check_pipeline,
    handoff_latency,
    held_micro_batches,
    replay,
    run_schedule,
    schedule,
)
from helpers.results import save_results
from helpers.section import Result

BUBBLE_TOL = 0.02  # |measured − replayed| idle share: the replay (helpers.pipeline.replay) takes each pass's measured
# duration and the median measured handoff latency; what is left is the spread of the handoffs around their median


@dataclass
class PipeRun:
    """Each rank's measurements and the configuration they ran."""

    ranks: list
    config: dict
    profile: str
    where: str
    device: str = "cpu"  # where the stages ran
    own_device: bool = False  # a GPU per rank: no rank waits for another's compute, so the replay is held to

    @property
    def p(self) -> int:
        return len(self.ranks)

    @property
    def m(self) -> int:
        return self.config["pipe_micro"]

    def chunks(self, kind: str) -> int:
        """Chunks per rank under schedule `kind`: v for the interleaved one, else 1."""
        return self.config["pipe_chunks"] if kind == "interleaved" else 1


def pipe_model(config: dict) -> ModelConfig:
    """The pipeline's model: the profile's, with config['pipe_layers'] blocks and its own width when given."""
    return dataclasses.replace(config["model"], n_layers=config["pipe_layers"], **config.get("pipe_overrides", {}))


def pipeline_worker(
    cfg: ModelConfig, batch_size: int, micro_batches: int, timed_steps: int, fixed_ms: tuple, chunks: int, seed=0
) -> dict:
    """On every rank: one process's gradients on the whole batch; per schedule (interleaved: `chunks` per rank), this
    stage's gradients after one step, its compute timeline over `timed_steps` steps, its activation peak, one
    micro-batch's saved bytes per chunk, and the timelines of the same stage made to cost fixed_ms = (forward,
    backward) milliseconds more per micro-batch, 1/v of it per chunk's pass (timed_steps=0: the gradients alone)."""
    dev, rank, world = L.device(), dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    full = build_model(cfg).to(dev)
    x, y = (t.to(dev) for t in random_batch(cfg, batch_size, generator=torch.Generator().manual_seed(seed + 1)))
    lm_loss(full(x), y).backward()
    ref = {n: p.grad for n, p in full.named_parameters()}
    tiny = build_model(dataclasses.replace(cfg, d_model=8, d_ff=8, n_heads=1)).to(dev)  # for the fixed-cost stages
    out = {"rank": rank}
    for kind in SCHEDULES:
        v = chunks if kind == "interleaved" else 1
        stage = PipelineStage(full, rank, world, v)
        lines = [schedule(kind, world, micro_batches, r, v) for r in range(world)]  # every rank's, for the sends
        actions = lines[rank]
        step = functools.partial(run_schedule, stage, actions, x, y, micro_batches, cfg.d_model, lines=lines)
        step()
        diffs = {
            n: (float((p.grad - ref[n]).abs().max()), float(ref[n].abs().max())) for n, p in stage.named_parameters()
        }
        if not timed_steps:  # gradients only
            out[kind] = {"diffs": diffs}
            continue
        timelines = [step() for _ in range(timed_steps)]
        trace = track(step, existing=[*stage.parameters(), *(p.grad for p in stage.parameters())])
        fixed = FixedCostStage(PipelineStage(tiny, rank, world, v), fixed_ms[0] / 1e3 / v, fixed_ms[1] / 1e3 / v)
        fixed_step = functools.partial(run_schedule, fixed, actions, x, y, micro_batches, tiny.cfg.d_model, lines=lines)
        fixed_lines = [fixed_step() for _ in range(timed_steps)]
        out[kind] = {
            "diffs": diffs,
            "timelines": timelines,
            "fixed_timelines": fixed_lines,
            "peak_bytes": trace.peak_bytes - trace.baseline_bytes,
            "chunk_bytes": _chunk_bytes(stage, x[: batch_size // micro_batches], cfg),
        }
    return out


def _chunk_bytes(stage: PipelineStage, ids: torch.Tensor, cfg: ModelConfig) -> list[int]:
    """Per chunk, bytes one micro-batch's forward leaves alive on this stage: its received input, saved tensors and
    output."""
    out = []
    for chunk in range(stage.chunks):
        first = stage.takes_ids(chunk)
        inp = ids if first else torch.randn(*ids.shape, cfg.d_model, device=ids.device, requires_grad=True)
        trace = track(lambda inp=inp, chunk=chunk: stage(inp, chunk), existing=[*stage.parameters(), inp])
        out.append(trace.current_bytes - trace.baseline_bytes + (0 if first else inp.nbytes))
    return out


def pipeline_run(config: dict, profile: str, backend: str = "auto", device: str = "auto") -> PipeRun:
    """Check the cut (a clear error before any rank starts), launch the worker on config['pipe_world'] ranks."""
    cfg, p, m, v = pipe_model(config), config["pipe_world"], config["pipe_micro"], config["pipe_chunks"]
    batch = config.get("pipe_batch", config["batch"] * m)
    check_pipeline(cfg.n_layers, p, m, batch, v)
    args = (cfg, batch, m, config.get("pipe_steps", 3), config.get("pipe_fixed_ms", (10, 20)), v)
    ranks = L.launch(pipeline_worker, p, *args, backend=backend, device=device)
    b, d = L.choose_backend(p, backend, device)
    where = f"{profile} profile · {b} on {d}, {p} stages, {m} micro-batches, {v} chunks per stage interleaved"
    own = d == "cuda" and torch.cuda.device_count() >= p  # fewer GPUs than ranks: ranks share one (gloo)
    return PipeRun(ranks, config, profile, where, d, own)


def gradients_section(run: PipeRun) -> Result:
    """Every stage's gradients after one step of each schedule against one process on the whole batch."""
    cfg = pipe_model(run.config)
    rows = []
    for r in run.ranks:
        for kind in SCHEDULES:
            worst, check = FM.worst_against(
                r[kind]["diffs"], lambda scale: FM.reorder_bound(cfg, cfg.context_length, run.m, scale)
            )
            rows.append(dict(schedule=kind, stage=r["rank"], worst=worst, **check))
    table = pd.DataFrame(rows)
    path = save_results(table, "08_pipeline_gradients", profile=run.profile, stages=run.p, micro_batches=run.m)
    worst = float(table["diff/bound"].max())
    notes = [f"Every stage's gradients are within {worst:.2%} of their bound 2·(n + m)·u·max|ref| · {run.where}."]
    return Result(table=table, notes=notes, saved=path, values={"worst_ratio": worst})


def bubble_table(run: PipeRun) -> pd.DataFrame:
    """Per schedule, kind of stage and rank (last timed step): the measured idle share; the replayed one (the passes'
    measured durations and handoff latency, through the schedule's dependencies: what the machine explains); the
    formula (p − 1)/(m + p − 1) (equal passes, no latency, which replay() reproduces exactly)."""
    rows = []
    for kind in SCHEDULES:
        formula = FM.bubble_fraction(run.p, run.m, run.chunks(kind))
        for stages, key in [("model", "timelines"), ("fixed cost", "fixed_timelines")]:
            lines = [r[kind][key][-1] for r in run.ranks]
            latency = handoff_latency(lines)
            measured, replayed = bubble_of(lines), bubble_of(replay(lines, latency=latency))
            busy = [sum(e - s for *_, s, e in line) for line in lines]
            for rank in range(run.p):
                rows.append(
                    dict(
                        schedule=kind,
                        stages=stages,
                        rank=rank,
                        bubble=measured[rank],
                        replayed=replayed[rank],
                        formula=formula,
                        handoff_ms=latency * 1e3,
                        imbalance=max(busy) / min(busy),
                        within=abs(measured[rank] - replayed[rank]) <= BUBBLE_TOL,
                    )
                )
    return pd.DataFrame(rows)


def timeline_figure(run: PipeRun):
    """One panel per schedule and kind of stage: each rank's forwards and backwards over the last timed step."""
    import matplotlib.pyplot as plt

    panels = [(k, st) for k in SCHEDULES for st in ("timelines", "fixed_timelines")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 0.9 + 0.4 * run.p * len(panels)))
    colors = {"F": ("tab:blue", "tab:cyan"), "B": ("tab:orange", "tab:red")}  # by chunk (interleaved: two shades)
    for ax, (kind, key) in zip(axes, panels, strict=True):
        t0 = min(r[kind][key][-1][0][3] for r in run.ranks)
        for r in run.ranks:
            for k, i, c, s, e in ((k, i, c, s - t0, e - t0) for k, i, c, s, e in r[kind][key][-1]):
                color = colors[k][c % 2]
                ax.barh(r["rank"], (e - s) * 1e3, left=s * 1e3, color=color, edgecolor="white")
                ax.text((s + e) / 2 * 1e3, r["rank"], str(i), ha="center", va="center", fontsize=7, color="white")
        ax.set_yticks(range(run.p), [f"stage {s}" for s in range(run.p)])
        ax.invert_yaxis()
        what = "the model's stages" if key == "timelines" else "stages of fixed cost"
        odd = " (odd chunks cyan / red)" if run.chunks(kind) > 1 else ""
        ax.set_title(f"{kind}, {what}: forward (blue), backward (orange){odd}, per micro-batch", fontsize=9)
    axes[-1].set_xlabel("ms from the step's start")
    fig.tight_layout()
    return fig


def bubble_section(run: PipeRun) -> Result:
    """The bubble of each schedule, measured from every rank's timeline, against the formula and the replay."""
    table = bubble_table(run)
    path = save_results(table, "08_pipeline_bubble", profile=run.profile, stages=run.p, micro_batches=run.m)
    mean = table.groupby(["stages", "schedule"])["bubble"].mean()
    equal, v = FM.bubble_fraction(run.p, run.m), run.config["pipe_chunks"]
    notes = [
        f"Idle share, mean over ranks: GPipe {mean[('model', 'gpipe')]:.3f}, 1F1B {mean[('model', '1f1b')]:.3f}, "
        f"interleaved 1F1B {mean[('model', 'interleaved')]:.3f} with the model's stages; "
        f"{mean[('fixed cost', 'gpipe')]:.3f}, {mean[('fixed cost', '1f1b')]:.3f} and "
        f"{mean[('fixed cost', 'interleaved')]:.3f} with stages of fixed cost; against (p − 1)/(m + p − 1) = "
        f"{equal:.3f} for equal passes and free handoffs, and (p − 1)/(v·m + p − 1) = "
        f"{FM.bubble_fraction(run.p, run.m, v):.3f} interleaved with v = {v} chunks per rank.",
        f"Replaying each step through the schedule's dependencies with the passes' measured durations and handoff "
        f"latency (median {table['handoff_ms'].median():.2f} ms) gives the measured idle share within ±{BUBBLE_TOL} "
        f"in {int(table['within'].sum())} of {len(table)} rows: what exceeds the formula is unequal passes (the "
        f"busiest rank computed up to {table['imbalance'].max():.2f}x the least busy) and latency · {run.where}.",
    ]
    load, cores = os.getloadavg()[0], usable_cores()
    held = run.own_device  # a device per rank: no rank waits for another's compute
    if not held:
        shared = (
            f"{run.device} (load average {load:.1f} on {cores} cores): they share cores with each other and with "
            "this kernel, so a rank can wait for a core between passes"
            if run.device != "cuda"
            else f"fewer GPUs than its {run.p} ranks: they share a GPU, so a rank can wait for another's kernels"
        )
        notes.append(
            f"Here the ranks ran on {shared}, idle time no dependency explains; the replay is a reading aid here, not "
            f"held to the measurement. On GPUs, a device per rank, it is (±{BUBBLE_TOL})."
        )
    values = {
        "all_within": bool(table["within"].all()),
        "held_to_replay": held,
        "mean": {"/".join(k): v for k, v in mean.items()},
    }
    return Result(table=table, notes=notes, saved=path, values=values)  # the timelines: timeline_figure(run)


def memory_section(run: PipeRun) -> Result:
    """Each stage's activation peak, in units of one micro-batch's saved bytes (through all its chunks), against the
    micro-batches the schedule holds: GPipe m, 1F1B p − s, interleaved its warm-up's chunk passes and one more,
    each weighted by its chunk's bytes (`formula`: the closed form for chunks of equal size); the peak may exceed
    them by at most one backward's temporaries."""
    rows = []
    for r in run.ranks:
        for kind in SCHEDULES:
            v, chunk_bytes = run.chunks(kind), r[kind]["chunk_bytes"]
            held = held_micro_batches(schedule(kind, run.p, run.m, r["rank"], v), chunk_bytes)
            units = r[kind]["peak_bytes"] / sum(chunk_bytes)
            rows.append(
                dict(
                    schedule=kind,
                    stage=r["rank"],
                    peak_bytes=r[kind]["peak_bytes"],
                    micro_batch_bytes=sum(chunk_bytes),
                    peak_in_micro_batches=units,
                    held=held,
                    formula=FM.pipeline_peak_micro_batches(kind, run.p, run.m, r["rank"], v),
                    within=held <= units <= held + 1,
                )
            )
    table = pd.DataFrame(rows)
    path = save_results(table, "08_pipeline_memory", profile=run.profile, stages=run.p, micro_batches=run.m)
    by = table.set_index(["schedule", "stage"])["peak_in_micro_batches"]
    held = table.set_index(["schedule", "stage"])["held"]
    notes = [
        f"Stage 0 peaks at {by[('gpipe', 0)]:.2f} micro-batches' activations under GPipe (m = {run.m}), "
        f"{by[('1f1b', 0)]:.2f} under 1F1B (p = {run.p}) and {by[('interleaved', 0)]:.2f} interleaved (its schedule "
        f"holds {held[('interleaved', 0)]:.2f}: the longer warm-up is the price of the smaller bubble); "
        f"{int(table['within'].sum())} of {len(table)} rows within [k, k + 1] of the k its schedule holds · "
        f"{run.where}."
    ]
    return Result(table=table, notes=notes, saved=path, values={"all_within": bool(table["within"].all())})
