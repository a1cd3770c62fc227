"""RMSNorm four ways (notebook 02): PyTorch ops, a hand-derived autograd Function, fused Triton kernels, torch.compile.

    y = RMSNormTritonFunction.apply(x, g)               # x (*, H), g (H,); eps = 1e-5
    norm = RMSNormLayer(768, impl="triton")             # "torch" | "torchfn" | "triton"
    model = build_model("small/8", norm="rmsnorm_triton")   # helpers.model imports this module when asked

The benchmarks (notebook 02, `python -m helpers bench rmsnorm`) are in helpers.experiments.rmsnorm.

Every Triton kernel has its PyTorch spec right above it. Without CUDA the kernels run in
Triton's interpreter on CPU tensors (`import helpers` sets TRITON_INTERPRET=1): correct, but slow.
"""
from __future__ import annotations

import os

import torch
import torch.nn as nn
from torch import Tensor


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


# ---- The layer ------------------------------------------------------------

IMPLS = ("torch", "torchfn", "triton")


class RMSNormLayer(nn.Module):
    """RMSNorm layer with a learnable gain `weight`; impl picks PyTorch ops, the hand-derived Function, or Triton.
    TransformerLM uses it through ModelConfig(norm="rmsnorm_triton" or "rmsnorm_torchfn")."""

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
