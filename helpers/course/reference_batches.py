"""The reference run's batches, one function each: it calls the notebook's own experiment functions at the gpu
profile's sizes (or the tiny cpu plan's) and saves small result files into one folder. `python -m helpers reference`
(helpers.course.reference) runs each in its own process with a timeout:

    python -m helpers.course.reference_batches kernels --profile cpu --out /tmp/ref/cpu-device

SCALES holds every batch's sizes per profile as plain data (gpu: the experiments' own gpu PROFILES; cpu: a tiny
plan that runs end to end in seconds); the runner's time estimates read the same table.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import pandas as pd
import torch

from helpers import env
from helpers.experiments import attention as XA
from helpers.experiments import benchmarking as XB
from helpers.experiments import collectives as XC
from helpers.experiments import ddp as XD
from helpers.experiments import fsdp as XF
from helpers.experiments import model_parallel as XM
from helpers.experiments import rmsnorm as XR
from helpers.experiments import sharding as XS
from helpers.model import edition_arch, size_edition, sizes_for
from helpers.results import load_results, save_results

LB = XA.LEADERBOARD
SCALES = {  # batch -> profile -> what it runs (plain data; gpu from the notebooks' PROFILES)
    "kernels": {
        "gpu": dict(
            norm_shape=(50_000, 4096),
            norm_warmup=10,
            norm_steps=50,
            attn_shape=(LB["batch"], LB["heads"], LB["T"], LB["d"]),
            attn_dtype="bfloat16",
            attn_impls=("flash_triton", "sdpa", "naive"),
            attn_warmup=5,
            attn_steps=20,
        ),
        "cpu": dict(
            norm_shape=(16, 64),
            norm_warmup=1,
            norm_steps=3,  # Triton in its interpreter
            attn_shape=(1, 1, 32, 16),
            attn_dtype="float32",
            attn_impls=("flash_pytorch", "sdpa", "naive"),
            attn_warmup=1,
            attn_steps=6,
        ),
    },
    "registers": {"gpu": dict(quick=False), "cpu": dict(quick=True)},
    "01": {
        "gpu": dict(sizes=sizes_for("gpu"), autocast=("bfloat16", "float16"), **XB.PROFILES["gpu"]),
        "cpu": dict(sizes=["small/cpu"], autocast=("bfloat16",), batch=2, context=16, warmup=1, steps=3, cold_steps=2),
    },
    "02": {
        "gpu": {k: XR.PROFILES["gpu"][k] for k in ("rows", "hidden", "warmup", "steps", "compile_hidden")}
        | dict(dtypes=("float32", "bfloat16"), triton_shape=None),
        "cpu": dict(
            rows=256, hidden=[256], dtypes=("float32",), warmup=1, steps=6, compile_hidden=[], triton_shape=(16, 64)
        ),
    },
    **{
        f"06-{dtype}": {  # one batch per dtype: both in one came near the cap
            "gpu": {k: XA.PROFILES["gpu"][k] for k in ("bench_impls", "bench_shapes", "warmup", "flash_pytorch_max_T")}
            | dict(dtypes=(dtype,), steps=20),  # 20 timed steps (the notebook's 100) fit one batch
            "cpu": dict(
                bench_impls=["naive", "sdpa", "flash_pytorch"],
                bench_shapes=[(1, 2, 64, 16)],
                dtypes=(dtype,),
                warmup=2,
                steps=6,
                flash_pytorch_max_T=64,
            ),
        }
        for dtype in ("float32", "bfloat16")
    },
    "03": {  # two ranks: on one GPU they share it through gloo; NCCL runs only where each rank has a GPU
        "gpu": dict(
            sizes=XC.PROFILE_GRID["gpu"]["sizes"],
            world_sizes=(2,),
            combos=XC.PROFILE_GRID["gpu"]["combos"],
            warmup=5,
            iters=10,
            budget_s=1.0,
        ),
        "cpu": dict(
            sizes=(8 * 1024, 64 * 1024),
            world_sizes=(2,),
            combos=(("gloo", "cpu"),),
            warmup=XC.MIN_WARMUP,
            iters=3,
            budget_s=0.05,
        ),
    },
    "04": {  # the speed table without the sweep (sweep_model None) ...
        "gpu": {k: XD.PROFILES["gpu"][k] for k in ("sizes", "batch", "context", "warmup", "steps")}
        | dict(sweep_model=None, buckets_mb=[]),
        "cpu": dict(sizes=["small/cpu"], sweep_model=None, buckets_mb=[], batch=4, context=16, warmup=1, steps=2),
    },
    "04-sweep": {  # ... and the sweep model alone with the seed's bucket sizes (notebook 04's SEED_BUCKETS_MB)
        "gpu": {k: XD.PROFILES["gpu"][k] for k in ("sweep_model", "batch", "context", "warmup", "steps")}
        | dict(sizes=[XD.PROFILES["gpu"]["sweep_model"]], buckets_mb=list(XD.SEED_BUCKETS_MB)),
        "cpu": dict(
            sizes=["small/cpu"], sweep_model="small/cpu", batch=4, context=16, warmup=1, steps=2, buckets_mb=[1]
        ),
    },
    **{
        f"05-{kinds[0]}": {  # one batch per launch of notebook 05's gpu speed runs (one kind each): none near the cap
            "gpu": {k: XS.PROFILES["gpu"][k] for k in ("speed_model", "batch", "warmup", "steps")}
            | dict(context=64, speed_launches=[kinds]),  # notebook 05's speed runs use a context of 64
            "cpu": dict(speed_model="small/cpu", speed_launches=[kinds], batch=4, warmup=1, steps=2, context=16),
        }
        for kinds in XS.PROFILES["gpu"]["speed_launches"]
    },
    "07": {
        "gpu": {k: XF.PROFILES["gpu"][k] for k in ("model", "batch", "context", "warmup", "steps")},
        "cpu": dict(model="small/cpu", batch=4, context=16, warmup=1, steps=2),
    },
    "08": {  # tensor parallelism: TP and TP+SP against one process, and the TP step against the α-β model
        "gpu": {k: XM.PROFILES["gpu"][k] for k in ("model", "batch", "world", *XM.SPEED_KEYS)} | dict(speed_reps=5),
        "cpu": {k: XM.PROFILES["cpu"][k] for k in ("model", "batch", "world")}
        | dict(speed_tokens=64, speed_d_model=32, speed_widths=[64, 512], speed_reps=3),
    },
}


def scale(batch: str, profile: str) -> dict:
    """What `batch` runs at `profile` (a copy of SCALES[batch][profile])."""
    if batch not in SCALES:
        raise ValueError(f"unknown batch {batch!r}; batches: {', '.join(SCALES)}")
    if profile not in ("cpu", "gpu"):
        raise ValueError(f"profile must be 'cpu' or 'gpu', got {profile!r}")
    return dict(SCALES[batch][profile])


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def save_part(rows, name: str, part: str, profile: str, out: Path, **extra) -> str:
    """Save one batch's (or one launch's) share of result `name` as `name@part`, at once, then rebuild `name` from
    every part saved so far (their rows in part order): a batch split in several, or cut short, still leaves every
    part that ended. Returns `name`."""
    save_results(rows, f"{name}@{part}", profile=profile, directory=out, **extra)
    parts = [load_results(p) for p in sorted(Path(out).glob(f"{name}@*.jsonl"))]
    merged = pd.concat([r.frame() for r in parts], ignore_index=True)
    save_results(merged, name, profile=profile, directory=out, parts=[r.path.stem for r in parts], **extra)
    return name


def _two_ranks() -> tuple[str, str]:
    from helpers.launch import choose_backend

    return choose_backend(2)  # gloo on the CPU, or both ranks on one GPU through gloo; NCCL with a GPU per rank


# ---- the batches: each saves its rows into `out` and returns the names it saved ----


def run_kernels(s: dict, profile: str, out: Path) -> list[str]:
    """RMSNorm's Triton kernel fwd and fwd+bwd as a fraction of copy bandwidth (torchfn beside it); attention
    fwd+bwd at the 2025 leaderboard's shape, interleaved (notebooks 02 and 06)."""
    device = _device()
    norm = [
        XR.bench_norm(name, *s["norm_shape"], torch.float32, device, backward, s["norm_warmup"], s["norm_steps"])
        for backward in (False, True)
        for name in ("triton", "torchfn")
    ]
    save_results(norm, "kernels_rmsnorm", profile=profile, directory=out)
    _, attn = XA.leaderboard_comparison(
        s["attn_impls"], device, s["attn_warmup"], s["attn_steps"], tuple(s["attn_shape"]), _dtype(s["attn_dtype"])
    )
    save_results(
        attn,
        "kernels_attention",
        profile=profile,
        directory=out,
        published_ms=XA.PUBLISHED_MS,
        published_source="the 2025 leaderboard (H100, bf16)",
    )
    if device == "cuda":  # after both are saved: a noisy yardstick fails the batch, not its attention rows
        XR.check_fraction_of_copy(norm)
    return ["kernels_rmsnorm", "kernels_attention"]


def run_registers(s: dict, profile: str, out: Path) -> list[str]:
    """Every kernel configuration compiled for sm_80/sm_90a (ptxas -v: `python -m helpers kernels`), and on a GPU
    the registers and spills the driver reports for the quick subset (the leaderboard's and 4096-wide kernels)
    compiled for this device."""
    from helpers import kernel_check as K

    rows = K.check(quick=s["quick"])
    if torch.cuda.is_available():
        driver = {cfg.label: _driver_registers(cfg) for cfg in K.all_configs(quick=True)}
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
        for r in rows:
            r.update(device_arch=arch, **driver.get(r["kernel"], {}))
    save_results(rows, "kernels_registers", profile=profile, directory=out)
    return ["kernels_registers"]


def _driver_registers(cfg) -> dict:
    """Registers and spills of `cfg` compiled for this GPU, as the CUDA driver reports them on loading it."""
    import triton

    src = triton.compiler.ASTSource(
        fn=cfg.kernel, signature=cfg.signature, constexprs=cfg.constexprs, attrs=cfg.extra.get("attrs")
    )
    k = triton.compile(src, options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    k._init_handles()  # loads the cubin: the driver fills n_regs and n_spills
    return {"driver_registers": getattr(k, "n_regs", None), "driver_spills": getattr(k, "n_spills", None)}


def run_01(s: dict, profile: str, out: Path) -> list[str]:
    """Notebook 01: time per size and pass, cold and warm; peak memory per size and precision; FLOPs and MFU."""
    device = torch.device(_device())
    B, T, W = s["batch"], s["context"], s["warmup"]
    times = XB.time_sizes(
        s["sizes"], B, T, device=device, runs=[dict(warmup=0, steps=s["cold_steps"]), dict(warmup=W, steps=s["steps"])]
    )
    times["profile"] = profile
    precision = "tf32" if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32 else "fp32"
    edition = size_edition(s["sizes"][0])  # whose model ran: the answers page says so per edition
    model = dict(edition=edition, arch=edition_arch(edition))
    save_results(times, "01_timing", profile=profile, directory=out, batch=B, context=T, precision=precision, **model)
    dtypes = [_dtype(d) for d in s["autocast"]]
    peaks = XB.peak_rows(s["sizes"], B, T, dtypes, device).assign(profile=profile)
    save_results(peaks, "01_memory_peaks", profile=profile, directory=out, batch=B, context=T, **model)
    name = env.machine_facts()["device"]
    both = XB.warm_cold(times, W)[1].xs("both", level="pass")["median_s"]
    flops = XB.flops_table({sz: both.get(sz, float("nan")) for sz in s["sizes"]}, B, T, name, precision)
    save_results(
        flops.reset_index().assign(device=name, profile=profile),
        "01_flops",
        profile=profile,
        directory=out,
        batch=B,
        context=T,
        **model,
    )
    return ["01_timing", "01_memory_peaks", "01_flops"]


def run_02(s: dict, profile: str, out: Path) -> list[str]:
    """Notebook 02's kernel benchmark: torchfn, compiled and Triton per width and dtype, fraction of copy bandwidth."""
    rows = XR.bench_kernels(
        rows=s["rows"],
        hidden=s["hidden"],
        dtypes=[_dtype(d) for d in s["dtypes"]],
        device=_device(),
        warmup=s["warmup"],
        steps=s["steps"],
        compile_hidden=s["compile_hidden"],
        triton_shape=s["triton_shape"],
    )
    bench = pd.DataFrame(rows)
    bench["median_ms"] = bench["median_s"] * 1e3
    save_results(bench, "rmsnorm_bench", profile=profile, directory=out)
    if _device() == "cuda":  # after saving: a noisy yardstick fails the batch, not its rows
        XR.check_fraction_of_copy(bench[bench.rows == s["rows"]])
    return ["rmsnorm_bench"]


def run_06(s: dict, profile: str, out: Path) -> list[str]:
    """Notebook 06's benchmark: every attention implementation per shape and dtype, causal, fwd / bwd / fwd+bwd."""
    rows = XA.sweep(
        s["bench_impls"],
        s["bench_shapes"],
        [_dtype(d) for d in s["dtypes"]],
        _device(),
        True,
        s["warmup"],
        s["steps"],
        max_T={"flash_pytorch": s["flash_pytorch_max_T"]},
    )
    bench = pd.DataFrame(rows)
    bench["ms"] = bench["median_s"] * 1e3
    saved = save_part(bench, "attention_bench", "+".join(s["dtypes"]), profile, out)
    if _device() == "cuda":  # after saving; timing bounds on a tiny cpu plan are noise, not physics
        XA.check_physical_bounds(rows, env.machine_facts()["device"])
    return [saved]


def run_03(s: dict, profile: str, out: Path) -> list[str]:
    """Notebook 03's grid at two ranks: every op and size per backend and device that can run here."""
    df, todo = XC.run_grid(
        s["sizes"], XC.OPS, s["world_sizes"], s["combos"], s["warmup"], s["iters"], budget_s=s["budget_s"]
    )
    if df.empty:
        raise RuntimeError("no (backend, device) of the grid can run here:\n" + todo.to_string(index=False))
    if df["wrong"].sum():
        raise RuntimeError(f"{int(df['wrong'].sum())} collective results were wrong")
    save_results(
        df,
        XC.RESULTS_NAME,
        profile=profile,
        directory=out,
        method=XC.METHOD,
        warmup=s["warmup"],
        topology="1 node, spawned ranks",
    )
    return [XC.RESULTS_NAME]


def run_04(s: dict, profile: str, out: Path, name: str = "04_ddp_speed") -> list[str]:
    """Notebook 04's speed table: every DDP variant and torch DDP, interleaved, per size (with the bucket sweep on
    the sweep model, if it is one of the sizes)."""
    backend, device = _two_ranks()
    _, speed = XD.speed_table(
        s["sizes"],
        sweep_model=s["sweep_model"],
        buckets_mb=s["buckets_mb"],
        steps=s["steps"],
        warmup=s["warmup"],
        batch_size=s["batch"],
        context_length=s["context"],
        backend=backend,
        device=device,
        trace_dir=None,
    )
    save_results(
        speed,
        name,
        profile=profile,
        directory=out,
        backend=backend,
        device_used=device,
        batch=s["batch"],
        context=s["context"],
        buckets_mb=s["buckets_mb"],
    )
    return [name]


def run_05(s: dict, profile: str, out: Path) -> list[str]:
    """Notebook 05's speed runs: each kind's iteration, step and communication time (one launch per kind list)."""
    from helpers.launch import launch

    backend, device = _two_ranks()
    for kinds in s["speed_launches"]:  # each launch's rows saved as it ends
        runs = launch(
            functools.partial(
                XS.speed_worker,
                model=s["speed_model"],
                kinds=kinds,
                steps=s["steps"],
                warmup=s["warmup"],
                batch_size=s["batch"],
                context_length=s["context"],
            ),
            2,
            backend=backend,
            device=device,
        )
        if not all(all(r.same_weights.values()) for r in runs):
            raise RuntimeError("the sharded runs did not end with the unsharded run's weights")
        save_part(
            XS.speed_table([runs]).reset_index(),
            "05_sharding_speed",
            "+".join(kinds),
            profile,
            out,
            backend=backend,
            device_used=device,
            model=s["speed_model"],
            batch=s["batch"],
            context=s["context"],
        )
    return ["05_sharding_speed"]


def run_07(s: dict, profile: str, out: Path) -> list[str]:
    """Notebook 07's measurement: FSDP, DDP, ZeRO-1 and fully_shard step time (interleaved) and memory per rank."""
    from helpers.launch import launch

    backend, device = _two_ranks()
    per_rank = launch(
        functools.partial(
            XF.measure_worker,
            model=s["model"],
            batch_size=s["batch"],
            context_length=s["context"],
            steps=s["steps"],
            warmup=s["warmup"],
            trace=False,
        ),
        2,
        backend=backend,
        device=device,
    )
    extra = dict(backend=backend, device_used=device, model=s["model"], batch=s["batch"], context=s["context"])
    save_results(XF.speed_table(per_rank).reset_index(), "07_fsdp_speed", profile=profile, directory=out, **extra)
    save_results(XF.memory_table(per_rank), "07_fsdp_memory", profile=profile, directory=out, **extra)
    return ["07_fsdp_speed", "07_fsdp_memory"]


def run_08(s: dict, profile: str, out: Path) -> list[str]:
    """Notebook 08's tensor parallelism: TP and TP+SP against one process (exactness, bytes, one block's memory) and
    the TP feed-forward's step against the α-β model per width (what the 2026 tp_calcs / fsdp_tp_calcs answers
    quote beside their closed forms)."""
    from helpers.experiments import model_parallel_calc as XT

    backend, device = _two_ranks()
    run = XM.tensor_parallel_run(s, profile, backend=backend, device=device)
    for section in (XM.exactness_section, XM.bytes_section, XM.memory_section):
        section(run, directory=out)
    XT.speed_section(XT.tp_speed_run(s, profile, backend=backend, device=device), directory=out)
    return ["08_tp_exactness", "08_tp_bytes", "08_tp_memory", "08_tp_speed"]


BODIES = {
    "kernels": run_kernels,
    "registers": run_registers,
    "01": run_01,
    "02": run_02,
    "03": run_03,
    "04": run_04,
    "04-sweep": functools.partial(run_04, name="04_ddp_sweep_speed"),
    "07": run_07,
    "08": run_08,
    **{name: run_06 for name in SCALES if name.startswith("06-")},
    **{name: run_05 for name in SCALES if name.startswith("05-")},
}
assert set(BODIES) == set(SCALES)


def run_batch(batch: str, profile: str, out) -> list[str]:
    """Run one batch here (not in a child process) and return the result names it saved into `out`."""
    s = scale(batch, profile)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return BODIES[batch](s, profile, out)


def main(argv: list[str] | None = None) -> int:
    """Entry of one batch's child process: run it, print the names it saved."""
    p = argparse.ArgumentParser(prog="python -m helpers.course.reference_batches")
    p.add_argument("batch", choices=list(BODIES))
    p.add_argument("--profile", required=True, choices=["cpu", "gpu"])
    p.add_argument("--out", required=True, help="the device's folder to save into")
    args = p.parse_args(argv)
    names = run_batch(args.batch, args.profile, args.out)
    print("saved: " + " ".join(names))
    return 0


if __name__ == "__main__":  # importing helpers (the package) first set TRITON_INTERPRET=1 where there is no GPU
    sys.exit(main())
