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
`bytes` is nccl-tests' size: the all_reduce/broadcast buffer, the all_gather output, the reduce_scatter input.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from helpers import launch as L
from helpers.comm import OPS, run_collective
from helpers.env import resolve_profile
from helpers.formulas import GiB, KiB, MiB, algbw, busbw
from helpers.results import load_results, save_results
from helpers.timing import MIN_PAIRS, paired_ratio, verdict
from helpers.timing import sync as _sync

SEED_SIZES = (512 * KiB, 1 * MiB, 10 * MiB, 50 * MiB, 100 * MiB, 500 * MiB, 1 * GiB)  # seed 004, section 3.1
SMALL_SIZES = (8 * KiB, 64 * KiB)  # below the seed's grid, so the latency term shows
PROFILE_GRID = {
    "cpu": dict(
        sizes=SMALL_SIZES + (512 * KiB, 1 * MiB, 4 * MiB, 10 * MiB, 16 * MiB),
        world_sizes=(2, 4),
        combos=(("gloo", "cpu"),),
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
METHOD = "per call: slowest rank; time_s = median over calls, p25_s/p75_s = quartiles"


def parse_size(text: str) -> int:
    """'512KB' / '16MB' / '1GB' / '4096' -> bytes (binary units, as the seed's table)."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": KiB, "M": MiB, "G": GiB}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)


def format_size(size_bytes: int) -> str:
    """Bytes -> '512 KB', '16 MB', '1 GB'."""
    for unit, scale in (("GB", GiB), ("MB", MiB), ("KB", KiB)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.3g} {unit}"
    return f"{size_bytes} B"


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
            samples, wrong = [], []
            for _ in range(_agreed_iters(statistics.median(warm), iters, budget_s, dev)):
                seconds, result = _timed_call(op, source, work, out, corrupt, dev)
                samples.append(seconds)
                wrong.append(not torch.equal(result, expected))
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


# ---- the alpha-beta model: time = alpha + bytes / beta ----


@dataclass
class AlphaBeta:
    """A latency-bandwidth fit: alpha (s), beta (bytes/s), and how far the points are from it."""

    alpha_s: float
    beta_Bps: float
    median_rel_err: float
    max_rel_err: float
    points: int

    def predict(self, size_bytes):
        """Modelled time (s) for `size_bytes`."""
        return self.alpha_s + np.asarray(size_bytes, dtype=float) / self.beta_Bps

    @property
    def crossover_bytes(self) -> float:
        """alpha * beta: below this size the latency term is larger than the bandwidth term."""
        return self.alpha_s * self.beta_Bps


def fit_alpha_beta(size_bytes, seconds) -> AlphaBeta:
    """Least squares on relative error (rows divided by time) of t = alpha + bytes/beta; alpha >= 0."""
    x, t = np.asarray(size_bytes, dtype=float), np.asarray(seconds, dtype=float)
    design = np.stack([np.ones_like(x), x], axis=1) / t[:, None]  # (points, 2), each row / t: relative residuals
    (alpha, inv_beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if alpha < 0:  # latency too small to see: refit through the origin
        alpha, inv_beta = 0.0, float(np.sum(x / t) / np.sum((x / t) ** 2))
    rel = np.abs(alpha + x * inv_beta - t) / t
    return AlphaBeta(float(alpha), float(1 / inv_beta), float(np.median(rel)), float(np.max(rel)), len(t))


def fit_table(df: pd.DataFrame, keys=("backend", "device", "world_size", "op"), col: str = "p25_s") -> pd.DataFrame:
    """One alpha-beta fit per (backend, device, world_size, op) group of a results frame, fitted to column `col`.

    The default is the lower quartile of the call times: on a shared or virtual machine a fraction of calls also wait
    for a descheduled rank (milliseconds), enough to move the median of a few calls from one mode to the other, while
    the lower quartile keeps to the calls that did not wait. Rows saved before p25_s existed are fitted on time_s.
    """
    col = col if col in df else "time_s"
    rows = []
    for group, part in df.groupby(list(keys)):
        fit = fit_alpha_beta(part["size_bytes"], part[col])
        rows.append(
            {
                **dict(zip(keys, group)),
                "alpha_us": fit.alpha_s * 1e6,
                "beta_GBps": fit.beta_Bps / 1e9,
                "crossover_bytes": fit.crossover_bytes,
                "median_rel_err": fit.median_rel_err,
                "max_rel_err": fit.max_rel_err,
                "points": fit.points,
                "fitted_to": col,
                "fit": fit,
            }
        )
    return pd.DataFrame(rows)


def plot_collectives(
    df: pd.DataFrame, fits: pd.DataFrame | None = None, op: str = "all_reduce", title: str = "", marks=None
):
    """Log-log time (median, quartile bars) and busbw vs size, one line per (backend, device, world_size); fits dashed.
    marks: published busbw marks drawn on the busbw panel (default: NCCL's on H100 NVLink for all_reduce), compared
    only when NCCL on CUDA was measured."""
    import matplotlib.pyplot as plt

    from helpers.published import MARKS, draw_mark

    marks = ([MARKS["nccl_allreduce_h100"]] if op == "all_reduce" else []) if marks is None else marks

    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4))
    part = df[df["op"] == op]
    for (backend, device, ws), g in part.groupby(["backend", "device", "world_size"]):
        g = g.sort_values("size_bytes")
        label = f"{backend}+{device}, {ws} ranks"
        spread = [g["time_s"] - g["p25_s"], g["p75_s"] - g["time_s"]] if "p25_s" in g else None  # middle half of calls
        color = (
            ax_t.errorbar(g["size_bytes"], g["time_s"], yerr=spread, fmt="o", capsize=2, label=label)
            .lines[0]
            .get_color()
        )
        ax_b.plot(g["size_bytes"], g["busbw_GBps"], "o-", color=color, label=label)
        if fits is not None:
            match = fits[
                (fits.backend == backend) & (fits.device == device) & (fits.world_size == ws) & (fits.op == op)
            ]
            if len(match):
                xs = np.geomspace(g["size_bytes"].min(), g["size_bytes"].max(), 50)
                ax_t.plot(xs, match.iloc[0]["fit"].predict(xs), "--", color=color)
    ax_t.set(
        xscale="log",
        yscale="log",
        xlabel="size (bytes)",
        ylabel="time (s)",
        title=f"{op}: median, quartile bars; dashed: α–β fit",
    )
    nccl = bool(((part["backend"] == "nccl") & (part["device"] == "cuda")).any())
    for m in marks:
        draw_mark(ax_b, m, comparable=nccl)
    ax_b.set(
        xscale="log",
        yscale="log" if marks else "linear",
        xlabel="size (bytes)",
        ylabel="busbw (GB/s)",
        title=f"{op}: bus bandwidth",
    )
    ax_b.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def mark_table(df: pd.DataFrame, mark=None, op: str = "all_reduce") -> pd.DataFrame:
    """Beside the plot: per (backend, device, world_size) the best busbw measured and its "% of mark" (NCCL on CUDA
    only; other backends and devices are not compared with a GPU figure)."""
    from helpers.published import MARKS, share_column

    mark = mark or MARKS["nccl_allreduce_h100"]
    part = df[(df["op"] == op) & (df["wrong"] == 0)]
    best = part.groupby(["backend", "device", "world_size"])["busbw_GBps"].max().reset_index()
    comparable = (best["backend"] == "nccl") & (best["device"] == "cuda")
    best[f"% of mark ({mark.label})"] = [share_column([v], mark, c)[0] for v, c in zip(best["busbw_GBps"], comparable)]
    return best.set_index(["backend", "device", "world_size"])


# ---- comparisons that know their noise ----


def op_ratios(df: pd.DataFrame, baseline: str = "all_reduce", size_bytes: int | None = None) -> pd.DataFrame:
    """Notebook 03: each op's time over `baseline`'s at one size, per configuration (default size: the largest where
    every op has MIN_PAIRS timed calls, else the largest).

    Both ops ran in one launch, one after the other, so call k of each is paired (paired_ratio: median of the ratios,
    bootstrap interval); the interval covers call-to-call noise, not a drift between the two blocks of calls.
    With fewer than MIN_PAIRS pairs no difference is called measurable.
    """
    if "calls_s" not in df:
        raise ValueError("these rows have no per-call times (calls_s): rerun the benchmark with this version")
    if size_bytes is None:
        enough = df.groupby("size_bytes")["calls_s"].agg(lambda calls: min(map(len, calls)) >= MIN_PAIRS)
        size_bytes = int(enough[enough].index.max() if enough.any() else df["size_bytes"].max())
    keys, rows = ["backend", "device", "world_size"], []
    for cfg, g in df[df["size_bytes"] == size_bytes].groupby(keys):
        base = g[g["op"] == baseline]["calls_s"].iloc[0]
        for r in g[g["op"] != baseline].itertuples():
            k = min(len(r.calls_s), len(base))
            ratio = paired_ratio(r.calls_s[:k], base[:k])
            enough = k >= MIN_PAIRS
            rows.append(
                {
                    **dict(zip(keys, cfg)),
                    "size": format_size(size_bytes),
                    "op": r.op,
                    "ratio": ratio.median,
                    "ci_low": ratio.low,
                    "ci_high": ratio.high,
                    "pairs": k,
                    "measurable": enough and ratio.differs,
                    "verdict": verdict(r.op, baseline, ratio)
                    if enough
                    else f"too few paired calls ({k} < {MIN_PAIRS}) to tell {r.op} from {baseline}",
                }
            )
    return pd.DataFrame(rows)


def unpaired_ratios(df: pd.DataFrame, a: tuple, b: tuple = ("nccl", "cuda"), op: str = "all_reduce") -> pd.DataFrame:
    """Notebook 03: (backend, device) a's median time over b's at each (world_size, size) both ran.

    a and b ran in different launches, so their calls are not paired: `apart` is True only where the two quartile
    ranges (p25-p75) do not overlap, the only points where the text names a winner.
    """
    part, keys = df[df["op"] == op], ["world_size", "size_bytes"]
    side = {
        name: part[(part["backend"] == be) & (part["device"] == dev)].set_index(keys)[["time_s", "p25_s", "p75_s"]]
        for name, (be, dev) in (("a", a), ("b", b))
    }
    both = side["a"].merge(side["b"], left_index=True, right_index=True, suffixes=("_a", "_b"))  # inner join
    both["ratio"] = both["time_s_a"] / both["time_s_b"]
    both["apart"] = (both["p25_s_a"] > both["p75_s_b"]) | (both["p75_s_a"] < both["p25_s_b"])
    return both.reset_index()


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
    df.attrs["commands"] holds the two agents' exact command lines. Raises RuntimeError with the stderr of a failed agent.
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
