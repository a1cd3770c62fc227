"""The GPU smoke run's time: `make test` on a GPU runs every notebook at the cpu profile's sizes on the GPU (CUDA
tensors, compiled Triton, NCCL between GPUs or gloo ranks sharing one) and the kernel tests compiled. It must fit
SMOKE_BUDGET_S on one H100, so that a lent 15-minute device window holds it and a reference batch.

    smoke_table()        # one row per notebook and for the kernel tests: counts, seconds; the total against the budget
    smoke_runs()         # the smoke run as a device timed it (data/reference/nvidia-h200/smoke_runs.jsonl)

At the cpu profile's sizes a GPU spends its time on fixed costs, not FLOPs: each notebook's kernel start (Python,
torch, the CUDA context), each multi-rank launch (spawned ranks import torch and make their own context), each
torch.compile and each Triton specialization compiled. SMOKE_COUNTS counts them per notebook, read from the code at
the cpu profile; the seconds per item are the reference run's cost model (helpers.course.reference_cost.gpu_rates),
whose fixed costs and compute are each scaled by a factor fitted (least squares) to the wall times the reference run
measured on a Hopper (data/reference/<device>/manifest.json: the model overestimated every batch, its fixed costs
most). The compute is the cost model's own estimators at the notebooks' cpu sizes.

An H200 then ran the smoke run itself, one worker, in two parts (data/reference/nvidia-h200/smoke_runs.jsonl): each
part took about 1.75 times the fitted estimate, so `measured_factor` scales every row by wall / estimate over what
those runs covered (`smoke_runs`), and one worker's smoke run is about 10 minutes, over the budget. `make test` on a
GPU therefore runs SMOKE_WORKERS pytest-xdist workers (a file each at a time; the cpu profile's sizes use a sliver of
the card): `parallel_s` is the longest worker's share, files dealt longest first. It assumes the workers do not slow
each other, which no device has measured yet: the next smoke run's per-test times (HELPERS_TEST_TIMES) will say.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd

from helpers.course.reference_cost import ESTIMATORS, gpu_rates, model_estimate_s
from helpers.experiments import attention as XA
from helpers.experiments import benchmarking as XB
from helpers.experiments import collectives as XC
from helpers.experiments import ddp as XD
from helpers.experiments import fsdp as XF
from helpers.experiments import model_parallel as XM
from helpers.experiments import rmsnorm as XR
from helpers.experiments import sharding as XS
from helpers.model import sizes_for

GPU = "NVIDIA H100 80GB HBM3"
SMOKE_BUDGET_S = 360  # 6 minutes: with a reference batch (at most 8) inside a 15-minute device window
REFERENCE_MANIFEST = Path(__file__).resolve().parents[2] / "data" / "reference" / "nvidia-h200" / "manifest.json"
SMOKE_RUNS = REFERENCE_MANIFEST.with_name("smoke_runs.jsonl")  # the smoke run timed on a device, in parts
SMOKE_WORKERS = 4  # make test's pytest-xdist workers with CUDA (the Makefile: a quarter of the cores, 1 to 4)
KERNEL_TEST_FILES = 4  # the kernel tests' row is this many files, which xdist deals out separately
FIXED = ("startup_s", "launch_s", "compile_s", "jit_s", "ptxas_s")  # Rates' fixed costs, seconds per item

# per notebook at the cpu profile on one GPU: kernel starts (startup), 2-4-rank launches (launch: torchrun and the
# two-node rehearsal count as one each), torch.compile'd functions (compile), Triton specializations (jit: kernel x
# dtype x constexpr tiles), ptxas runs, and seconds spent waiting by design (a hang's timeout)
SMOKE_COUNTS = {
    "00": dict(startup=1, launch=3, wait_s=2),  # all_gather demo, a failing rank, a hung rank (timeout_s=2)
    "01": dict(startup=1),  # one process: timing, profiler, memory, autocast
    "02": dict(startup=1, compile=4, jit=33),  # compiled norm fwd, fwd+bwd at H 1024; small/cpu compiled fwd, fwd+bwd;
    # Triton fwd, bwd, sum_rows at 4 widths (§1), in 3 dtypes (§3 spec), in the model's sizes (§2), the cells' own
    "03": dict(startup=1, launch=6),  # gloo on cpu and on cuda at 2 and 4 ranks (one GPU); torchrun; two nodes
    "04": dict(startup=1, launch=6),  # correctness (toy, small/cpu); speed per size (3); alpha-beta's grid
    "05": dict(startup=1, launch=3),  # correctness; memory; the speed launch (every kind interleaved)
    "06": dict(startup=1, compile=4, jit=21),  # compiled naive fwd, fwd+bwd (§1 and §4); Triton fwd, dkdv, dq x fp32,
    # bf16 x causal or not (§3), the bench shape, the tiny model's
    "07": dict(startup=1, launch=5),  # equivalence on 2 ranks and 1; the measure launch; ring at 2 and 4 ranks
    "08": dict(startup=1, launch=5),  # TP; TP x DP; the pipeline; ring attention; the TP speed launch
    "kernel tests": dict(startup=1, jit=120, ptxas=1),  # test_rmsnorm, test_attention, test_kernels, test_yours:
    # their shapes x dtypes x tiles; `python -m helpers kernels --quick` (its ptxas runs: reference_cost's registers)
}
COUNT_RATE = {"startup": "startup_s", "launch": "launch_s", "compile": "compile_s", "jit": "jit_s"}


def _dtype_names(dtypes) -> tuple[str, ...]:
    return tuple(str(t).replace("torch.", "") for t in dtypes)


def cpu_scales() -> dict[str, tuple[str, dict]]:
    """notebook -> (its cost-model estimator, the notebook's cpu-profile sizes in that estimator's keys)."""
    b, r, d, s, a, f, m = (XB.PROFILES["cpu"], XR.PROFILES["cpu"], XD.PROFILES["cpu"], XS.PROFILES["cpu"],
                           XA.PROFILES["cpu"], XF.PROFILES["cpu"], XM.PROFILES["cpu"])  # fmt: skip
    return {
        "01": ("01", dict(sizes=sizes_for("cpu", "2026"), autocast=("bfloat16",), **b)),
        "02": (
            "02",
            {
                **{k: r[k] for k in ("rows", "hidden", "warmup", "steps", "compile_hidden")},
                "dtypes": _dtype_names(r["dtypes"]),
                "triton_shape": None,
            },
        ),
        "03": ("03", dict(XC.PROFILE_GRID["cpu"])),
        "04": ("04", {**d, "buckets_mb": d["extra_buckets_mb"]}),
        "05": ("05-unsharded", s),
        "06": (
            "06-float32",
            {
                **{k: a[k] for k in ("bench_impls", "bench_shapes", "warmup", "steps")},
                "bench_impls": [*a["bench_impls"], "flash_triton"],
                "dtypes": _dtype_names(a["bench_dtypes"]),
                "flash_pytorch_max_T": a["flash_pytorch_max_T"],
            },
        ),
        "07": ("07", f),
        "08": ("08", {**m, "speed_reps": 3}),
    }


def calibration(manifest: Path = REFERENCE_MANIFEST) -> dict:
    """Factors on the cost model's fixed costs and compute, least squares over the reference run's measured batches
    (wall_s) on its device, and the envelope (the largest wall/estimate): {"fixed", "compute", "envelope",
    "batches"}."""
    run = json.loads(Path(manifest).read_text())
    r = gpu_rates(run["device"], run.get("gpus", 1))
    bare = dataclasses.replace(r, **dict.fromkeys(FIXED, 0.0))
    rows, walls, ratios = [], [], []
    for name, batch in run["batches"].items():
        if batch.get("status") != "ok" or name not in ESTIMATORS:
            continue
        compute = model_estimate_s(name, run["profile"], bare)
        estimate = model_estimate_s(name, run["profile"], r)
        rows.append([estimate - compute, compute])
        walls.append(batch["wall_s"])
        ratios.append(batch["wall_s"] / estimate)
    (fixed, compute), *_ = np.linalg.lstsq(np.array(rows), np.array(walls), rcond=None)
    if not len(rows) or fixed <= 0 or compute <= 0:
        raise ValueError(f"{manifest}: no positive fit of the cost model to its wall times; rerun `make reference`")
    return {"fixed": float(fixed), "compute": float(compute), "envelope": max(ratios), "batches": len(rows)}


def smoke_table(
    device: str = GPU,
    gpus: int = 1,
    manifest: Path = REFERENCE_MANIFEST,
    runs: Path = SMOKE_RUNS,
    workers: int = SMOKE_WORKERS,
) -> pd.DataFrame:
    """One row per notebook and for the kernel tests: its counts, the fitted fixed and compute seconds, their sum
    (estimate_s), the envelope's (conservative_s) and the device-measured scale's (measured_s). `.attrs`: total_s,
    conservative_s, measured_factor, serial_s (one worker), parallel_s (`workers`), budget_s, calibration."""
    r, k = gpu_rates(device, gpus), calibration(manifest)
    bare = dataclasses.replace(r, **dict.fromkeys(FIXED, 0.0))
    scales = cpu_scales()
    rows = []
    for what, counts in SMOKE_COUNTS.items():
        fixed = sum(n * getattr(r, COUNT_RATE[c]) for c, n in counts.items() if c in COUNT_RATE)
        fixed += counts.get("ptxas", 0) * ESTIMATORS["registers"]({"quick": True}, r)
        compute = ESTIMATORS[scales[what][0]](scales[what][1], bare) if what in scales else 0.0
        wait = counts.get("wait_s", 0)
        rows.append(dict(what=what, **counts, fixed_s=k["fixed"] * fixed, compute_s=k["compute"] * compute,
                         estimate_s=k["fixed"] * fixed + k["compute"] * compute + wait,
                         conservative_s=k["envelope"] * (fixed + compute) + wait))  # fmt: skip
    table = pd.DataFrame(rows).fillna(0)
    factor = measured_factor(table, smoke_runs(runs))
    table["measured_s"] = factor * table["estimate_s"]
    table.attrs.update(
        total_s=float(table["estimate_s"].sum()),
        conservative_s=float(table["conservative_s"].sum()),
        measured_factor=factor,
        serial_s=float(table["measured_s"].sum()),
        parallel_s=parallel_s(table.set_index("what")["measured_s"].to_dict(), workers),
        workers=workers,
        budget_s=SMOKE_BUDGET_S,
        calibration=k,
    )
    return table


def smoke_runs(path: Path = SMOKE_RUNS) -> list[dict]:
    """The smoke run as a device timed it: one row per part, its wall time and the rows it covered (weights: the
    share of a row's time the part ran)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def measured_factor(table: pd.DataFrame, runs: list[dict]) -> float:
    """Wall time over the fitted estimate, over everything the device's smoke runs covered (one worker each)."""
    est = table.set_index("what")["estimate_s"]
    covered = sum(w * est[what] for run in runs for what, w in run["items"].items())
    return sum(run["wall_s"] for run in runs) / covered


def parallel_s(seconds: dict[str, float], workers: int) -> float:
    """The longest worker's total when files go out longest first to the least-loaded worker (xdist's loadfile,
    idealised: no worker slows another)."""
    files = sorted(
        [s / KERNEL_TEST_FILES for _ in range(KERNEL_TEST_FILES)] if what == "kernel tests" else [s]
        for what, s in seconds.items()
    )
    loads = [0.0] * workers
    for s in sorted((x for f in files for x in f), reverse=True):
        loads[loads.index(min(loads))] += s
    return max(loads)


def smoke_summary(table: pd.DataFrame) -> str:
    """One sentence: the estimate against the budget, and what it is made of."""
    k, a = table.attrs["calibration"], table.attrs
    return (
        f"GPU smoke run (make test on one {GPU}): about {a['parallel_s']:.0f} s of a {SMOKE_BUDGET_S} s budget on "
        f"{a['workers']} workers, {a['serial_s']:.0f} s on one ({int(table['launch'].sum())} launches, "
        f"{int(table['compile'].sum())} compiles, {int(table['jit'].sum())} Triton specializations; the cost "
        f"model's fixed costs x{k['fixed']:.2f} and compute x{k['compute']:.2f}, fitted to {k['batches']} measured "
        f"reference batches, then x{a['measured_factor']:.2f}, what an H200's smoke run took over that estimate)"
    )
