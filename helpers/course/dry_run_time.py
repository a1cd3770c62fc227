"""The gpu profile's time against the limits it runs under, from the reference run's cost model
(helpers.course.reference_cost: closed-form FLOPs and bytes over an H100's datasheet rates at GPU_EFFICIENCY, plus
process starts, launches and compiles; an H200 has the same peaks):

- each reference batch, as `python -m helpers reference` runs it on a lent GPU: at most MAX_BATCH_S, the runner's
  timeout per batch, which sits under the lent machine's cut of a command (LENT_COMMAND_S; the README's chunks of
  540 s hold whole batches only);
- the notebooks' heaviest cells at the gpu profile's sizes, as `make writeup PROFILE=gpu` runs them: at most
  WRITEUP_CELL_S, the writeup kernel's per-cell timeout (`python -m helpers writeup --timeout`'s default). That is
  the limit that fails a gpu cell: `make test` runs the notebooks at the cpu profile's sizes on a GPU too (its
  CELL_TIMEOUT is sized for the CPU), and the writeup runs on the reader's own GPU machine, not under a lent
  machine's 10-minute cut (the eight notebooks together take hours; a lent machine runs the reference batches).

    check_time(time_table())     # ValueError naming every cell or batch whose estimate is over its limit

Cells the cost model has a batch for take that batch's estimator on the notebook's own sizes (the notebook times 100
steps where batch 06 times 20, and 04's speed cell is batches 04 and 04-sweep together); the others are a step's
training FLOPs over the same rates. Not estimated: cells of seconds (checks, tables, calculators).
"""

from __future__ import annotations

import pandas as pd

from helpers import formulas as F
from helpers.course.reference import MAX_BATCH_S
from helpers.course.reference_batches import SCALES
from helpers.course.reference_cost import ESTIMATORS, Rates, gpu_rates, model_estimate_s
from helpers.experiments import attention as XA
from helpers.experiments import benchmarking as XB
from helpers.experiments import collectives as XC
from helpers.experiments import gpu_configs as GC
from helpers.experiments import gpu_plans as G
from helpers.experiments import rmsnorm as XR
from helpers.model import get_config

GPU = "NVIDIA H100 80GB HBM3"  # the lent card (torch.cuda.get_device_name's spelling)
LENT_COMMAND_S = 600  # a lent GPU machine cuts a command at 10 minutes
WRITEUP_CELL_S = 3600  # helpers.writeup's --timeout default: seconds per cell under make writeup PROFILE=gpu


def _dtype_names(dtypes) -> tuple:
    return tuple(str(d).replace("torch.", "") for d in dtypes)


def _train_s(size, batch: int, context: int, r: Rates, dtype: str = "float32", recompute: float = 0.0) -> float:
    """One forward+backward of `size` (training FLOPs at the dtype's rate), a `recompute` share of a forward more."""
    return F.train_flops(get_config(size), batch, context) * (1 + recompute / 3) / r.flops_for(dtype)


def cell_estimates(r: Rates, edition: str = GC.DEFAULT_EDITION) -> list[tuple[str, str, float]]:
    """(notebook, cell, seconds) of the gpu profile's heaviest cells, with the models each notebook builds for
    `edition` (gpu_configs)."""
    e01 = GC.config_01("gpu", edition)
    b = {**XB.PROFILES["gpu"], **{k: e01[k] for k in ("batch", "context")}}
    r_, a = XR.PROFILES["gpu"], XA.PROFILES["gpu"]
    d, s = GC.config_04("gpu", edition), GC.config_05("gpu", edition)
    f = GC.config_07("gpu", GC.built_edition("07", edition))
    est = ESTIMATORS
    one_05, one_06 = next(n for n in SCALES if n.startswith("05-")), next(n for n in SCALES if n.startswith("06-"))
    precision = sum(
        (b["warmup"] + b["steps"]) * 3 * _train_s(z, b["batch"], b["context"], r) for z in e01["sizes"]
    )  # §4: one model per size, fp32, bf16 and fp16 interleaved (all at fp32's rate: the slower one)
    steps = b["cold_steps"] + b["warmup"] + b["steps"]  # §1's full step with AdamW, where the edition times it
    step = sum(steps * _train_s(z, b["batch"], b["context"], r) for z in e01["sizes"]) if "step" in e01["kinds"] else 0
    memory = sum(  # §5 by context (2025, 2026): a model per context and precision, three tracked steps
        3 * 3 * _train_s(z, b["batch"], t, r) for z, t in e01["memory"]
    ) if len({z for z, _ in e01["memory"]}) == 1 else 0  # fmt: skip
    grid = [(2 * a["batch"], 1, T, dh) for dh in a["head_dims"] for T in a["seq_lens"]]  # not causal: 2x causal
    models = sum(
        len(a["model_impls"]) * (a["warmup"] + a["model_steps"])
        * _train_s(z, a["model_batch"], get_config(z).context_length, r, "bfloat16")
        for z in a["model_sizes"]
    )  # fmt: skip
    ckpt_step = _train_s(f["ckpt_model"], f["ckpt_batch"], f["ckpt_context"], r, recompute=1)
    ckpt = len(f["segments"]) * (f["ckpt_steps"] + 2) * ckpt_step  # + a warm-up and a tracked step per segment
    return [
        (
            "01",
            "§1 timing and §5 memory peaks",
            est["01"](dict(sizes=e01["sizes"], autocast=("bfloat16", "float16"), **b), r) + step + memory,
        ),  # fmt: skip
        ("01", "§4 precision loop", precision),
        (
            "02",
            "§5 kernel benchmark",
            est["02"](
                {
                    **{k: r_[k] for k in ("rows", "hidden", "warmup", "steps", "compile_hidden")},
                    "dtypes": _dtype_names(r_["dtypes"]),
                    "triton_shape": None,
                },
                r,
            ),
        ),  # fmt: skip
        ("03", "§2 collectives grid", est["03"](dict(XC.PROFILE_GRID["gpu"]), r)),
        ("04", "§2 speed table and bucket sweep", est["04"]({**d, "buckets_mb": G.sweep_buckets_mb()}, r)),
        ("05", "§4 speed launches", est[one_05]({**s, "context": 64}, r)),
        (
            "06",
            "§1 naive attention grid",
            est[one_06](
                dict(
                    bench_impls=["naive"],
                    bench_shapes=grid,
                    dtypes=("float32",),
                    warmup=a["warmup"],
                    steps=a["steps"],
                    flash_pytorch_max_T=0,
                ),
                r,
            ),
        ),  # fmt: skip
        (
            "06",
            "§4 benchmark",
            est[one_06](
                dict(
                    bench_impls=a["bench_impls"],
                    bench_shapes=a["bench_shapes"],
                    dtypes=_dtype_names(a["bench_dtypes"]),
                    warmup=a["warmup"],
                    steps=a["steps"],
                    flash_pytorch_max_T=a["flash_pytorch_max_T"],
                ),
                r,
            ),
        ),  # fmt: skip
        ("06", "§6 models", models),
        ("07", "§2-§4 measure launch", est["07"](f, r)),
        ("07", "§5 checkpoint sweep", ckpt),
    ]


def time_table(device: str = GPU, gpus: int = 1, editions=GC.EDITIONS) -> pd.DataFrame:
    """One row per reference batch and per heavy gpu cell of each edition: the cost model's seconds on `device` and
    the limit."""
    r = gpu_rates(device, gpus)
    batch_limit = min(MAX_BATCH_S, LENT_COMMAND_S)
    rows = [
        dict(what="batch", notebook=name[:2] if name[0].isdigit() else "02, 06", name=name,
             estimate_s=model_estimate_s(name, "gpu", r), limit_s=batch_limit)
        for name in SCALES
    ]  # fmt: skip
    rows += [
        dict(what="cell", notebook=nb, name=f"{cell} ({edition} models)", estimate_s=seconds, limit_s=WRITEUP_CELL_S)
        for edition in editions
        for nb, cell, seconds in cell_estimates(r, edition)
    ]
    table = pd.DataFrame(rows)
    table["over"] = table["estimate_s"] > table["limit_s"]
    return table


def check_time(table: pd.DataFrame) -> pd.DataFrame:
    """`table`, or a ValueError naming each cell or batch whose estimate is over its limit."""
    over = table[table["over"]]
    if len(over):
        raise ValueError(
            "dry run: over the time limit by the cost model:\n"
            + "\n".join(
                f"  {r.what} {r.name} (notebook {r.notebook}): about {r.estimate_s:.0f} s, limit {r.limit_s:.0f} s"
                + (" (the reference runner's batch timeout)" if r.what == "batch" else " (make writeup's per cell)")
                for r in over.itertuples()
            )
        )
    return table
