"""RMSNorm four ways (notebook 02): PyTorch ops, a hand-derived autograd Function, fused Triton kernels, torch.compile.

    y = RMSNormTritonFunction.apply(x, g)               # x (*, H), g (H,); eps = 1e-5
    norm = RMSNorm(768, impl="triton")                  # "torch" | "torchfn" | "triton"
    model = build_model("small/8", norm="rmsnorm_triton")
    python -m helpers bench rmsnorm --rows 50000 --hidden 1024 4096 --dtype bfloat16

Every Triton kernel has its PyTorch spec right above it. Without CUDA the kernels run in
Triton's interpreter on CPU tensors (`import helpers` sets TRITON_INTERPRET=1): correct, but slow.
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from helpers.model import register_norm
from helpers.timing import benchmark

try:
    import triton
    import triton.language as tl
except ImportError:  # e.g. macOS: the PyTorch paths still work
    triton = tl = None

EPS = 1e-5
MAX_H = 65536  # one row lives in one Triton block; wider rows would need a loop over column blocks
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ---- PyTorch: the reference and the hand-derived gradients --------------------------------------------------

def _up(t: Tensor) -> Tensor:
    """t in at least fp32 (fp16/bf16 -> fp32; fp32 and fp64 stay): where every norm accumulates."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def rmsnorm_reference(x: Tensor, g: Tensor, eps: float = EPS) -> Tensor:
    """RMSNorm from PyTorch ops in (at least) fp32, cast back to x.dtype: the spec every implementation must match."""
    x32 = _up(x)  # (*, H)
    return (x32 * _rrms(x32, eps) * _up(g)).to(x.dtype)  # (*, H)


def _rrms(x32: Tensor, eps: float = EPS) -> Tensor:
    """1 / sqrt(mean(x^2) + eps) per row: (*, H) -> (*, 1)."""
    return torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


def rmsnorm_backward_g(grad_out: Tensor, x: Tensor, g: Tensor, eps: float = EPS) -> Tensor:
    """dL/dg = sum over rows of grad_out * x / rms(x): (*, H) -> (H,)."""
    x32 = _up(x)
    return (_up(grad_out) * x32 * _rrms(x32, eps)).reshape(-1, x.shape[-1]).sum(0).to(g.dtype)  # (H,)


def rmsnorm_backward_x(grad_out: Tensor, x: Tensor, g: Tensor, eps: float = EPS) -> Tensor:
    """dL/dx = r * (dy*g - xhat * mean(dy*g*xhat)), r = 1/rms(x), xhat = x*r: (*, H)."""
    x32 = _up(x)
    r = _rrms(x32, eps)  # (*, 1)
    xhat, dyg = x32 * r, _up(grad_out) * _up(g)  # (*, H) each
    return (r * (dyg - xhat * (dyg * xhat).mean(-1, keepdim=True))).to(x.dtype)  # (*, H)


class RMSNormPyTorchFunction(torch.autograd.Function):
    """RMSNorm whose backward is the hand-derived rmsnorm_backward_g/x rather than autograd's graph."""

    @staticmethod
    def forward(ctx, x: Tensor, g: Tensor) -> Tensor:
        _check(x, g, need_triton=False)
        ctx.save_for_backward(x, g)
        return rmsnorm_reference(x, g)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, g = ctx.saved_tensors
        dx = rmsnorm_backward_x(grad_out, x, g) if ctx.needs_input_grad[0] else None
        dg = rmsnorm_backward_g(grad_out, x, g) if ctx.needs_input_grad[1] else None
        return dx, dg


def _check(x: Tensor, g: Tensor, need_triton: bool = True) -> None:
    """Raise a ValueError that says what to do when (x, g) cannot go through RMSNorm."""
    if g.dim() != 1 or x.dim() == 0 or g.shape[0] != x.shape[-1]:
        raise ValueError(f"g must have shape (H,) with H = x.shape[-1]; got x {tuple(x.shape)}, g {tuple(g.shape)}")
    if x.device != g.device:
        raise ValueError(f"x is on {x.device} and g on {g.device}; move both to the same device")
    if not need_triton:
        return
    if triton is None:
        raise ValueError("Triton is not installed; use impl='torch' or 'torchfn', or install triton (Linux)")
    if x.shape[-1] > MAX_H:
        raise ValueError(f"H = {x.shape[-1]} exceeds the Triton kernel's limit of {MAX_H} columns per row; "
                         "use RMSNormPyTorchFunction (or impl='torchfn') for wider rows")
    if x.dtype not in DTYPES or g.dtype not in DTYPES:
        raise ValueError(f"Triton RMSNorm supports {DTYPES}; got x {x.dtype}, g {g.dtype}: cast first")
    if x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("CPU tensors need Triton's interpreter: move x and g to CUDA, or set TRITON_INTERPRET=1 "
                         "before triton is imported (import helpers first)")


# ---- Triton: fused forward, backward with a two-stage dg reduction -------------------------------------------

if triton is not None:

    # spec: y[row] = x[row] * rrms[row] * g with rrms[row] = 1 / sqrt(mean(x[row]^2) + eps)  (rmsnorm_reference)
    @triton.jit
    def rmsnorm_fwd_kernel(x_ptr, g_ptr, y_ptr, rrms_ptr, H, eps, BLOCK_H: tl.constexpr):
        """One program per row: sum of squares, rsqrt, scale by g, all in fp32; saves rrms for backward."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_H)  # (BLOCK_H,), BLOCK_H = next power of two >= H
        mask = cols < H
        x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_H,)
        g = tl.load(g_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_H,)
        rrms = tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)  # scalar; padded columns add 0
        tl.store(rrms_ptr + row, rrms)
        tl.store(y_ptr + row * H + cols, (x * rrms * g).to(y_ptr.dtype.element_ty), mask=mask)

    # spec: dx = rmsnorm_backward_x(dy, x, g); dg_partial[p] = sum over program p's rows of dy * x * rrms
    @triton.jit
    def rmsnorm_bwd_kernel(dy_ptr, x_ptr, g_ptr, rrms_ptr, dx_ptr, dg_partial_ptr, n_rows, H, rows_per_program,
                           BLOCK_H: tl.constexpr):
        """Program p handles rows [p*rows_per_program, ...): dx per row, and its share of dg in fp32 registers."""
        pid = tl.program_id(0).to(tl.int64)  # int64 row indices: N * H may exceed 2**31
        cols = tl.arange(0, BLOCK_H)
        mask = cols < H
        g = tl.load(g_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_H,)
        dg_acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
        row_start = pid * rows_per_program
        row_end = tl.minimum(row_start + rows_per_program, n_rows)
        for row in range(row_start, row_end):
            offs = row * H + cols
            x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_H,)
            dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_H,)
            rrms = tl.load(rrms_ptr + row)  # scalar, saved by the forward
            xhat = x * rrms
            dyg = dy * g
            c = tl.sum(dyg * xhat, axis=0) / H  # mean(dy * g * xhat)
            tl.store(dx_ptr + offs, (rrms * (dyg - xhat * c)).to(dx_ptr.dtype.element_ty), mask=mask)
            dg_acc += dy * xhat
        tl.store(dg_partial_ptr + pid * H + cols, dg_acc, mask=mask)

    # spec: dg = dg_partial.sum(0)  ((P, H) fp32 -> (H,) in g's dtype)
    @triton.jit
    def sum_rows_kernel(partial_ptr, out_ptr, P, H, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
        """Stage two of the dg reduction: each program sums a BLOCK_C-wide column strip over the P partial rows."""
        cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)  # (BLOCK_C,)
        col_mask = cols < H
        acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
        for p0 in range(0, P, BLOCK_P):
            rows = p0 + tl.arange(0, BLOCK_P)  # (BLOCK_P,)
            m = (rows[:, None] < P) & col_mask[None, :]
            acc += tl.sum(tl.load(partial_ptr + rows[:, None] * H + cols[None, :], mask=m, other=0.0), axis=0)
        tl.store(out_ptr + cols, acc.to(out_ptr.dtype.element_ty), mask=col_mask)


def _num_warps(block_h: int) -> int:
    """Warps per row program: more for wider rows, so each thread holds a few elements."""
    return 32 if block_h >= 32768 else 16 if block_h >= 8192 else 8 if block_h >= 2048 else 4


def _bwd_programs(n_rows: int, device: torch.device) -> int:
    """How many programs share the backward rows (and so how many dg partials): a few per SM on CUDA."""
    if device.type == "cuda":
        return max(1, min(n_rows, 4 * torch.cuda.get_device_properties(device).multi_processor_count))
    return max(1, min(n_rows, 4))  # the interpreter runs programs one after another


def rmsnorm_triton_forward(x2: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Launch the forward kernel on contiguous (N, H) x: returns y (N, H) in x.dtype and rrms (N,) fp32."""
    n_rows, H = x2.shape
    y = torch.empty_like(x2)
    rrms = torch.empty(n_rows, device=x2.device, dtype=torch.float32)
    if n_rows:
        block = triton.next_power_of_2(H)
        rmsnorm_fwd_kernel[(n_rows,)](x2, g, y, rrms, H, EPS, BLOCK_H=block, num_warps=_num_warps(block))
    return y, rrms


def rmsnorm_triton_backward(dy2: Tensor, x2: Tensor, g: Tensor, rrms: Tensor) -> tuple[Tensor, Tensor]:
    """Launch the backward kernels on contiguous (N, H) tensors: returns dx (N, H) and dg (H,)."""
    n_rows, H = x2.shape
    block = triton.next_power_of_2(H)
    programs = _bwd_programs(n_rows, x2.device)
    rows_per_program = -(-n_rows // programs)  # ceil
    dx = torch.empty_like(x2)
    partial = torch.empty(programs, H, device=x2.device, dtype=torch.float32)  # (P, H)
    dg = torch.empty_like(g)
    if n_rows:
        rmsnorm_bwd_kernel[(programs,)](dy2, x2, g, rrms, dx, partial, n_rows, H, rows_per_program,
                                        BLOCK_H=block, num_warps=_num_warps(block))
    else:
        partial.zero_()
    block_c = min(block, 128)
    sum_rows_kernel[(triton.cdiv(H, block_c),)](partial, dg, programs, H, BLOCK_P=32, BLOCK_C=block_c)
    return dx, dg


class RMSNormTritonFunction(torch.autograd.Function):
    """RMSNorm through the fused Triton kernels: forward saves x and 1/rms per row; backward is all Triton."""

    @staticmethod
    def forward(ctx, x: Tensor, g: Tensor) -> Tensor:
        _check(x, g)
        x2 = x.reshape(-1, x.shape[-1]).contiguous()  # (N, H); copies only when x is non-contiguous
        g1 = g.contiguous()
        y, rrms = rmsnorm_triton_forward(x2, g1)
        ctx.save_for_backward(x2, g1, rrms)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x2, g, rrms = ctx.saved_tensors
        dy2 = grad_out.reshape(x2.shape).contiguous()  # (N, H)
        dx, dg = rmsnorm_triton_backward(dy2, x2, g, rrms)
        return dx.view(grad_out.shape), dg


# ---- The layer, the model hook-up, and benchmarks ------------------------------------------------------------

IMPLS = ("torch", "torchfn", "triton")


class RMSNorm(nn.Module):
    """RMSNorm layer with a learnable gain `weight`; impl picks PyTorch ops, the hand-derived Function, or Triton."""

    def __init__(self, d_model: int, impl: str = "triton"):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        self.impl = impl
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        if self.impl == "torch":
            return rmsnorm_reference(x, self.weight)
        fn = RMSNormTritonFunction if self.impl == "triton" else RMSNormPyTorchFunction
        return fn.apply(x, self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, impl={self.impl!r}"


register_norm("rmsnorm_triton", lambda d: RMSNorm(d, impl="triton"))
register_norm("rmsnorm_torchfn", lambda d: RMSNorm(d, impl="torchfn"))

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


def norm_bytes(n_rows: int, H: int, dtype: torch.dtype, backward: bool) -> int:
    """Bytes a norm must move at least: fwd reads x, g, writes y; bwd also reads x, dy, g and writes dx, dg."""
    s = torch.empty(0, dtype=dtype).element_size()
    fwd = (2 * n_rows * H + H) * s
    return fwd + ((3 * n_rows * H + 2 * H) * s if backward else 0)


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
    from helpers.model import build_model, lm_loss, random_batch

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
    p.add_argument("--rows", type=int, default=50_000 if cuda else 2048)
    p.add_argument("--hidden", type=int, nargs="+", default=[1024, 2048, 4096, 8192] if cuda else [256, 1024])
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--impls", nargs="+", default=list(NORM_FUNCTIONS) + ["compiled"] if cuda
                   else ["layernorm", "torch", "F.rms_norm", "torchfn"])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args(argv)
    device, dtype = ("cuda" if cuda else "cpu"), getattr(torch, args.dtype)
    if not cuda:
        print("no CUDA: Triton would run in its interpreter (correct, far too slow to time); "
              "it is left out unless --impls names it")
    import pandas as pd
    rows = [bench_norm(name, args.rows, H, dtype, device, backward, args.warmup, args.steps)
            for backward in (False, True) for H in args.hidden for name in args.impls]
    df = pd.DataFrame(rows)
    df["median_ms"] = df["median_s"] * 1e3
    cols = ["pass", "H", "impl", "median_ms", "GBps", "copy_GBps", "frac_of_copy"]
    print(f"RMSNorm on {device} ({torch.cuda.get_device_name() if cuda else 'cpu'}), {args.rows} rows, {args.dtype}")
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0
