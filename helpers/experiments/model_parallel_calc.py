"""Notebook 08's last section: when is tensor parallelism communication-bound? The α-β model meets the runs.

run = tp_speed_run(CONFIG, profile)     # one launch: all-reduce times per size, TP feed-forward steps per width
speed_section(run)                      # measured communication share against tp_ffn_seconds's prediction
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers import launch as L
from helpers.experiments.collectives_tables import fit_alpha_beta
from helpers.formulas import model_parallel as FM
from helpers.results import save_results
from helpers.section import Result
from helpers.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from helpers.timing import benchmark, time_one

SHARE_TOL = 0.15  # |measured − predicted| communication share counted as "the model holds" (absolute)


@dataclass
class SpeedRun:
    ranks: list
    sizes: dict
    profile: str
    where: str


ALL_REDUCE_CALLS = 8  # all-reduces per timed sample, back to back between one pair of syncs (events on CUDA)
FIT_SIZES = tuple(2.0**k for k in range(-4, 3))  # the α-β fit's sizes, in units of S = B·D·4 bytes: S/16 ... 4S


def _median_s(fn, reps: int, dev) -> float:
    """Median seconds of fn() alone on the device (helpers.timing.time_one) over `reps` calls after one warm-up,
    every rank starting each call together."""
    fn()
    out = []
    for _ in range(reps):
        dist.barrier()
        out.append(time_one(fn, dev))
    return float(np.median(out))


def all_reduce_seconds(sizes: list, reps: int, dev, calls: int = ALL_REDUCE_CALLS) -> dict:
    """Per size (bytes): seconds of one all-reduce alone, the median of `reps` samples of `calls` back-to-back calls
    on one preallocated buffer of zeros (nothing to allocate or fill, no sync between the calls: on a GPU a host
    synchronize costs tens of µs, which would land in α), after one untimed sample; helpers.timing.benchmark."""
    buf = torch.zeros(max(sizes) // 4, device=dev)  # (largest/4,) fp32, sliced per size

    def calls_of(view):
        for _ in range(calls):
            dist.all_reduce(view)

    out = {}
    for size in sizes:
        dist.barrier()
        view = buf[: size // 4]
        timed = benchmark(lambda view=view: calls_of(view), warmup=1, steps=reps, device=dev, progress=False)
        out[size] = timed.median / calls
    return out


def tp_speed_worker(tokens: int, d_model: int, widths: list, reps: int) -> dict:
    """All-reduce seconds over FIT_SIZES around S = B·D·4 bytes (all_reduce_seconds); per width, a TP feed-forward
    step (forward + backward) and the same local matmuls without the two all-reduces."""
    dev = L.device()
    world = dist.get_world_size()
    ar = all_reduce_seconds([int(tokens * d_model * 4 * k) // 4 * 4 for k in FIT_SIZES], reps, dev)
    x = torch.randn(1, tokens, d_model, device=dev)
    steps = {}
    for f in widths:
        w1, w2 = torch.randn(f // world, d_model, device=dev), torch.randn(d_model, f // world, device=dev)
        col, row = ColumnParallelLinear(w1), RowParallelLinear(w2)

        def tp_step(col=col, row=row):
            row(F.gelu(col(x))).sum().backward()

        def local_step(w1=col.weight, w2=row.weight):
            F.linear(F.gelu(F.linear(x, w1)), w2).sum().backward()

        steps[f] = (_median_s(tp_step, reps, dev), _median_s(local_step, reps, dev))
    return {"all_reduce": ar, "steps": steps}


def tp_speed_run(config: dict, profile: str, backend: str = "auto", device: str = "auto") -> SpeedRun:
    """Launch the timing worker on config['world'] ranks."""
    sizes = dict(tokens=config["speed_tokens"], d_model=config["speed_d_model"], widths=config["speed_widths"])
    ranks = L.launch(
        tp_speed_worker, config["world"], *sizes.values(), config.get("speed_reps", 5), backend=backend, device=device
    )
    b, d = L.choose_backend(config["world"], backend, device)
    return SpeedRun(ranks, sizes, profile, f"{profile} profile · {b} on {d}, {config['world']} ranks")


def speed_section(run: SpeedRun, directory=None) -> Result:
    """Per width: measured TP step, its communication (TP step − the same matmuls alone) and share, against the
    α-β model (fitted here to the all-reduce times) and the compute rate measured on the local matmuls (saved
    under `directory` when given: the reference runner's folder)."""
    N, s = len(run.ranks), run.sizes
    ar = {k: max(r["all_reduce"][k] for r in run.ranks) for k in run.ranks[0]["all_reduce"]}  # slowest rank
    fit = fit_alpha_beta(list(ar), list(ar.values()))
    rows = []
    for f in s["widths"]:
        tp, local = (max(r["steps"][f][i] for r in run.ranks) for i in (0, 1))
        C = 12 * s["tokens"] * s["d_model"] * f / N / local
        model = FM.tp_ffn_seconds(B=s["tokens"], D=s["d_model"], D_FF=f, N=N, C=C, alpha=fit.alpha_s, beta=fit.beta_Bps)
        share = max(tp - local, 0.0) / tp
        rows.append(
            dict(
                d_ff=f,
                tp_step_ms=tp * 1e3,
                matmuls_ms=local * 1e3,
                comm_ms=(tp - local) * 1e3,
                model_comm_ms=model["comm_s"] * 1e3,
                comm_share=share,
                model_comm_share=model["comm_share"],
                d_ff_star=model["d_ff_star"],
                holds=abs(share - model["comm_share"]) <= SHARE_TOL,
            )
        )
    table = pd.DataFrame(rows)
    path = save_results(
        table,
        "08_tp_speed",
        profile=run.profile,
        world=N,
        alpha_s=fit.alpha_s,
        beta_Bps=fit.beta_Bps,
        tokens=s["tokens"],
        d_model=s["d_model"],
        share_tol=SHARE_TOL,
        all_reduce_s=ar.get(s["tokens"] * s["d_model"] * 4),  # one all-reduce of S bytes alone, measured
        directory=directory,
    )
    star = float(np.median(table["d_ff_star"]))
    held = table[table["holds"]]["d_ff"].tolist()
    notes = [
        f"α = {fit.alpha_s * 1e6:.0f} µs and β = {fit.beta_Bps / 1e9:.2f} GB/s, fitted to this run's all-reduces, "
        f"put the communication-bound point at d_ff ≈ {star:.0f} for {s['tokens']} tokens of width {s['d_model']} on "
        f"{N} ranks: narrower feed-forwards spend most of a step all-reducing, wider ones computing.",
        (
            f"The model's communication share is within ±{SHARE_TOL} of the measured one at d_ff = "
            f"{', '.join(map(str, held))} of {s['widths']}"
            if held
            else f"The model's communication share is not within ±{SHARE_TOL} of the measured one at any width"
        )
        + f"; where it is not, the step spends more (or less) than the two modelled all-reduces: the autograd "
        f"Functions' copies, and on a shared CPU a rank that waits for a descheduled peer · {run.where}.",
    ]
    return Result(table=table, notes=notes, saved=path, values={"d_ff_star": star, "alpha_s": fit.alpha_s})
