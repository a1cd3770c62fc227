"""Notebook 02's experiments: every RMSNorm implementation (and LayerNorm, torch.compile) timed on (rows, H) against
the copy bandwidth, and inside the model; `python -m helpers bench rmsnorm`.

    bench_norm("triton", 50_000, 4096, torch.bfloat16, "cuda", backward=True)   # a row: time, GB/s, fraction of copy
    bench_model("small/8", norm="rmsnorm_triton")                               # the model's fwd and fwd+bwd
    python -m helpers bench rmsnorm --rows 50000 --hidden 1024 4096 --dtype bfloat16
"""
from __future__ import annotations

import argparse

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from helpers.experiments.common import positive_int
from helpers.formulas import norm_bytes
from helpers.model import build_model, lm_loss, random_batch
from helpers.rmsnorm import EPS, RMSNormPyTorchFunction, RMSNormTritonFunction, rmsnorm_reference
from helpers.timing import benchmark

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
    """GB/s of x.clone() (reads and writes every byte), measured once per shape, dtype and device, then reused."""
    key = (tuple(x.shape), x.dtype, str(x.device))
    if key not in _COPY_GBPS:
        t = benchmark(x.clone, warmup=warmup, steps=max(steps, 10), device=x.device)
        _COPY_GBPS[key] = 2 * x.numel() * x.element_size() / t.median / 1e9
    return _COPY_GBPS[key]


def bench_norm(name: str, n_rows: int, H: int, dtype=torch.float32, device="cpu", backward=False,
               warmup: int = 3, steps: int = 10, fn=None) -> dict:
    """Time one norm on (n_rows, H): forward, or forward+backward; GB/s and fraction of clone bandwidth (notebook 02)."""
    gen = torch.Generator(device=device).manual_seed(0)  # drawn on the device: 50,000 x 8192 is slow on a CPU
    x = torch.randn(n_rows, H, generator=gen, device=device).to(dtype).requires_grad_(backward)  # (N, H)
    g = (1 + 0.1 * torch.randn(H, generator=gen, device=device)).to(dtype).requires_grad_(backward)  # (H,)
    dy = torch.randn(n_rows, H, generator=gen, device=device).to(dtype)  # (N, H)
    fn = fn or norm_function(name)
    step = (lambda: torch.autograd.grad(fn(x, g), (x, g), dy)) if backward else (lambda: fn(x, g))
    t = benchmark(step, warmup=warmup, steps=steps, device=device, label=name)
    moved = norm_bytes(n_rows, H, dtype, backward)
    copy_gbps = copy_bandwidth(x.detach(), warmup, steps)
    gbps = moved / t.median / 1e9
    return t.as_row(impl=name, rows=n_rows, H=H, dtype=str(dtype).replace("torch.", ""),
                    bytes=moved, GBps=gbps, copy_GBps=copy_gbps,
                    frac_of_copy=gbps / copy_gbps, **{"pass": "fwd+bwd" if backward else "fwd"})


def bench_model(size: str, norm: str = "rmsnorm", device="cpu", batch_size: int = 4, warmup: int = 3,
                steps: int = 10, compile: bool = False) -> list[dict]:
    """Time a TransformerLM with `norm` (notebook 02): forward and forward+backward rows; compile=True uses torch.compile."""
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


def bench_main(argv: list[str]) -> int:
    """`python -m helpers bench rmsnorm`: time and GB/s vs copy bandwidth per implementation, fwd and fwd+bwd."""
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(prog="python -m helpers bench rmsnorm")
    p.add_argument("--rows", type=positive_int, default=50_000 if cuda else 2048)
    p.add_argument("--hidden", type=positive_int, nargs="+", default=[1024, 2048, 4096, 8192] if cuda else [256, 1024])
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--impls", nargs="+", choices=list(NORM_FUNCTIONS) + ["compiled"], default=list(NORM_FUNCTIONS) + ["compiled"] if cuda
                   else ["layernorm", "torch", "F.rms_norm", "torchfn"])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=positive_int, default=20)
    args = p.parse_args(argv)
    device, dtype = ("cuda" if cuda else "cpu"), getattr(torch, args.dtype)
    if not cuda:
        print("no CUDA: Triton would run in its interpreter (correct, far too slow to time); "
              "it is left out unless --impls names it")
    rows = [bench_norm(name, args.rows, H, dtype, device, backward, args.warmup, args.steps)
            for backward in (False, True) for H in args.hidden for name in args.impls]
    df = pd.DataFrame(rows)
    df["median_ms"] = df["median_s"] * 1e3
    cols = ["pass", "H", "impl", "median_ms", "GBps", "copy_GBps", "frac_of_copy"]
    print(f"RMSNorm on {device} ({torch.cuda.get_device_name() if cuda else 'cpu'}), {args.rows} rows, {args.dtype}")
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0
