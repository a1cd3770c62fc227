"""`python -m helpers bench ddp`: DDPBucketed vs torch DDP (or a student's wrappers), interleaved from the same weights
on the same data, gloo, 2 ranks or the torchrun world; rank 0 reports the paired ratio and saves the rows.

    python -m helpers bench ddp [--model small/cpu --bucket-mb 1 --steps 30]
"""

from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass

import numpy as np
import torch

from helpers import launch as L
from helpers.ddp import wrap
from helpers.experiments.common import (
    bench_parser,
    make_batches,
    make_model,
    make_optimizer,
    rank_share,
    slowest_rank,
    train_step,
)
from helpers.results import save_results
from helpers.timing import interleaved, paired_ratio, time_call, verdict


@dataclass
class BenchRun:
    """One rank's bench: step samples per wrapper, DDPBucketed's bucket count, whether both ended with the same
    weights."""

    step: dict[str, list]
    buckets: int
    same_weights: bool


def bench_worker(
    *,
    model: str,
    bucket_mb: float,
    steps: int,
    warmup: int,
    batch_size: int,
    context_length: int,
    wrappers: dict | None = None,
) -> BenchRun:
    """DDPBucketed and torch DDP (or `wrappers`: label -> f(module) giving a gradient sync with .module, e.g. a
    student's DDP) from the same weights on the same data, interleaved (same start, data and means: the same weights
    at the end)."""
    base = make_model(model, 0)
    wrappers = wrappers or {k: functools.partial(wrap, k, bucket_size_mb=bucket_mb) for k in ("bucketed", "torch_ddp")}
    ddps = {k: make(copy.deepcopy(base)) for k, make in wrappers.items()}
    opts = {k: make_optimizer(d.parameters(), "sgd") for k, d in ddps.items()}
    for k, d in ddps.items():  # a wrapper whose hooks take the optimizer (a student's, as the course calls them)
        getattr(d, "bind_optimizer", lambda _: None)(opts[k])
    batches = [rank_share(b) for b in make_batches(model, 4, batch_size, context_length, 0)]
    step = {
        k: (
            lambda i, k=k: time_call(
                lambda: train_step(ddps[k].module, opts[k], *batches[i % len(batches)], grad_sync=ddps[k]), L.device()
            )[1]
        )
        for k in ddps
    }
    samples = interleaved(step, steps, warmup)
    first = next(iter(ddps.values())).module
    same = all(
        torch.equal(a, b) for d in ddps.values() for a, b in zip(first.parameters(), d.module.parameters(), strict=True)
    )
    return BenchRun(samples, len(getattr(ddps.get("bucketed"), "buckets", [])), same)


def bench_main(argv: list[str]) -> int:
    """`python -m helpers bench ddp`: DDPBucketed vs torch DDP step time (gloo, 2 ranks), interleaved in one run;
    also under torchrun (the torchrun world: one node or several), where rank 0 reports and saves."""
    parser = bench_parser("python -m helpers bench ddp", bench_main.__doc__)
    parser.add_argument("--bucket-mb", type=float, default=1.0)
    parser.add_argument("--out", help="save into this folder instead of data/local/<device>/")
    args = parser.parse_args(argv)
    if not args.bucket_mb > 0:
        parser.error(f"--bucket-mb must be > 0, got {args.bucket_mb}")
    worker = functools.partial(
        bench_worker,
        model=args.model,
        bucket_mb=args.bucket_mb,
        steps=args.steps,
        warmup=args.warmup,
        batch_size=args.batch_size,
        context_length=args.context_length,
    )
    world = int(os.environ.get("WORLD_SIZE", 2)) if L._under_torchrun() else 2
    per_rank = L.launch(worker, world, backend="gloo", device=args.device)
    topology = L.torchrun_topology()["topology"] if L._under_torchrun() else "1 node, spawned ranks"
    if int(os.environ.get("RANK", 0)) != 0:
        return 0
    slowest = {k: slowest_rank([p.step[k] for p in per_rank]) for k in ("bucketed", "torch_ddp")}
    ratio = paired_ratio(slowest["bucketed"], slowest["torch_ddp"])  # step i vs step i
    same = all(p.same_weights for p in per_rank)
    rows = [
        {
            "wrapper": k,
            "median_s": float(np.median(v)),
            "p25_s": float(np.percentile(v, 25)),
            "p75_s": float(np.percentile(v, 75)),
            "world_size": world,
        }
        for k, v in slowest.items()
    ]
    path = save_results(
        rows,
        "ddp_bench",
        directory=args.out,
        model=args.model,
        bucket_mb=args.bucket_mb,
        steps=args.steps,
        topology=topology,
        ratio=ratio.median,
        ratio_low=ratio.low,
        ratio_high=ratio.high,
        same_weights=same,
    )
    print(
        f"{args.model}, bucket {args.bucket_mb:g} MB, gloo on {args.device}, {world} ranks ({topology}), "
        f"{args.steps} interleaved steps (slowest rank): DDPBucketed median {rows[0]['median_s'] * 1e3:.2f} ms "
        f"({per_rank[0].buckets} buckets), torch DDP {rows[1]['median_s'] * 1e3:.2f} ms; "
        f"{verdict('DDPBucketed', 'torch DDP', ratio, 'step time')}; identical weights after training: {same}; "
        f"saved {path.name}"
    )
    return 0 if same else 1
