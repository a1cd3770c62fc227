"""Collective benchmarks (all_reduce, all_gather, reduce_scatter, broadcast): time, algbw, busbw, alpha-beta fit.

Runbook (notebook 03 calls the same functions):

    python -m helpers bench collectives                                   # this machine's profile grid, spawned ranks
    python -m helpers bench collectives --sizes 1MB 64MB --ops all_reduce --world-sizes 2 4 --backends gloo:cpu
    python -m helpers bench collectives --reference                       # save under data/reference/<device>/
    torchrun --standalone --nproc-per-node 8 -m helpers bench collectives --backend nccl --device cuda
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
             -m helpers bench collectives --backend nccl --device cuda --reference     # then --node-rank 1 on the other
    two_node_rehearsal(["4KB", "64KB"])    # the same two-node path, rehearsed on this machine (gloo, loopback)

Under torchrun the world is torchrun's (one configuration) and only rank 0 prints and saves.
Results go to data/local/<device>/collectives.jsonl (or --out DIR) with provenance; notebook 03 plots them.

Method (per op and size, on every rank): 5 warm-up calls, then `iters` timed calls (fewer, never under 3, where
--budget-s would be exceeded: the largest sizes), each between a barrier and a device sync, each
result compared with the exact expected values (small integers, exact in float32); wrong ones are counted.
A call's time is its slowest rank's; reported: the median over calls (time_s) and the quartiles (p25_s, p75_s);
algbw = bytes / time; busbw = algbw x the nccl-tests factor. The alpha-beta fit uses p25_s (see fit_table).
Each row keeps its per-call times (calls_s), so two ops of one launch compare as paired ratios (op_ratios).
The fit, plots and ratios live in collectives_tables and are importable from here.
`bytes` is nccl-tests' size: the all_reduce/broadcast buffer, the all_gather output, the reduce_scatter input.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import tempfile
import time

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from helpers import launch as L
from helpers.comm import OPS, run_collective
from helpers.env import resolve_profile
from helpers.experiments.collectives_tables import (
    AlphaBeta,
    fit_alpha_beta,
    fit_table,
    format_size,
    mark_table,
    op_ratios,
    parse_size,
    plot_collectives,
    unpaired_ratios,
)
from helpers.formulas import GiB, KiB, MiB, algbw, busbw
from helpers.results import load_results, save_results
from helpers.timing import MIN_PAIRS
from helpers.timing import sync as _sync

__all__ = [  # what notebook 03, the tests and helpers.course import from here (the tables' names included)
    "BATCH_CALLS",
    "METHOD",
    "MIN_PAIRS",
    "MIN_WARMUP",
    "NCCL_BENCH_ARGS",
    "OPS",
    "PROFILE_GRID",
    "RESULTS_NAME",
    "SEED_SIZES",
    "SMALL_SIZES",
    "AlphaBeta",
    "bench_main",
    "bench_worker",
    "fit_alpha_beta",
    "fit_table",
    "format_size",
    "mark_table",
    "op_ratios",
    "parse_size",
    "plan",
    "plot_collectives",
    "run_grid",
    "skip_reason",
    "summarize",
    "two_node_recipe",
    "two_node_rehearsal",
    "unpaired_ratios",
]

SEED_SIZES = (512 * KiB, 1 * MiB, 10 * MiB, 50 * MiB, 100 * MiB, 500 * MiB, 1 * GiB)  # seed 004, section 3.1
SMALL_SIZES = (8 * KiB, 64 * KiB)  # below the seed's grid, so the latency term shows
PROFILE_GRID = {
    "cpu": dict(
        sizes=SMALL_SIZES + (512 * KiB, 1 * MiB, 4 * MiB, 10 * MiB, 16 * MiB),
        world_sizes=(2, 4),
        # the gpu profile's combos too: on a GPU machine the smoke run (make test) moves CUDA tensors; without one
        # the plan says why each cannot run here
        combos=(("gloo", "cpu"), ("gloo", "cuda"), ("nccl", "cuda")),
        warmup=5,
        iters=30,
        budget_s=0.3,
    ),
    "gpu": dict(
        sizes=SMALL_SIZES + SEED_SIZES,
        world_sizes=(2, 4, 6),
        combos=(("gloo", "cpu"), ("gloo", "cuda"), ("nccl", "cuda")),
        warmup=5,
        iters=10,
        budget_s=5.0,
    ),
}
MIN_WARMUP = 5  # untimed calls before timing each (op, size)
RESULTS_NAME = "collectives"  # what `python -m helpers bench collectives` saves
METHOD = (
    "per sample, slowest rank: one call between device syncs (CPU), or on CUDA a batch of BATCH_CALLS calls between "
    "one event pair, per call (as nccl-tests: no host sync per call); time_s = median, p25_s/p75_s = quartiles"
)
BATCH_CALLS = 10  # calls per timed sample on CUDA; each sample is preceded by one checked, untimed call


# ---- the worker: runs on every rank through helpers.launch.launch ----


def _buffers(op: str, numel: int, rank: int, n: int, dev: torch.device):
    """(input source, output buffer or None, expected output) for known integer inputs: rank + (i mod 251)."""
    base = (torch.arange(numel, dtype=torch.int32, device=dev) % 251).float()  # (numel,) exact small integers
    chunk = numel // n
    if op == "all_reduce":
        return base + rank, None, n * base + n * (n - 1) / 2
    if op == "all_gather":  # each rank sends its chunk; output = every rank's chunk, in rank order
        mine = base[rank * chunk : (rank + 1) * chunk] + rank  # (numel/n,)
        return mine, torch.empty(numel, device=dev), base + torch.arange(n, device=dev).repeat_interleave(chunk)
    if op == "reduce_scatter":  # input (numel,), output this rank's reduced chunk (numel/n,)
        return (
            base + rank,
            torch.empty(chunk, device=dev),
            n * base[rank * chunk : (rank + 1) * chunk] + n * (n - 1) / 2,
        )
    if op == "broadcast":  # from rank 0; other ranks start with different values, so a no-op is caught
        return base + rank, None, base.clone()
    raise ValueError(f"unknown op {op!r}; use one of {OPS}")


def _timed_call(op, source, work, out, corrupt: bool, dev) -> tuple[float, torch.Tensor]:
    """Reset the input, barrier, run the op between device syncs: (seconds, result tensor)."""
    work.copy_(source)
    if corrupt:
        work[0] += 1  # the planted wrong result
    dist.barrier()
    _sync(dev)
    start = time.perf_counter()
    result = run_collective(op, work, out)
    _sync(dev)
    return time.perf_counter() - start, result


def _timed_batch(op, work, out, calls: int) -> float:
    """Seconds per call of `calls` back-to-back calls between one CUDA event pair on the current stream: the host
    launches them all and waits once, so a host synchronization per call (tens of µs) stays out of α. For NCCL the
    calls run on its stream, which the events' stream waits for; gloo on CUDA blocks the host per call as it must."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        run_collective(op, work, out)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls  # ms -> s, per call


def _agreed_iters(warm_s: float, iters: int, budget_s: float | None, dev) -> int:
    """Timed calls that fit `budget_s` (3 <= k <= iters), the same on every rank (slowest rank's warm-up)."""
    if budget_s is None:
        return iters
    per_call = torch.tensor([warm_s], dtype=torch.float64, device=dev)
    dist.all_reduce(per_call, op=dist.ReduceOp.MAX)
    return int(min(iters, max(3, budget_s // per_call.item())))


def bench_worker(
    ops, sizes, warmup: int = 5, iters: int = 10, corrupt_rank: int | None = None, budget_s: float | None = None
) -> list[dict]:
    """Time and check every (op, size) on this rank; `corrupt_rank` plants a wrong input there (for tests).

    budget_s: cap the timed calls per (op, size) at about budget_s seconds (never fewer than 3); None: always `iters`.
    """
    if warmup < MIN_WARMUP:
        raise ValueError(f"warmup={warmup}: use at least {MIN_WARMUP} warm-up calls")
    rank, n, dev = dist.get_rank(), dist.get_world_size(), L.device()
    for op in ops:  # a fresh process group's first calls are slow (connections, allocations): pay that here
        source, out, _ = _buffers(op, n * 256, rank, n, dev)
        for _ in range(20):
            run_collective(op, source.clone(), out)
    _sync(dev)
    out_rows = []
    for size in sizes:
        numel = max(n, size // 4 // n * n)  # float32, divisible into n equal chunks
        for op in ops:
            source, out, expected = _buffers(op, numel, rank, n, dev)
            work, corrupt = source.clone(), rank == corrupt_rank
            warm = [_timed_call(op, source, work, out, corrupt, dev)[0] for _ in range(warmup)]
            batched = dev.type == "cuda"
            per_sample = statistics.median(warm) * (1 + BATCH_CALLS if batched else 1)
            samples, wrong = [], []
            for _ in range(_agreed_iters(per_sample, iters, budget_s, dev)):
                seconds, result = _timed_call(op, source, work, out, corrupt, dev)  # checked on every sample
                wrong.append(not torch.equal(result, expected))
                if batched:
                    dist.barrier()
                    _sync(dev)
                    seconds = _timed_batch(op, work, out, BATCH_CALLS)
                samples.append(seconds)
            out_rows.append({"op": op, "size_bytes": numel * 4, "samples": samples, "wrong": wrong})
            del source, out, expected, work
    return out_rows


def summarize(per_rank: list[list[dict]], backend: str, device: str, nodes: int = 1) -> list[dict]:
    """Combine every rank's samples into tidy rows: one call's time = its slowest rank; median and quartiles of that."""
    n, rows = len(per_rank), []
    for i, first in enumerate(per_rank[0]):
        calls = np.max([r[i]["samples"] for r in per_rank], axis=0)  # (iters,) every call waits for its slowest rank
        p25, t, p75 = (float(q) for q in np.percentile(calls, [25, 50, 75]))
        wrong = [any(r[i]["wrong"][k] for r in per_rank) for k in range(len(first["wrong"]))]  # per timed call
        size, op = first["size_bytes"], first["op"]
        rows.append(
            {
                "backend": backend,
                "device": device,
                "world_size": n,
                "nodes": nodes,
                "op": op,
                "size_bytes": size,
                "size": format_size(size),
                "time_s": t,
                "p25_s": p25,
                "p75_s": p75,
                "iters": len(wrong),
                "algbw_GBps": algbw(size, t) / 1e9,
                "busbw_GBps": busbw(op, size, t, n) / 1e9,
                "wrong": sum(wrong),
                "calls_s": calls.tolist(),
            }
        )
    return rows


# ---- the grid: which configurations can run here, then one launch per configuration ----


def skip_reason(backend: str, device: str, world_size: int, gpus: int) -> str | None:
    """Why (backend, device, world_size) cannot run on a machine with `gpus` GPUs; None when it can."""
    if device == "cuda" and gpus == 0:
        return "no CUDA GPU here"
    if backend == "nccl" and device != "cuda":
        return "NCCL only moves CUDA tensors"
    if backend == "nccl" and gpus < world_size:
        return f"NCCL needs one GPU per rank: {world_size} ranks, {gpus} GPU(s)"
    if backend == "nccl" and not dist.is_nccl_available():
        return "this torch build has no NCCL"
    return None


def plan(world_sizes, combos, gpus: int | None = None) -> pd.DataFrame:
    """One row per (backend, device, world_size): run or skip, with the reason or a note."""
    gpus = torch.cuda.device_count() if gpus is None else gpus
    rows = []
    for backend, device in combos:
        for ws in world_sizes:
            reason = skip_reason(backend, device, ws, gpus)
            note = f"{ws} ranks share {gpus} GPU(s)" if reason is None and device == "cuda" and gpus < ws else ""
            rows.append(
                {
                    "backend": backend,
                    "device": device,
                    "world_size": ws,
                    "run": reason is None,
                    "reason": reason or note,
                }
            )
    return pd.DataFrame(rows)


def run_grid(
    sizes,
    ops=OPS,
    world_sizes=(2,),
    combos=(("gloo", "cpu"),),
    warmup: int = MIN_WARMUP,
    iters: int = 10,
    corrupt_rank: int | None = None,
    budget_s: float | None = None,
    timeout_s: float = 1800,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every runnable configuration of plan() (one launch each, progress bar); return (rows, plan).

    A configuration whose launch fails is marked run=False in the plan with the error, and the grid goes on.
    """
    todo, rows = plan(world_sizes, combos), []
    for i in tqdm(todo.index[todo["run"]], desc="collectives"):
        cfg = todo.loc[i]
        try:
            per_rank = L.launch(
                bench_worker,
                int(cfg.world_size),
                tuple(ops),
                tuple(sizes),
                warmup,
                iters,
                corrupt_rank,
                budget_s,
                backend=cfg.backend,
                device=cfg.device,
                timeout_s=timeout_s,
            )
        except L.RankError as err:
            todo.loc[i, ["run", "reason"]] = [False, "failed: " + str(err).splitlines()[0]]
            continue
        rows += summarize(per_rank, cfg.backend, cfg.device)
    return pd.DataFrame(rows), todo


# ---- several nodes: the recipe for real ones, and a rehearsal of the path on this machine ----

NCCL_BENCH_ARGS = ("bench", "collectives", "--backend", "nccl", "--device", "cuda", "--reference")


def two_node_recipe(
    endpoint: str = "HEAD_NODE:29500", nproc_per_node: int = 8, bench_args=NCCL_BENCH_ARGS
) -> list[str]:
    """Notebook 03: the torchrun command to run on each of two real nodes (node-rank 0 on HEAD_NODE, then 1)."""
    return [
        shlex.join(
            [
                "torchrun",
                "--nnodes",
                "2",
                "--node-rank",
                str(rank),
                "--nproc-per-node",
                str(nproc_per_node),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                endpoint,
                "-m",
                "helpers",
                *bench_args,
            ]
        )
        for rank in (0, 1)
    ]


def two_node_rehearsal(sizes, out_dir=None, profile: str = "cpu", timeout_s: float = 300) -> pd.DataFrame:
    """Notebook 03: all_reduce on two torchrun agents on this machine (gloo, CPU); the saved rows, each with topology.

    sizes: e.g. ["8KB", "64KB"] or byte counts. out_dir: where the agents save (default: a temporary folder).
    df.attrs["commands"] holds the two agents' exact command lines. Raises RuntimeError with the stderr of a failed
    agent.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = str(out_dir or tmp)
        runs = L.run_simulated_nodes(
            [
                "bench",
                "collectives",
                "--profile",
                profile,
                "--backend",
                "gloo",
                "--device",
                "cpu",
                "--ops",
                "all_reduce",
                "--sizes",
                *[str(s) for s in sizes],
                "--out",
                out,
            ],
            nodes=2,
            timeout_s=timeout_s,
        )
        failed = [(rank, r) for rank, r in enumerate(runs) if r.returncode != 0]
        if failed:
            raise RuntimeError(
                "two-node rehearsal failed:\n"
                + "\n".join(f"agent {rank} (exit {r.returncode}):\n{r.stderr[-3000:]}" for rank, r in failed)
            )
        saved = load_results(os.path.join(out, f"{RESULTS_NAME}.jsonl"))
    df = saved.frame().assign(topology=saved.provenance.get("topology"))
    df.attrs["commands"] = [shlex.join(r.args) for r in runs]
    return df


# ---- command line: python -m helpers bench collectives (spawned grid, or the torchrun world) ----


def bench_main(argv: list[str]) -> int:
    """Run the benchmark from the command line and save the rows with provenance; 1 if any result was wrong."""
    p = argparse.ArgumentParser(prog="python -m helpers bench collectives", description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="auto", help="auto | cpu | gpu: the default grid")
    p.add_argument("--sizes", nargs="+", type=parse_size, help="e.g. 512KB 1MB 1GB (default: the profile's)")
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    p.add_argument("--world-sizes", nargs="+", type=int, help="spawned runs only (default: the profile's)")
    p.add_argument("--backends", nargs="+", help="backend:device pairs, e.g. gloo:cpu nccl:cuda (spawned runs)")
    p.add_argument("--backend", default="auto", help="under torchrun: auto | gloo | nccl")
    p.add_argument("--device", default="auto", help="under torchrun: auto | cpu | cuda")
    p.add_argument("--warmup", type=int)
    p.add_argument("--iters", type=int)
    p.add_argument("--budget-s", type=float, help="about this many seconds of timed calls per (op, size), >= 3 calls")
    p.add_argument("--name", default=RESULTS_NAME)
    p.add_argument("--out", help="save into this folder instead of data/<kind>/<device>/")
    p.add_argument("--reference", action="store_true", help="save under data/reference/<device>/ (to commit)")
    args = p.parse_args(argv)
    profile = resolve_profile(args.profile)
    grid = PROFILE_GRID[profile]
    sizes, warmup, iters = args.sizes or grid["sizes"], args.warmup or grid["warmup"], args.iters or grid["iters"]
    budget_s = args.budget_s or grid["budget_s"]
    topology = {"topology": "1 node, spawned ranks", "nodes": 1}
    if L._under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        per_rank = L.launch(
            bench_worker,
            world,
            tuple(args.ops),
            tuple(sizes),
            warmup,
            iters,
            None,
            budget_s,
            backend=args.backend,
            device=args.device,
        )
        backend, device = dist.get_backend(), L.device().type
        topology = L.torchrun_topology()
        dist.destroy_process_group()
        if int(os.environ["RANK"]) != 0:
            return 0
        df, skipped = pd.DataFrame(summarize(per_rank, backend, device, topology["nodes"])), None
    else:
        combos = [tuple(b.split(":")) for b in args.backends] if args.backends else grid["combos"]
        df, todo = run_grid(
            sizes, args.ops, args.world_sizes or grid["world_sizes"], combos, warmup, iters, None, budget_s
        )
        skipped = todo[~todo["run"]]
    if df.empty:
        print("nothing ran here:\n" + skipped.to_string(index=False))
        return 2
    path = save_results(
        df,
        args.name,
        profile=profile,
        kind="reference" if args.reference else "local",
        directory=args.out,
        method=METHOD,
        warmup=warmup,
        topology=topology["topology"],
    )
    print(df.drop(columns=["size_bytes", "calls_s"]).to_string(index=False))
    if skipped is not None and len(skipped):
        print("skipped:\n" + skipped.to_string(index=False))
    print(f"saved {path}")
    return 1 if df["wrong"].sum() else 0
