"""Notebook 06's timings of one implementation at a time: each pass's median and TFLOP/s per shape (an out-of-memory
row where the device runs out), the sweep over implementations, shapes and dtypes, and the physical bounds.

    bench_attention("naive", shape=(8, 1, 1024, 64), dtype=torch.float32, device="cuda")    # fwd, bwd, fwd+bwd rows
    check_physical_bounds(sweep(["naive", "sdpa"], [(1, 4, 512, 64)], [torch.float32]), "cpu")
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from helpers import attention as A
from helpers.experiments.attention_impls import PASSES, attention_fn, inputs, is_oom, pass_steps
from helpers.formulas import peak_flops
from helpers.timing import benchmark


def bench_attention(
    impl: str,
    shape,
    dtype=torch.float32,
    device="cpu",
    is_causal: bool = False,
    warmup: int = 3,
    steps: int = 10,
    passes=PASSES,
    fns: dict | None = None,
) -> list[dict]:
    """One row per pass: median time, TFLOP/s from attention_flops (causal: only j <= i counted); oom=True (and no
    time) where the device runs out of memory (notebook 06 sections 1 and 4)."""
    B, H, T, d = shape
    base = dict(impl=impl, batch=B, heads=H, T=T, d=d, dtype=str(dtype).replace("torch.", ""), causal=is_causal)
    rows = []
    try:
        q, k, v, do = inputs(shape, dtype, device)
        steps_by_pass = pass_steps(attention_fn(impl, q, is_causal, fns), q, k, v, do)
        for name in passes:
            t = benchmark(steps_by_pass[name], warmup=warmup, steps=steps, device=device, label=f"{impl} {name} T={T}")
            flops = sum(
                A.attention_flops(B * H, T, T, d, is_causal, backward=p == "bwd") for p in ("fwd", "bwd") if p in name
            )
            rows.append(t.as_row(**base, oom=False, flops=flops, TFLOPs=flops / t.median / 1e12, **{"pass": name}))
    except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
        if not is_oom(err):
            raise
        done = {r["pass"] for r in rows}
        rows += [
            dict(base, device=str(device), oom=True, median_s=math.nan, TFLOPs=math.nan, **{"pass": p})
            for p in passes
            if p not in done
        ]
    finally:
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return rows


def sweep(
    impls,
    shapes,
    dtypes,
    device="cpu",
    is_causal=False,
    warmup=3,
    steps=10,
    max_T: dict | None = None,
    fns: dict | None = None,
):
    """bench_attention rows for every impl x shape x dtype (impls in max_T only up to that sequence length; fns:
    implementations beyond the named ones, as attention_fn takes them)."""
    from tqdm.auto import tqdm

    jobs = [(i, s, dt) for dt in dtypes for s in shapes for i in impls if s[2] <= (max_T or {}).get(i, s[2])]
    return [
        r
        for i, s, dt in tqdm(jobs, desc="attention", leave=False)
        for r in bench_attention(
            i, s, dt, device, is_causal, warmup, min(steps, TILED_STEPS) if i.endswith("pytorch") else steps, fns=fns
        )
    ]


TILED_STEPS = 10  # the PyTorch tiles' timed steps at most: ~10^4-10^5 eager launches each (attention.tiled_launches),
# so 100 steps at T = 4096 took 5-8 minutes of notebook 06 on a GPU; their medians need no more


def check_physical_bounds(rows, device_name: str, order: bool = True) -> int:
    """Assert TFLOP/s <= the device's peak (bf16/fp16 peak for 16-bit, tf32 peak for fp32: the highest an fp32 run
    may reach) and, with `order`, forward <= forward+backward (order_violations); returns how many rows had a known
    peak. `order` only where the times are the device's own (CUDA events): on a CPU each pass is timed in its own
    window of host time, and a busy machine can slow one window's every call (issue 40: a forward 6x its
    forward+backward on a shared 2-core machine)."""
    df = pd.DataFrame(rows)
    df = df[~df.oom]
    known = 0
    for r in df.to_dict("records"):
        peak = peak_flops(device_name, "tf32" if r["dtype"] == "float32" else "bf16")
        if peak is not None:
            known += 1
            assert r["TFLOPs"] * 1e12 <= peak, f"{r['impl']} {r['pass']} T={r['T']}: {r['TFLOPs']:.0f} TFLOP/s > peak"
    if order:
        bad = order_violations(rows)
        assert bad.empty, f"forward slower than forward+backward:\n{bad}"
    return known


def order_violations(rows) -> pd.DataFrame:
    """The (impl, shape, dtype) whose fastest forward took over 1.05x its fastest forward+backward: impossible for
    the same work on a quiet device (fastest calls: a busy machine only adds time)."""
    df = pd.DataFrame(rows)
    df = df[~df.oom]
    key = ["impl", "batch", "heads", "T", "d", "dtype"]
    t = df.pivot_table(index=key, columns="pass", values="min_s")
    if not {"fwd", "fwd+bwd"} <= set(t.columns):
        return t.iloc[0:0]
    return t[t["fwd"] > 1.05 * t["fwd+bwd"]]
