"""Notebook 02's experiments: every RMSNorm implementation (and LayerNorm, torch.compile) timed on (rows, H) against
the copy bandwidth, and inside the model; `python -m helpers bench rmsnorm`.

    bench_norm("triton", 50_000, 4096, torch.bfloat16, "cuda", backward=True)   # a row: time, GB/s, fraction of copy
    bench_model("small/cpu", norm="rmsnorm_triton")                               # the model's fwd and fwd+bwd
    check_against_spec(RMSNormTritonFunction.apply, (2, 3, 37), torch.bfloat16)  # y, dx, dg within TOL[dtype]
    python -m helpers bench rmsnorm --rows 50000 --hidden 1024 4096 --dtype bfloat16
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from helpers import formulas
from helpers.env import triton_mode
from helpers.experiments.common import log_ticks, positive_int, variant_runs
from helpers.formulas import norm_bytes
from helpers.model import ModelConfig, build_model, get_config, lm_loss, make_norm, random_batch
from helpers.rmsnorm import EPS, RMSNormPyTorchFunction, RMSNormTritonFunction, rmsnorm_reference
from helpers.timing import Comparison, benchmark, compare, paired_ratio, pairwise_ratios, verdict

# tolerances of every check against the spec (notebook 02 and tests/test_rmsnorm.py)
TOL = {
    torch.float32: dict(rtol=1e-4, atol=1e-5),  # fp32: a few ulps of the O(1) outputs
    torch.float16: dict(rtol=1e-3, atol=1e-3),  # about 1 fp16 ulp on O(1) values
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
}  # about 2 bf16 ulps (8 mantissa bits)
DERIVED_TOL = dict(rtol=1e-10, atol=1e-12)  # hand-derived gradients vs autograd, float64: rounding error
GRADCHECK = dict(eps=1e-6, atol=1e-6)  # torch.autograd.gradcheck of RMSNormPyTorchFunction, float64
RRMS_TOL = dict(rtol=1e-5, atol=1e-6)  # the saved 1/rms (fp32)
LOSS_TOL = dict(rtol=1e-5, atol=0.0)  # the tiny model's loss with another norm implementation
TINY = ModelConfig("tiny", 32, 64, 2, 4, vocab_size=50, context_length=16)  # the model the norms are swapped into
PROFILES = {  # what notebook 02 measures per profile
    "gpu": dict(
        rows=50_000,
        hidden=[1024, 2048, 4096, 8192],
        dtypes=[torch.float32, torch.bfloat16],
        warmup=10,
        steps=50,
        batch=4,
        compile_hidden=[1024, 2048, 4096, 8192],
        # three sizes span the range: compiling all five would cost minutes of a GPU lease for little more
        triton_shape=None,
        compile_model_sizes=["small", "large", "2.7B"],
    ),
    "cpu": dict(
        rows=4096,
        hidden=[256, 512, 1024, 2048],
        dtypes=[torch.float32],
        warmup=2,
        steps=6,
        batch=4,
        compile_hidden=[1024],  # steps >= timing.MIN_PAIRS
        triton_shape=(64, 256),
        compile_model_sizes=["small/cpu"],
    ),
}


def spec_inputs(shape, dtype=torch.float32, device="cpu", seed=0):
    """x (shape), g (H,), dy (shape), drawn in fp32 on the CPU and cast; x and g require grad."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen).to(device, dtype).requires_grad_()
    g = (1 + 0.5 * torch.randn(shape[-1], generator=gen)).to(device, dtype).requires_grad_()
    dy = torch.randn(*shape, generator=gen).to(device, dtype)
    return x, g, dy


def fwd_bwd(fn, x, g, dy) -> tuple[Tensor, Tensor, Tensor]:
    """y, dx, dg of fn(x, g) with upstream gradient dy."""
    y = fn(x, g)
    return (y, *torch.autograd.grad(y, (x, g), dy))


def check_against_spec(fn, shape, dtype=torch.float32, device="cpu", seed=0) -> float:
    """Assert fn's y, dx, dg equal rmsnorm_reference's within TOL[dtype] (same dtype and shape); the largest error."""
    x, g, dy = spec_inputs(shape, dtype, device, seed)
    worst = 0.0
    for name, a, b in zip(("y", "dx", "dg"), fwd_bwd(fn, x, g, dy), fwd_bwd(rmsnorm_reference, x, g, dy), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        torch.testing.assert_close(a, b, **TOL[dtype], msg=lambda m, name=name: f"{name} ({dtype}, {shape}): {m}")
        worst = max(worst, float((a.detach().float() - b.detach().float()).abs().max()) if a.numel() else 0.0)
    return worst


def tiny_model_runs(norms, device="cpu", batch_size: int = 2) -> dict:
    """norm -> (loss, {name: grad}) of the TINY model with that norm, same seed and batch for all."""
    return {
        norm: (loss, grads) for norm, (_, loss, grads) in variant_runs(TINY, "norm", norms, device, batch_size).items()
    }


def check_model_norms(runs: dict, ref: str = "rmsnorm") -> None:
    """Assert every run's loss within LOSS_TOL and every gradient within TOL[float32] of the `ref` norm's run."""
    ref_loss, ref_grads = runs[ref]
    for norm, (loss, grads) in runs.items():
        torch.testing.assert_close(loss, ref_loss, **LOSS_TOL, msg=lambda m, norm=norm: f"{norm} loss: {m}")
        for name, grad in grads.items():
            torch.testing.assert_close(
                grad, ref_grads[name], **TOL[torch.float32], msg=lambda m, norm=norm, name=name: f"{norm} {name}: {m}"
            )


NORM_FUNCTIONS = {  # name -> f(x, g); what notebook 02 and `bench rmsnorm` compare
    "layernorm": lambda x, g: F.layer_norm(x, (x.shape[-1],), g, None, EPS),
    "torch": rmsnorm_reference,
    "F.rms_norm": lambda x, g: F.rms_norm(x, (x.shape[-1],), g, EPS),
    "torchfn": RMSNormPyTorchFunction.apply,
    "triton": RMSNormTritonFunction.apply,
}


def norm_function(name: str):
    """f(x, g) for a NORM_FUNCTIONS name, or "compiled" for torch.compile of the PyTorch reference."""
    if name == "compiled":
        torch._dynamo.reset()  # a fresh cache per benchmark: many shapes would exceed dynamo's recompile limit
        return torch.compile(rmsnorm_reference, dynamic=False)
    return NORM_FUNCTIONS[name]


_COPY_GBPS: dict[tuple, float] = {}


def copy_bandwidth(x: Tensor, warmup: int = 3, steps: int = 10) -> float:
    """GB/s of the fastest copy of x into a buffer allocated once (reads and writes every byte): the streaming bound
    every norm is held to. Measured again at each call, right beside the norm it judges, and the fastest rate ever
    seen for the shape, dtype and device is returned: a copy timed in a busy moment must not become a yardstick a
    norm timed in a quiet one beats by 19x (seen under load when the first measurement was cached). (x.clone() would
    also pay for fresh pages: on a CPU the allocator hands large blocks back to the OS, so each clone page-faults.)"""
    key = (tuple(x.shape), x.dtype, str(x.device))
    out = torch.empty_like(x)
    t = benchmark(lambda: out.copy_(x), warmup=warmup, steps=max(steps, 10), device=x.device)
    _COPY_GBPS[key] = max(_COPY_GBPS.get(key, 0.0), 2 * x.numel() * x.element_size() / t.min / 1e9)
    return _COPY_GBPS[key]


MAX_FRACTION_OF_COPY = 1.05  # a norm moves at least norm_bytes: it cannot beat the copy by more than noise


def check_fraction_of_copy(rows) -> None:
    """Assert the physical bound: no implementation moves its minimum bytes faster than the copy does."""
    for r in rows.to_dict("records") if hasattr(rows, "to_dict") else rows:
        if r["frac_of_copy"] > MAX_FRACTION_OF_COPY:
            raise AssertionError(
                f"{r['impl']} {r['pass']} H={r['H']}: {r['frac_of_copy']:.2f} of the copy bandwidth "
                f"(> {MAX_FRACTION_OF_COPY}): the yardstick or the byte count is wrong"
            )


def bench_norm(
    name: str,
    n_rows: int,
    H: int,
    dtype=torch.float32,
    device="cpu",
    backward=False,
    warmup: int = 3,
    steps: int = 10,
    fn=None,
) -> dict:
    """Time one norm on (n_rows, H): forward, or forward+backward; GB/s and fraction of clone bandwidth
    (notebook 02)."""
    gen = torch.Generator(device=device).manual_seed(0)  # drawn on the device: 50,000 x 8192 is slow on a CPU
    x = torch.randn(n_rows, H, generator=gen, device=device).to(dtype).requires_grad_(backward)  # (N, H)
    g = (1 + 0.1 * torch.randn(H, generator=gen, device=device)).to(dtype).requires_grad_(backward)  # (H,)
    dy = torch.randn(n_rows, H, generator=gen, device=device).to(dtype)  # (N, H)
    fn = fn or norm_function(name)
    step = (lambda: torch.autograd.grad(fn(x, g), (x, g), dy)) if backward else (lambda: fn(x, g))
    copy_bandwidth(x.detach(), warmup, steps)  # the yardstick before and after the norm: the faster counts
    t = benchmark(step, warmup=warmup, steps=steps, device=device, label=name)
    moved = norm_bytes(n_rows, H, dtype, backward)
    copy_gbps = copy_bandwidth(x.detach(), warmup, steps)
    gbps = moved / t.median / 1e9
    return t.as_row(
        impl=name,
        rows=n_rows,
        H=H,
        dtype=str(dtype).replace("torch.", ""),
        bytes=moved,
        GBps=gbps,
        copy_GBps=copy_gbps,
        frac_of_copy=gbps / copy_gbps,
        **{"pass": "fwd+bwd" if backward else "fwd"},
    )


def bench_model(
    size: str,
    norm: str = "rmsnorm",
    device="cpu",
    batch_size: int = 4,
    warmup: int = 3,
    steps: int = 10,
    compile: bool = False,
) -> list[dict]:
    """Time a TransformerLM with `norm` (notebook 02): forward and forward+backward rows; compile=True uses
    torch.compile."""
    torch.manual_seed(0)
    model = build_model(size, norm=norm, device=device)
    if compile:
        torch._dynamo.reset()  # every size shares TransformerLM.forward's code: keep under the recompile limit
    run = torch.compile(model) if compile else model
    x, y = random_batch(model.cfg, batch_size, device=device, generator=torch.Generator().manual_seed(0))

    def both():
        model.zero_grad(set_to_none=True)
        lm_loss(run(x), y).backward()

    rows = []
    for name, step in (("fwd", lambda: run(x)), ("fwd+bwd", both)):
        t = benchmark(step, warmup=warmup, steps=steps, device=device, label=f"{size} {norm} {name}")
        rows.append(t.as_row(size=size, norm=norm, compiled=compile, **{"pass": name}))
    return rows


def triton_timing_note(triton_shape) -> str:
    """Why (and how) Triton is timed on this machine (notebook 02)."""
    if triton_mode() == "interpreter":
        return (
            f"Triton runs in its interpreter here, so it is timed only on a tiny {triton_shape} tensor, to show it "
            "runs: the interpreter executes each program in Python and its time says nothing about the kernels."
        )
    return "Triton kernels are compiled for this GPU and timed on every shape."


def bench_kernels(*, rows, hidden, dtypes, device, warmup, steps, compile_hidden, triton_shape=None) -> list[dict]:
    """bench_norm rows for torchfn (every shape), compiled (H in compile_hidden: it compiles for tens of seconds on a
    CPU) and triton (every shape, or only triton_shape with 1+3 steps when it runs in the interpreter)."""
    out = []
    for dtype in dtypes:
        for backward in (False, True):
            for H in hidden:
                names = (
                    ["torchfn"]
                    + (["compiled"] if H in compile_hidden else [])
                    + (["triton"] if triton_shape is None else [])
                )
                out += [bench_norm(name, rows, H, dtype, device, backward, warmup, steps) for name in names]
            if triton_shape is not None:
                out.append(bench_norm("triton", *triton_shape, dtype, device, backward, warmup=1, steps=3))
    return out


# ---- comparisons in one interleaved loop (notebook 02) ----

PASSES = {False: "fwd", True: "fwd+bwd"}
COPY = "copy|into a preallocated buffer"  # timed with the norms, then set apart as their yardstick


def compare_shape(
    names,
    n_rows: int,
    H: int,
    dtype=torch.float32,
    device="cpu",
    warmup: int = 3,
    steps: int = 10,
    fns: dict | None = None,
) -> tuple[list[dict], object]:
    """Every norm of `names`, forward and forward+backward, timed in ONE interleaved loop on (n_rows, H): rows as
    bench_norm's (plus p25_s) and the Comparison, labels "impl|pass" (baseline: the first name's forward). A name of
    `fns` ({label: f(x, g)}, e.g. a student's apply) is timed as that function."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n_rows, H, generator=gen, device=device).to(dtype).requires_grad_()  # (N, H)
    g = (1 + 0.1 * torch.randn(H, generator=gen, device=device)).to(dtype).requires_grad_()  # (H,)
    dy = torch.randn(n_rows, H, generator=gen, device=device).to(dtype)  # (N, H)
    fns, calls = {name: (fns or {}).get(name) or norm_function(name) for name in names}, {}
    for name, fn in fns.items():
        calls[f"{name}|fwd"] = lambda fn=fn: fn(x.detach(), g.detach())
        calls[f"{name}|fwd+bwd"] = lambda fn=fn: torch.autograd.grad(fn(x, g), (x, g), dy)
    out = torch.empty_like(x.detach())  # the yardstick, in the same loop: load slows it as much as the norms
    calls[COPY] = lambda: out.copy_(x.detach())
    timed = compare(calls, steps=steps, warmup=warmup, device=device)
    copy_s = timed.samples.pop(COPY)
    comp = Comparison(timed.samples, timed.baseline, timed.device)
    copy_gbps, rows = 2 * x.numel() * x.element_size() / min(copy_s) / 1e9, []  # fastest copy vs each norm's median
    for label, samples in comp.samples.items():
        name, pass_ = label.split("|")
        moved = norm_bytes(n_rows, H, dtype, pass_ == "fwd+bwd")
        q25, med = (float(v) for v in np.percentile(samples, [25, 50]))
        rows.append(
            {
                "label": label,
                "device": str(device),
                "warmup": warmup,
                "steps": len(samples),
                "median_s": med,
                "p25_s": q25,
                "impl": name,
                "rows": n_rows,
                "H": H,
                "dtype": str(dtype).replace("torch.", ""),
                "bytes": moved,
                "GBps": moved / med / 1e9,
                "copy_GBps": copy_gbps,
                "frac_of_copy": moved / med / 1e9 / copy_gbps,
                "pass": pass_,
            }
        )
    return rows, comp


def compare_shapes(names_for, *, rows, hidden, dtypes, device, warmup, steps, fns: dict | None = None):
    """compare_shape for every dtype and H (names_for(H): the implementations timed at that width; fns as
    compare_shape takes them): (rows, {(dtype, H): Comparison})."""
    out, comps = [], {}
    for dtype in dtypes:
        for H in hidden:
            r, comps[(str(dtype).replace("torch.", ""), H)] = compare_shape(
                names_for(H), rows, H, dtype, device, warmup, steps, fns
            )
            out += r
    return out, comps


def check_forward_le_both(comps) -> None:
    """Assert forward <= forward+backward for every implementation and shape, on the paired ratios of one
    interleaved loop (forward and forward+backward alternate, so load hits both alike): it fails when forward is
    measurably slower (the ratio's 95% interval above 1), not when a median inside the noise lands above 1."""
    for key, comp in comps.items():
        for impl in {label.split("|")[0] for label in comp.samples}:
            r = paired_ratio(comp.samples[f"{impl}|fwd"], comp.samples[f"{impl}|fwd+bwd"])
            assert r.low <= 1.0, f"{key} {impl}: forward takes {r} of forward+backward, measurably more"


def ratio_lines(comps, names, baseline: str = "layernorm", dtype: str = "float32") -> str:
    """Per pass and H: each of `names` against `baseline`, paired per round, named only outside the noise."""
    lines = []
    for (dt, H), comp in comps.items():
        for pass_ in PASSES.values():
            if dt == dtype:
                lines += [
                    f"{pass_:>7}, H={H}: "
                    + "; ".join(verdict(n, baseline, comp.ratio(f"{n}|{pass_}", f"{baseline}|{pass_}")) for n in names)
                ]
    return "\n".join(lines)


def ratio_rows(comps: dict, keys: tuple[str, ...], **extra) -> list[dict]:
    """Every pair of implementations per Comparison ("impl|pass" labels) and pass, paired per round: the rows the
    answers page reads (keys name the parts of each comps key, e.g. ("dtype", "H") or ("size",))."""
    rows = []
    for key, comp in comps.items():
        ids = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        for pass_ in PASSES.values():
            samples = {label.split("|")[0]: s for label, s in comp.samples.items() if label.endswith(f"|{pass_}")}
            rows += pairwise_ratios(samples, **extra, **ids, **{"pass": pass_})
    return rows


def fastest_lines(rows, comps) -> str:
    """Per (dtype, pass, H): the implementation with the lowest median, named fastest only when measurably faster
    than the runner-up in the same interleaved loop; else the two are within the noise."""
    df, lines = pd.DataFrame(rows), []
    for (dt, pass_, H), part in df.groupby(["dtype", "pass", "H"], sort=False):
        first, second = part.sort_values("median_s").iloc[:2].itertuples()
        r = comps[(dt, H)].ratio(f"{first.impl}|{pass_}", f"{second.impl}|{pass_}")
        head = (
            f"fastest is {first.impl} ({r.median:.2f}x {second.impl}'s time, {r})"
            if r.differs
            else f"no measurable fastest: {verdict(first.impl, second.impl, r)}"
        )
        lines.append(
            f"{dt:>8} {pass_:>7} H={H:<5}: {head}; {first.impl} at {first.median_s * 1e3:.3f} ms, "
            f"{first.GBps:.0f} GB/s = {first.frac_of_copy:.0%} of copy"
        )
    return "\n".join(lines)


def plan_model_norms(budget, sizes, norms, batch_size: int, warmup: int, steps: int, run=None):
    """Section 2's model sizes within the budget (the smallest always): per size `warmup + steps` rounds of every
    norm's forward (a third of a step) and forward+backward, at the model's own context length."""

    def cost(size):
        cfg = get_config(size)
        t = budget.calibration.step_s(formulas.train_flops(cfg, batch_size, cfg.context_length))
        return (warmup + steps) * len(norms) * (t / 3 + t)

    return budget.fit(sizes, cost, what="the whole model's norms at", keep_first=True, run=run)


def compare_model_norms(size: str, norms, device="cpu", batch_size: int = 4, warmup: int = 3, steps: int = 10):
    """One model of `size` whose norm layers are swapped before each call, so every norm's forward and
    forward+backward run in ONE interleaved loop on the same weights and batch (one model in memory, not one per norm):
    rows (size, norm, pass, median_s, p25_s) and the Comparison (labels "norm|pass")."""
    torch.manual_seed(0)
    model = build_model(size, device=device)
    x, y = random_batch(model.cfg, batch_size, device=device, generator=torch.Generator().manual_seed(0))
    slots = [(b, "norm1") for b in model.blocks] + [(b, "norm2") for b in model.blocks] + [(model, "norm_f")]
    layers = {n: [make_norm(n, model.cfg.d_model).to(device) for _ in slots] for n in norms}

    def use(norm):
        for (owner, attr), layer in zip(slots, layers[norm], strict=True):
            setattr(owner, attr, layer)

    def both():
        model.zero_grad(set_to_none=True)
        lm_loss(model(x), y).backward()

    calls = {}
    for n in norms:
        calls[f"{n}|fwd"] = lambda n=n: (use(n), model(x))
        calls[f"{n}|fwd+bwd"] = lambda n=n: (use(n), both())
    comp = compare(calls, steps=steps, warmup=warmup, device=device)
    rows = [
        {
            "size": size,
            "norm": label.split("|")[0],
            "pass": label.split("|")[1],
            "compiled": False,
            "median_s": float(np.median(s)),
            "p25_s": float(np.percentile(s, 25)),
            "steps": len(s),
        }
        for label, s in comp.samples.items()
    ]
    return rows, comp


def model_lines(comps, norms) -> str:
    """Per size and pass: RMSNorm (PyTorch ops) vs LayerNorm, and the fastest norm only outside the noise."""
    lines = []
    for size, comp in comps.items():
        for pass_ in PASSES.values():
            med = {n: float(np.median(comp.samples[f"{n}|{pass_}"])) for n in norms}
            first, second = sorted(med, key=med.get)[:2]
            r = comp.ratio(f"{first}|{pass_}", f"{second}|{pass_}")
            best = f"fastest {first} ({r})" if r.differs else "no measurable fastest"
            lines.append(
                f"{size:>9} {pass_:>7}: {best}; "
                + verdict("RMSNorm (PyTorch ops)", "LayerNorm", comp.ratio(f"rmsnorm|{pass_}", f"layernorm|{pass_}"))
            )
    return "\n".join(lines)


def compare_compiled(size: str, device="cpu", batch_size: int = 4, warmup: int = 3, steps: int = 10):
    """The rmsnorm model eager and under torch.compile (sharing its weights), forward and forward+backward, in ONE
    interleaved loop: rows as compare_model_norms' (norm "rmsnorm", compiled True/False) and the Comparison."""
    torch.manual_seed(0)
    model = build_model(size, device=device)
    torch._dynamo.reset()  # every size shares TransformerLM.forward's code: keep under the recompile limit
    runs = {False: model, True: torch.compile(model)}
    x, y = random_batch(model.cfg, batch_size, device=device, generator=torch.Generator().manual_seed(0))

    def both(run):
        model.zero_grad(set_to_none=True)
        lm_loss(run(x), y).backward()

    calls = {
        f"{c}|{p}": (lambda run=run: run(x)) if p == "fwd" else (lambda run=run: both(run))
        for c, run in runs.items()
        for p in PASSES.values()
    }
    comp = compare(calls, steps=steps, warmup=warmup, device=device)
    rows = [
        {
            "size": size,
            "norm": "rmsnorm",
            "compiled": label.startswith("True"),
            "pass": label.split("|")[1],
            "median_s": float(np.median(s)),
            "p25_s": float(np.percentile(s, 25)),
            "steps": len(s),
        }
        for label, s in comp.samples.items()
    ]
    return rows, comp


def compiled_lines(comps) -> str:
    """Per size and pass: compiled vs eager, paired per round, named only outside the noise."""
    return "\n".join(
        f"{size:>9} {p:>7}: " + verdict("compiled", "eager", comp.ratio(f"True|{p}", f"False|{p}"))
        for size, comp in comps.items()
        for p in PASSES.values()
    )


def bench_main(argv: list[str]) -> int:
    """`python -m helpers bench rmsnorm`: time and GB/s vs copy bandwidth per implementation, fwd and fwd+bwd."""
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(prog="python -m helpers bench rmsnorm")
    p.add_argument("--rows", type=positive_int, default=50_000 if cuda else 2048)
    p.add_argument("--hidden", type=positive_int, nargs="+", default=[1024, 2048, 4096, 8192] if cuda else [256, 1024])
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument(
        "--impls",
        nargs="+",
        choices=list(NORM_FUNCTIONS) + ["compiled"],
        default=list(NORM_FUNCTIONS) + ["compiled"] if cuda else ["layernorm", "torch", "F.rms_norm", "torchfn"],
    )
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=positive_int, default=20)
    args = p.parse_args(argv)
    device, dtype = ("cuda" if cuda else "cpu"), getattr(torch, args.dtype)
    if not cuda:
        print(
            "no CUDA: Triton would run in its interpreter (correct, far too slow to time); "
            "it is left out unless --impls names it"
        )
    rows = [
        bench_norm(name, args.rows, H, dtype, device, backward, args.warmup, args.steps)
        for backward in (False, True)
        for H in args.hidden
        for name in args.impls
    ]
    df = pd.DataFrame(rows)
    df["median_ms"] = df["median_s"] * 1e3
    cols = ["pass", "H", "impl", "median_ms", "GBps", "copy_GBps", "frac_of_copy"]
    print(f"RMSNorm on {device} ({torch.cuda.get_device_name() if cuda else 'cpu'}), {args.rows} rows, {args.dtype}")
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


# ---- the published mark: what the best memory-bound kernels reach on an H100 (notebook 02) ----


def plot_bandwidth_mark(big: pd.DataFrame, mark, comparable: bool, title: str = ""):
    """Achieved GB/s per implementation vs H (float32, forward and forward+backward), with the published mark drawn
    as a labelled line (helpers.published): compared only on the device it was measured on."""
    import matplotlib.pyplot as plt

    from helpers.published import draw_mark

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    f32 = big[big["dtype"] == "float32"]
    for ax, pass_ in zip(axes, ("fwd", "fwd+bwd"), strict=True):
        for impl, part in f32[f32["pass"] == pass_].groupby("impl"):
            part = part.sort_values("H")
            ax.plot(part["H"], part["GBps"], marker="o", label=impl)
        draw_mark(ax, mark, comparable)
        ax.set(xscale="log", yscale="log", xlabel="H (columns)", ylabel="achieved GB/s", title=f"{pass_}, float32")
        log_ticks(ax, sorted(f32["H"].unique()))
    axes[0].legend(fontsize=7)
    fig.suptitle(title or "RMSNorm bandwidth against the published mark", fontsize=10)
    fig.tight_layout()
    return fig


def bandwidth_mark_table(big: pd.DataFrame, mark, comparable: bool) -> pd.DataFrame:
    """Beside the plot: the best GB/s per implementation and pass, and its "% of mark" where comparable."""
    from helpers.published import share_column

    best = big.groupby(["dtype", "pass", "impl"])["GBps"].max().reset_index()
    best[f"% of mark ({mark.label})"] = share_column(best["GBps"], mark, comparable)
    return best.set_index(["dtype", "pass", "impl"])
