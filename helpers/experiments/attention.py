"""Notebook 06's experiments: naive attention's time and O(T^2) memory, the FlashAttention-2 algorithm step by step,
each Triton kernel against its spec, benchmarks in time and TFLOP/s, and the attention choice inside the model.

    bench_attention("naive", shape=(8, 1, 1024, 64), dtype=torch.float32, device="cuda")    # fwd, bwd, fwd+bwd rows
    saved_memory("flash_pytorch", (2, 1, 512, 64))          # bytes live before backward, measured and closed form
    check_kernel("fwd", (1, 2, 40, 16), torch.float32)      # one Triton kernel vs its PyTorch spec
    compare_models("small/cpu", ["naive", "sdpa", "flash_pytorch"])   # model fwd+bwd, interleaved
    python -m helpers bench attention        # CUDA: the leaderboard configuration (Triton vs SDPA vs naive)
    python -m helpers bench attention --seq 256 1024 --head-dim 64 --dtype bfloat16 --impls flash_triton sdpa
"""

from __future__ import annotations

import argparse
import math

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from helpers import attention as A
from helpers.env import triton_mode
from helpers.experiments.common import positive_int, variant_runs
from helpers.formulas import peak_flops
from helpers.model import ATTENTION_IMPLS, ModelConfig, build_model, lm_loss, random_batch
from helpers.published import MARKS
from helpers.results import save_results
from helpers.timing import benchmark, compare

TOL = {
    torch.float64: dict(rtol=1e-10, atol=1e-12),  # the algorithm's steps vs naive attention: rounding error
    torch.float32: dict(rtol=1e-4, atol=1e-5),  # tiled sums in another order, fp32 accumulators
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
}  # P cast to bf16 before P V: a few bf16 ulps
MODEL_TOL = dict(rtol=1e-4, atol=1e-5)  # tiny model: logits and every gradient, fp32, any attention vs naive
TINY = ModelConfig("tiny", 64, 128, 2, 4, vocab_size=50, context_length=48)  # head dim 16: Triton's smallest
LEADERBOARD = dict(batch=1, heads=16, T=16384, d=64, dtype=torch.bfloat16, is_causal=True)  # fwd+bwd, one H100
PUBLISHED_MS = {
    "naive (published)": MARKS["leaderboard_2025_naive"].value,  # the 2025 leaderboard, H100, bf16
    "best class entry": MARKS["leaderboard_2025_best"].value,
}  # (helpers.published holds the marks)
PROFILES = {  # what notebook 06 measures per profile
    "gpu": dict(
        batch=8,
        head_dims=[16, 32, 64, 128],
        seq_lens=[256, 1024, 4096, 8192, 16384],
        warmup=5,
        steps=100,
        compile_shape=(8, 1, 4096, 64),
        bench_shapes=[(1, 16, T, 64) for T in (1024, 4096, 16384)],
        bench_dtypes=[torch.float32, torch.bfloat16],
        bench_impls=["naive", "sdpa", "compiled", "flash_pytorch", "flash_triton"],
        flash_pytorch_max_T=4096,
        memory_seq_lens=[1024, 2048, 4096, 8192],
        memory_shape=(8, 1, 64),
        model_sizes=["small", "medium", "large", "xl"],
        model_impls=list(ATTENTION_IMPLS),
        model_batch=4,
        model_dtype=torch.bfloat16,
        model_steps=20,
        kernel_shape=(2, 4, 200, 64),
    ),
    "cpu": dict(
        batch=2,
        head_dims=[16, 64],
        seq_lens=[128, 256, 512, 1024],
        warmup=2,
        steps=6,  # timing.MIN_PAIRS
        compile_shape=(2, 1, 512, 64),
        bench_shapes=[(1, 4, 512, 64)],
        bench_dtypes=[torch.float32],
        bench_impls=["naive", "sdpa", "compiled", "flash_pytorch"],
        flash_pytorch_max_T=512,
        memory_seq_lens=[128, 256, 512, 1024],
        memory_shape=(2, 1, 32),
        model_sizes=["small/cpu"],
        model_impls=["naive", "sdpa", "flash_pytorch"],
        model_batch=4,
        model_dtype=None,
        model_steps=10,
        kernel_shape=(1, 2, 40, 16),
    ),
}
PASSES = ("fwd", "bwd", "fwd+bwd")


def inputs(shape, dtype=torch.float32, device="cpu", seed=0, requires_grad=True) -> tuple[Tensor, ...]:
    """q, k, v (B, H, T, d) and an upstream gradient dO, drawn in fp32 on the device and cast."""
    if len(shape) != 4 or min(shape) < 1:
        raise ValueError(f"shape must be (batch, heads, T, d) with every entry >= 1; got {shape}")
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (torch.randn(*shape, generator=gen, device=device).to(dtype) for _ in range(4))  # (B, H, T, d)
    return (*(t.requires_grad_(requires_grad) for t in (q, k, v)), do)


_COMPILED: dict = {}


def compiled_naive(key) -> callable:
    """torch.compile(naive_attention) for one (shape, dtype, causal) key, kept for reuse; dynamo is reset before
    its recompile limit (8 shapes of one function) is reached."""
    if key not in _COMPILED:
        if len(_COMPILED) >= 6:
            torch._dynamo.reset()
            _COMPILED.clear()
        _COMPILED[key] = torch.compile(A.naive_attention, dynamic=False)
    return _COMPILED[key]


def attention_fn(impl: str, q: Tensor, is_causal: bool, fns: dict | None = None):
    """f(q, k, v) for impl in naive | sdpa | compiled (torch.compile of naive) | flash_pytorch | flash_triton, or a
    name of `fns` ({label: apply(q, k, v, is_causal)}: another implementation, e.g. a student's)."""
    if fns and impl in fns:
        return lambda q, k, v, f=fns[impl]: f(q, k, v, is_causal)
    if impl == "naive":
        return lambda q, k, v: A.naive_attention(q, k, v, is_causal)
    if impl == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    if impl == "compiled":
        compiled = compiled_naive((tuple(q.shape), q.dtype, is_causal))
        return lambda q, k, v: compiled(q, k, v, is_causal)
    if impl in ("flash_pytorch", "flash_triton"):
        fn = A.FlashAttentionPyTorch if impl == "flash_pytorch" else A.FlashAttentionTriton
        return lambda q, k, v: fn.apply(q, k, v, is_causal)
    raise ValueError(f"unknown attention {impl!r}; known: naive, sdpa, compiled, flash_pytorch, flash_triton")


def pass_steps(fn, q, k, v, do) -> dict:
    """The three timed steps on one input: forward; backward alone (one graph kept, retain_graph); both."""
    o = fn(q, k, v)  # the graph the backward step reuses
    return {
        "fwd": lambda: fn(q, k, v),
        "bwd": lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True),
        "fwd+bwd": lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), do),
    }


def _is_oom(err: Exception) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


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
        if not _is_oom(err):
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


def check_physical_bounds(rows, device_name: str) -> int:
    """Assert TFLOP/s <= the device's peak (bf16/fp16 peak for 16-bit, tf32 peak for fp32: the highest an fp32 run
    may reach) and forward <= forward+backward (fastest calls, 5% slack); returns how many rows had a known peak."""
    df = pd.DataFrame(rows)
    df = df[~df.oom]
    known = 0
    for r in df.to_dict("records"):
        peak = peak_flops(device_name, "tf32" if r["dtype"] == "float32" else "bf16")
        if peak is not None:
            known += 1
            assert r["TFLOPs"] * 1e12 <= peak, f"{r['impl']} {r['pass']} T={r['T']}: {r['TFLOPs']:.0f} TFLOP/s > peak"
    key = ["impl", "batch", "heads", "T", "d", "dtype"]
    t = df.pivot_table(index=key, columns="pass", values="min_s")  # fastest calls: a busy machine only adds time
    if {"fwd", "fwd+bwd"} <= set(t.columns):
        bad = t[t["fwd"] > 1.05 * t["fwd+bwd"]]
        assert bad.empty, f"forward slower than forward+backward:\n{bad}"
    return known


# ---- memory saved for backward: measured by the tracker vs closed forms ----------------------------------------


def saved_bytes_formula(impl: str, shape, dtype=torch.float32, is_causal: bool = False) -> int:
    """Bytes a forward leaves live for backward beyond q, k, v: naive keeps P (one score matrix), the output and
    (causal) a bool mask; FlashAttention keeps the output and L (fp32, one number per query row)."""
    B, H, T, d = shape
    out = B * H * T * d * dtype.itemsize
    if impl == "naive":
        return A.score_matrix_bytes(B * H, T, T, dtype) + out + (T * T if is_causal else 0)
    if impl in ("flash_pytorch", "flash_triton"):
        return out + B * H * T * torch.promote_types(dtype, torch.float32).itemsize
    raise ValueError(f"no closed form for {impl!r}; known: naive, flash_pytorch, flash_triton")


def saved_memory(impl: str, shape, dtype=torch.float32, device="cpu", is_causal: bool = False) -> dict:
    """Run one forward under helpers.memory.track; the bytes live before backward (beyond q, k, v) and the peak,
    measured, beside saved_bytes_formula (notebook 06 sections 1 and 5)."""
    from helpers.memory import track

    B, H, T, d = shape
    row = dict(
        impl=impl,
        batch=B,
        heads=H,
        T=T,
        d=d,
        dtype=str(dtype).replace("torch.", ""),
        causal=is_causal,
        formula_bytes=saved_bytes_formula(impl, shape, dtype, is_causal),
        score_matrix_bytes=A.score_matrix_bytes(B * H, T, T, dtype),
    )
    try:
        q, k, v, _ = inputs(shape, dtype, device)
        fn = attention_fn(impl, q, is_causal)
        trace = track(lambda: fn(q, k, v), existing=(q, k, v), device=device)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
        if not _is_oom(err):
            raise
        return dict(row, oom=True, saved_bytes=math.nan, peak_bytes=math.nan)
    return dict(
        row,
        oom=False,
        saved_bytes=trace.current_bytes - trace.baseline_bytes,
        peak_bytes=trace.peak_bytes - trace.baseline_bytes,
    )


# ---- the algorithm, step by step (float64, small shapes) -------------------------------------------------------


def online_softmax(s: Tensor, block: int) -> tuple[Tensor, Tensor, Tensor]:
    """Walk the key axis of scores s (..., Tk) in blocks, keeping only a running max m and running sum lsum (the
    paper's ℓ) of exp(s - m): returns m, lsum and logsumexp = m + log lsum, equal to torch.logsumexp(s, -1)."""
    m = torch.full(s.shape[:-1], float("-inf"), dtype=s.dtype)  # (...,)
    lsum = torch.zeros(s.shape[:-1], dtype=s.dtype)  # (...,)
    for j0 in range(0, s.shape[-1], block):
        sj = s[..., j0 : j0 + block]  # (..., Bk)
        m_new = torch.maximum(m, sj.amax(-1))
        lsum = lsum * torch.exp(m - m_new) + torch.exp(sj - m_new[..., None]).sum(-1)  # old terms rescaled to new max
        m = m_new
    return m, lsum, m + torch.log(lsum)


def backward_from_lse(q, k, v, o, lse, do, is_causal=False) -> tuple[Tensor, Tensor, Tensor]:
    """The FA-2 backward untiled: P = exp(S - L) rebuilt from L, D = rowsum(dO * O), dS = P * (dP - D)."""
    scale = q.shape[-1] ** -0.5
    s = q @ k.transpose(-2, -1) * scale  # (..., Tq, Tk)
    if is_causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).tril().logical_not(), float("-inf"))
    p = torch.exp(s - lse[..., None])  # (..., Tq, Tk) P, exactly softmax(S) when L = logsumexp(S)
    dv = p.transpose(-2, -1) @ do  # (..., Tk, d)
    dp = do @ v.transpose(-2, -1)  # (..., Tq, Tk)
    delta = (do * o).sum(-1, keepdim=True)  # (..., Tq, 1) = rowsum(P * dP)
    ds = p * (dp - delta)  # (..., Tq, Tk)
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv


def naive_grads(q, k, v, do, is_causal=False) -> tuple[Tensor, ...]:
    """o and dq, dk, dv of naive_attention by autograd: the reference for every check."""
    o = A.naive_attention(q, k, v, is_causal)
    return (o.detach(), *torch.autograd.grad(o, (q, k, v), do))


def check_function(fn, shape, dtype=torch.float32, device="cpu", is_causal: bool = False) -> float:
    """Assert fn(q, k, v, is_causal)'s output and dq, dk, dv equal naive attention's (autograd, fp32 from the same
    inputs; fp64 stays fp64) within TOL[dtype]; the largest error."""
    q, k, v, do = inputs(shape, dtype, device)
    up = dtype if dtype == torch.float64 else torch.float32
    ref = naive_grads(*(t.detach().to(up).requires_grad_() for t in (q, k, v)), do.to(up), is_causal)
    o = fn(q, k, v, is_causal)
    got = (o.detach(), *torch.autograd.grad(o, (q, k, v), do))
    worst = 0.0
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, ref, strict=True):
        torch.testing.assert_close(
            a, b.to(dtype), **TOL[dtype], msg=lambda m, name=name: f"{name} ({dtype}, {shape}): {m}"
        )
        worst = max(worst, float((a.double() - b.double()).abs().max()))
    return worst


# ---- each Triton kernel against its spec (interpreter on CPU) --------------------------------------------------


def run_kernel(name: str, q, k, v, do, is_causal: bool = False) -> dict:
    """Launch one kernel (fwd | dkdv | dq) as FlashAttentionTriton does, on contiguous (B, H, T, d) inputs; L and D
    for the backward kernels come from the spec (attention_lse, rowsum(dO * O)), so each kernel is checked alone."""
    q, k, v, do = (t.detach().contiguous() for t in (q, k, v, do))
    B, H, T, d = q.shape
    cfg = A._launch_config(d, q.dtype, q.device)
    args = (*q.stride(), *k.stride(), *v.stride())
    opts = dict(
        D=d, IS_CAUSAL=is_causal, PRECISION=cfg.dot_precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages
    )
    if name == "fwd":
        o, lse = torch.empty_like(q), torch.empty(B, H, T, device=q.device)
        A.attn_fwd_kernel[(-(-T // cfg.block_q), B * H)](
            q, k, v, o, lse, *args, *o.stride(), H, T, T, d**-0.5, BQ=cfg.block_q, BK=cfg.block_k, **opts
        )
        return {"o": o, "lse": lse}
    lse = A.attention_lse(q, k, is_causal).float().contiguous()  # (B, H, T)
    delta = (do.float() * A.naive_attention(q, k, v, is_causal).float()).sum(-1).contiguous()  # (B, H, T)
    args = (*args, *do.stride(), H, T, T, d**-0.5)
    grid = (-(-T // cfg.block_own), B * H)
    if name == "dkdv":
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        A.attn_bwd_dkdv_kernel[grid](
            q, k, v, do, lse, delta, dk, dv, *args, BN=cfg.block_own, BM=cfg.block_loop, **opts
        )
        return {"dk": dk, "dv": dv}
    if name == "dq":
        dq = torch.empty_like(q)
        A.attn_bwd_dq_kernel[grid](q, k, v, do, lse, delta, dq, *args, BM=cfg.block_own, BN=cfg.block_loop, **opts)
        return {"dq": dq}
    raise ValueError(f"unknown kernel {name!r}; known: fwd, dkdv, dq")


KERNELS = {"fwd": "attn_fwd_kernel", "dkdv": "attn_bwd_dkdv_kernel", "dq": "attn_bwd_dq_kernel"}


def check_kernel(name: str, shape, dtype=torch.float32, device="cpu", is_causal: bool = False) -> float:
    """Assert one kernel's outputs equal naive attention's (o, L by attention_lse, dq/dk/dv by autograd, computed in
    fp32 from the same inputs) within TOL[dtype]; the largest error (notebook 06 section 3)."""
    q, k, v, do = inputs(shape, dtype, device)
    up = [t.detach().float().requires_grad_() for t in (q, k, v)]
    o, dq, dk, dv = naive_grads(*up, do.float(), is_causal)
    spec = {"o": o, "lse": A.attention_lse(q.detach(), k.detach(), is_causal), "dq": dq, "dk": dk, "dv": dv}
    worst = 0.0
    for key, got in run_kernel(name, q, k, v, do, is_causal).items():
        want = spec[key].to(got.dtype)
        torch.testing.assert_close(
            got, want, **TOL[dtype], msg=lambda m, key=key: f"{name} {key} ({dtype}, {shape}): {m}"
        )
        worst = max(worst, float((got.float() - want.float()).abs().max()))
    return worst


# ---- inside the model -------------------------------------------------------------------------------------------


def tiny_model_outputs(impls, device="cpu") -> dict:
    """impl -> (logits, {name: grad}) of the TINY model built with that attention, same seed and batch for all."""
    return {
        impl: (logits, grads) for impl, (logits, _, grads) in variant_runs(TINY, "attention", impls, device).items()
    }


def check_model_outputs(outputs: dict, ref: str = "naive") -> None:
    """Assert every impl's logits and gradients equal the `ref` run's within MODEL_TOL."""
    ref_logits, ref_grads = outputs[ref]
    for impl, (logits, grads) in outputs.items():
        torch.testing.assert_close(logits, ref_logits, **MODEL_TOL, msg=lambda m, impl=impl: f"{impl} logits: {m}")
        for name, g in grads.items():
            torch.testing.assert_close(
                g, ref_grads[name], **MODEL_TOL, msg=lambda m, impl=impl, name=name: f"{impl} {name}: {m}"
            )


def compare_models(size: str, impls, device="cpu", batch_size: int = 4, dtype=None, warmup: int = 2, steps: int = 10):
    """One forward+backward step of the model per attention impl, interleaved in one loop (timing.compare); under
    autocast to `dtype` when given (notebook 06 section 6). Baseline: the first impl."""
    x, y = random_batch(size, batch_size, device=device, generator=torch.Generator().manual_seed(0))
    steps_by_impl = {}
    for impl in impls:
        torch.manual_seed(0)
        model = build_model(size, attention=impl, device=device)

        def step(model=model):
            model.zero_grad(set_to_none=True)
            with torch.autocast(torch.device(device).type, dtype, enabled=dtype is not None):
                loss = lm_loss(model(x), y)
            loss.backward()

        steps_by_impl[impl] = step
    return compare(steps_by_impl, steps=steps, warmup=warmup, device=device)


# ---- the leaderboard configuration and `python -m helpers bench attention` -------------------------------------


def compare_impls(
    impls,
    shape,
    dtype=torch.float32,
    device="cpu",
    is_causal: bool = False,
    pass_="fwd+bwd",
    warmup: int = 3,
    steps: int = 10,
    fns: dict | None = None,
):
    """One pass (fwd | bwd | fwd+bwd) of each impl on the same inputs, interleaved in one loop (timing.compare);
    baseline: the first impl (notebook 06: compiled vs eager naive; the leaderboard; a student's, from fns)."""
    q, k, v, do = inputs(shape, dtype, device)
    calls = {i: pass_steps(attention_fn(i, q, is_causal, fns), q, k, v, do)[pass_] for i in impls}
    return compare(calls, steps=steps, warmup=warmup, device=device)


def leaderboard_comparison(
    impls=("flash_triton", "sdpa", "naive"), device="cuda", warmup: int = 5, steps: int = 20, shape=None, dtype=None
):
    """fwd+bwd of each impl at the leaderboard configuration (or `shape`/`dtype`), interleaved; (Comparison, rows
    with median ms and TFLOP/s)."""
    shape = shape or tuple(LEADERBOARD[k] for k in ("batch", "heads", "T", "d"))
    dtype = dtype or LEADERBOARD["dtype"]
    c = compare_impls(impls, shape, dtype, device, True, "fwd+bwd", warmup, steps)
    B, H, T, d = shape
    flops = A.attention_flops(B * H, T, T, d, True) + A.attention_flops(B * H, T, T, d, True, backward=True)
    t = c.table()
    rows = [
        dict(
            impl=i,
            batch=B,
            heads=H,
            T=T,
            d=d,
            dtype=str(dtype).replace("torch.", ""),
            causal=True,
            device=c.device,
            median_ms=t.loc[i, "median_s"] * 1e3,
            TFLOPs=flops / t.loc[i, "median_s"] / 1e12,
            ratio=t.loc[i, "ratio"],
            ratio_low=t.loc[i, "ratio_low"],
            ratio_high=t.loc[i, "ratio_high"],
            **{"pass": "fwd+bwd"},
        )
        for i in impls
    ]
    return c, rows


def bench_main(argv: list[str]) -> int:
    """`python -m helpers bench attention`: fwd+bwd (causal) per impl, interleaved, with TFLOP/s; rows saved."""
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(prog="python -m helpers bench attention", description=bench_main.__doc__)
    p.add_argument("--batch", type=positive_int, default=LEADERBOARD["batch"])
    p.add_argument("--heads", type=positive_int, default=LEADERBOARD["heads"] if cuda else 2)
    p.add_argument("--seq", type=positive_int, nargs="+", default=[LEADERBOARD["T"]] if cuda else [256])
    p.add_argument("--head-dim", type=positive_int, default=LEADERBOARD["d"] if cuda else 32)
    p.add_argument("--dtype", default="bfloat16" if cuda else "float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument(
        "--impls",
        nargs="+",
        choices=["naive", "sdpa", "compiled", "flash_pytorch", "flash_triton"],
        default=["flash_triton", "sdpa", "naive"] if cuda else ["flash_pytorch", "sdpa", "naive"],
    )
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=positive_int, default=20)
    args = p.parse_args(argv)
    device, dtype = ("cuda" if cuda else "cpu"), getattr(torch, args.dtype)
    if not cuda:
        print(
            f"no CUDA: Triton would run in its interpreter ({triton_mode()}; correct, far too slow to time), so "
            "flash_triton is left out unless --impls names it; the leaderboard numbers need a GPU"
        )
    rows = []
    for T in args.seq:
        _, r = leaderboard_comparison(
            args.impls, device, args.warmup, args.steps, (args.batch, args.heads, T, args.head_dim), dtype
        )
        rows += r
    df = pd.DataFrame(rows)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(
        f"causal attention fwd+bwd on {device} ({name}), batch {args.batch} x {args.heads} heads, d {args.head_dim}, "
        f"{args.dtype}; ratio = time / {args.impls[0]}'s (95% CI), interleaved"
    )
    print(
        df[["T", "impl", "median_ms", "TFLOPs", "ratio", "ratio_low", "ratio_high"]].to_string(
            index=False, float_format=lambda v: f"{v:.3g}"
        )
    )
    path = save_results(df, "attention_bench", profile="gpu" if cuda else "cpu")
    print(f"saved {len(df)} rows to {path}")
    return 0


# ---- the published 2025 leaderboard marks beside this machine's times (notebook 06) ----


def plot_leaderboard_marks(rows: pd.DataFrame, marks, comparable: bool, title: str = ""):
    """fwd+bwd median ms per implementation (the leaderboard's rows on a GPU; on a CPU the section 4 rows at this
    profile's shape), with the published marks as labelled lines: compared only at the leaderboard's shape."""
    import matplotlib.pyplot as plt

    from helpers.published import draw_mark

    part = rows[rows["pass"] == "fwd+bwd"] if "pass" in rows else rows
    ms = part.groupby("impl")["median_ms"].median().sort_values()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    ax.bar(range(len(ms)), ms.to_numpy(), color="#4a7")
    for m, style in zip(marks, ("--", ":"), strict=False):  # the best and the naive mark, a style each
        draw_mark(ax, m, comparable, style=style)
    ax.set_xticks(range(len(ms)), ms.index)
    ax.set(
        yscale="log", ylabel="fwd+bwd median (ms)", title=title or "causal attention fwd+bwd and the 2025 leaderboard"
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def leaderboard_mark_table(rows: pd.DataFrame, marks, comparable: bool) -> pd.DataFrame:
    """Beside the plot: median ms per implementation and, at the leaderboard's shape, its "% of" each mark's speed."""
    from helpers.published import share_column

    part = rows[rows["pass"] == "fwd+bwd"] if "pass" in rows else rows
    t = part.groupby("impl")["median_ms"].median().to_frame()
    for m in marks:
        t[f"% of {m.label}"] = share_column(t["median_ms"], m, comparable)
    return t
