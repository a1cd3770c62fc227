"""Notebook 07 §6: the ring all-reduce by hand (helpers.ring) against dist.all_reduce on N ranks: exact on integer
data, bytes sent vs the formula, time per message size, and the α–β fit of the standard ring's model."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from helpers import launch as L
from helpers import ring as R
from helpers.experiments.common import slowest_rank
from helpers.timing import interleaved, sync


@dataclass
class RingRun:
    """ring_worker's result on one rank: per size, exact agreement with dist.all_reduce and seconds per method."""

    world: int
    exact: dict  # size -> bool
    sent: dict  # size -> {method: bytes this rank sent}
    samples: dict  # size -> {method: [seconds]}
    on: str = "gloo on cpu"  # backend and device the data moved by


def ring_backend(worlds) -> tuple[str, str]:
    """(backend, device) for ring_worker at every world size in `worlds`, one choice for all so that one α–β fit
    covers them: NCCL on CUDA where every world has a GPU per rank, else gloo on the CPU. Not gloo on CUDA: gloo's
    send/recv hand the tensor's data pointer to its transport as host memory (ProcessGroupGloo::send/recv stage no
    copy), so the data stays in host memory and the table says so."""
    choices = {L.choose_backend(n) for n in worlds}
    return ("nccl", "cuda") if choices == {("nccl", "cuda")} else ("gloo", "cpu")


METHODS = {
    "dist.all_reduce": lambda t: dist.all_reduce(t),
    "ring": R.ring_all_reduce,
    "alternate ring": R.alternate_ring_all_reduce,
}


def ring_worker(*, sizes, steps, warmup) -> RingRun:
    """Per size (elements, fp32): all three all-reduces on integer-valued data (sums exact in any order) must equal
    bitwise; then timed, interleaved, each call between barriers."""
    rank, world, dev = dist.get_rank(), dist.get_world_size(), L.device()
    exact, sent, samples = {}, {}, {}
    for n in sizes:
        data = torch.randint(-1000, 1000, (n,), generator=torch.Generator().manual_seed(rank)).float().to(dev)  # (n,)
        outs = {}
        for name, fn in METHODS.items():
            t = data.clone()
            outs[name] = (fn(t), t)
        sent[n] = {k: v[0] for k, v in outs.items() if isinstance(v[0], int)}
        exact[n] = all(torch.equal(v[1], outs["dist.all_reduce"][1]) for v in outs.values())

        def timed(name, data=data):
            def one(i):
                t = data.clone()
                dist.barrier()
                t0 = time.perf_counter()
                METHODS[name](t)
                sync(dev)  # NCCL's wait() only orders the stream
                return time.perf_counter() - t0

            return one

        samples[n] = interleaved({k: timed(k) for k in METHODS}, steps, warmup)
    return RingRun(world, exact, sent, samples, on=f"{dist.get_backend()} on {dev.type}")


def ring_table(per_launch: list[list[RingRun]]) -> pd.DataFrame:
    """Per world size, message size and method: exact, bytes sent / S vs the formula, median slowest-rank µs."""
    rows = []
    for per_rank in per_launch:
        world = per_rank[0].world
        for n, by in per_rank[0].samples.items():
            S_ = 4 * n
            for method in by:
                t = float(np.median(slowest_rank([r.samples[n][method] for r in per_rank])))
                sent = [r.sent[n].get(method) for r in per_rank]
                formula = {
                    "ring": R.ring_bytes_sent(S_, world),
                    "alternate ring": R.alternate_ring_bytes_sent(S_, world),
                }.get(method)
                rows.append(
                    {
                        "N": world,
                        "on": per_rank[0].on,
                        "S_bytes": S_,
                        "method": method,
                        "exact": all(r.exact[n] for r in per_rank),
                        "sent/S": np.mean(sent) / S_ if formula else np.nan,
                        "formula/S": formula / S_ if formula else np.nan,
                        "median_us": t * 1e6,
                    }
                )
    return pd.DataFrame(rows)


def ring_fit(table: pd.DataFrame) -> dict:
    """Least-squares α (s) and W (B/s) of the standard ring's model 2(N−1)(α + S/(N W)) over its measured rows, and
    every row's modelled µs (ring and alternate ring) from the same α, W."""
    ring = table[table["method"] == "ring"]
    A = np.stack([2 * (ring["N"] - 1), 2 * (ring["N"] - 1) / ring["N"] * ring["S_bytes"]], axis=1)
    (alpha, inv_w), *_ = np.linalg.lstsq(A.astype(float), ring["median_us"].to_numpy() * 1e-6, rcond=None)
    alpha, W = max(float(alpha), 1e-9), 1 / max(float(inv_w), 1e-15)
    model = {"ring": R.ring_time, "alternate ring": R.alternate_ring_time}
    out = table.copy()
    out["model_us"] = [
        model[m](s, n, alpha, W) * 1e6 if m in model else np.nan
        for m, s, n in zip(out["method"], out["S_bytes"], out["N"], strict=True)
    ]
    return {"alpha_s": alpha, "W_Bps": W, "table": out}
