"""Notebook 02's single-norm timings: every implementation by name, the copy bandwidth each is held to (measured
beside it), the physical bound on the fraction of copy, and one norm timed alone on (rows, H).

    bench_norm("triton", 50_000, 4096, torch.bfloat16, "cuda", backward=True)   # a row: time, GB/s, fraction of copy
    check_fraction_of_copy(rows)                                                # no norm beats the copy
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from helpers.env import triton_mode
from helpers.formulas import norm_bytes
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
