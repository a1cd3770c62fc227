"""RMSNorm four ways (notebook 02): PyTorch ops, a hand-derived autograd Function, fused Triton kernels, torch.compile.

    y = RMSNormTritonFunction.apply(x, g)               # x (*, H), g (H,); eps = 1e-5
    norm = RMSNormLayer(768, impl="triton")             # "torch" | "torchfn" | "triton"
    model = build_model("small/cpu", norm="rmsnorm_triton")   # helpers.model imports this module when asked

The benchmarks (notebook 02, `python -m helpers bench rmsnorm`) are in helpers.experiments.rmsnorm.

Every Triton kernel has its PyTorch spec right above it. Without CUDA the kernels run in
Triton's interpreter on CPU tensors (`import helpers` sets TRITON_INTERPRET=1): correct, but slow.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor

from helpers.env import import_triton
from helpers.rmsnorm_tuned import BACKWARD

triton, tl = import_triton()  # (None, None) e.g. on macOS: the PyTorch paths still work

EPS = 1e-5
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
    if x.dtype not in DTYPES or g.dtype not in DTYPES:
        raise ValueError(f"Triton RMSNorm supports {DTYPES}; got x {x.dtype}, g {g.dtype}: cast first")
    if x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "CPU tensors need Triton's interpreter: move x and g to CUDA, or set TRITON_INTERPRET=1 "
            "before triton is imported (import helpers first)"
        )


# ---- Triton: fused forward, backward with a two-stage dg reduction -------------------------------------------
# A row of H columns is cut into CHUNKS blocks of BLOCK_H columns (powers of two). Narrow rows (one block) stay in
# registers and are read once; wider rows loop over their blocks, so no width makes a kernel spill registers
# (`python -m helpers kernels` compiles every configuration for sm_80 and sm_90a and counts spills).

if triton is not None:
    # spec: y[row] = x[row] * rrms[row] * g with rrms[row] = 1 / sqrt(mean(x[row]^2) + eps)  (rmsnorm_reference)
    @triton.jit
    def rmsnorm_fwd_kernel(x_ptr, g_ptr, y_ptr, rrms_ptr, H, eps, BLOCK_H: tl.constexpr, CHUNKS: tl.constexpr):
        """One program per row: sum of squares, rsqrt, scale by g, all in fp32; saves rrms for backward."""
        row = tl.program_id(0).to(tl.int64)  # int64 offsets: N * H may exceed 2**31
        x_row, y_row = x_ptr + row * H, y_ptr + row * H
        if CHUNKS == 1:  # the whole row in registers: x is read once
            cols = tl.arange(0, BLOCK_H)  # (BLOCK_H,), BLOCK_H = next power of two >= H
            mask = cols < H
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_H,)
            g = tl.load(g_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_H,)
            rrms = tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)  # scalar; padded columns add 0
            tl.store(rrms_ptr + row, rrms)
            tl.store(y_row + cols, (x * rrms * g).to(y_ptr.dtype.element_ty), mask=mask)
        else:  # a wide row: one pass for the sum of squares, a second to scale (the re-read mostly hits L2)
            acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
            for c in range(CHUNKS):
                cols = c * BLOCK_H + tl.arange(0, BLOCK_H)
                x = tl.load(x_row + cols, mask=cols < H, other=0.0).to(tl.float32)  # (BLOCK_H,)
                acc += x * x
            rrms = tl.rsqrt(tl.sum(acc, axis=0) / H + eps)
            tl.store(rrms_ptr + row, rrms)
            for c in range(CHUNKS):
                cols = c * BLOCK_H + tl.arange(0, BLOCK_H)
                mask = cols < H
                x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
                g = tl.load(g_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                tl.store(y_row + cols, (x * rrms * g).to(y_ptr.dtype.element_ty), mask=mask)

    # spec: dot[row] = mean(dy[row] * g * xhat[row]), xhat = x * rrms  (the per-row term of rmsnorm_backward_x)
    @triton.jit
    def rmsnorm_bwd_dot_kernel(dy_ptr, x_ptr, g_ptr, rrms_ptr, dot_ptr, H, BLOCK_H: tl.constexpr, CHUNKS: tl.constexpr):
        """Wide rows only: one program per row sums dy * g * xhat over the row's blocks (fp32)."""
        row = tl.program_id(0).to(tl.int64)
        acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for c in range(CHUNKS):
            cols = c * BLOCK_H + tl.arange(0, BLOCK_H)
            mask = cols < H
            x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_H,)
            dy = tl.load(dy_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            acc += dy * g * x
        tl.store(dot_ptr + row, tl.sum(acc, axis=0) * tl.load(rrms_ptr + row) / H)

    # spec: dx = rmsnorm_backward_x(dy, x, g); dg_partial[p] = sum over program p's rows of dy * x * rrms
    @triton.jit
    def rmsnorm_bwd_kernel(
        dy_ptr,
        x_ptr,
        g_ptr,
        rrms_ptr,
        dot_ptr,
        dx_ptr,
        dg_partial_ptr,
        n_rows,
        H,
        rows_per_program,
        BLOCK_H: tl.constexpr,
        CHUNKS: tl.constexpr,
        ROWS: tl.constexpr = 1,
    ):
        """Program (p, c) handles rows [p*rows_per_program, ...) in column block c, ROWS rows at a time (more bytes
        in flight per program for narrow rows): dx, and its share of dg in fp32 registers. One block per row: the
        row's dot product is computed here; wider rows read it from dot_ptr."""
        pid = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # (BLOCK_H,)
        mask = cols < H
        g = tl.load(g_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_H,)
        dg_acc = tl.zeros((ROWS, BLOCK_H), dtype=tl.float32)
        row_start = pid * rows_per_program
        row_end = tl.minimum(row_start + rows_per_program, n_rows)
        for r0 in range(row_start, row_end, ROWS):
            rows = r0 + tl.arange(0, ROWS)  # (ROWS,)
            in_rows = rows < row_end
            offs = rows[:, None] * H + cols[None, :]  # (ROWS, BLOCK_H)
            m = in_rows[:, None] & mask[None, :]
            x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)  # (ROWS, BLOCK_H)
            dy = tl.load(dy_ptr + offs, mask=m, other=0.0).to(tl.float32)  # (ROWS, BLOCK_H)
            rrms = tl.load(rrms_ptr + rows, mask=in_rows, other=0.0)  # (ROWS,), saved by the forward
            xhat = x * rrms[:, None]
            dyg = dy * g[None, :]
            if CHUNKS == 1:  # noqa: SIM108  (Triton: a constexpr if-statement compiles only the taken branch)
                dot = tl.sum(dyg * xhat, axis=1) / H  # (ROWS,) mean(dy * g * xhat)
            else:
                dot = tl.load(dot_ptr + rows, mask=in_rows, other=0.0)
            tl.store(dx_ptr + offs, (rrms[:, None] * (dyg - xhat * dot[:, None])).to(dx_ptr.dtype.element_ty), mask=m)
            dg_acc += dy * xhat  # padded rows load 0: they add 0
        tl.store(dg_partial_ptr + pid * H + cols, tl.sum(dg_acc, axis=0), mask=mask)

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


@dataclass(frozen=True)
class LaunchConfig:
    """How a kernel covers a row of H columns: CHUNKS blocks of BLOCK_H, with num_warps warps per program; the
    backward also takes `rows` rows per step and `programs_per_sm` programs (so dg partial rows) per SM."""

    block_h: int
    chunks: int
    num_warps: int
    rows: int = 1
    programs_per_sm: int = 4


MAX_BLOCK = {"forward": 16384, "backward": 4096}  # widest row held whole in registers without spills (sm_80, sm_90a)
CHUNK_BLOCK = {"forward": 8192, "backward": 4096}  # block of a wider row's loop (the forward loop keeps two of them)
SUM_ROWS = dict(BLOCK_P=32, BLOCK_C=128, num_warps=4)  # stage two of the dg reduction


def launch_config(H: int, kind: str, max_block: int | None = None) -> LaunchConfig:
    """The one place that picks block width, block count and warps for a row of H columns ("forward"/"backward").
    `max_block` forces narrower blocks (tests use it to run the wide-row loops on small shapes). A backward row
    of up to 4096 columns is one block; a wider one loops over blocks with the dot product's extra pass over x and
    dy (5 row reads and writes instead of 3, what held H = 8192 at 0.7 of copy bandwidth), because 8192 columns in
    one block spill 264-360 B per thread at 16 warps on sm_80 and sm_90a (`python -m helpers kernels`)."""
    block = triton.next_power_of_2(max(H, 1))
    if block > (max_block or MAX_BLOCK[kind]):
        block = max_block or CHUNK_BLOCK[kind]
    warps = 16 if block >= 8192 else 8 if block >= 2048 else 4  # a few elements per thread
    return LaunchConfig(block, triton.cdiv(max(H, 1), block), warps)


def backward_grid(H: int) -> list[LaunchConfig]:
    """The backward layouts `python -m helpers tune rmsnorm` times for a width: one block per row, with warps and
    rows per step such that each thread holds 8 or 16 elements of each row tile (fewer starve the loads; 32 leave
    the kernel at 255 registers, one program per SM), 8 at 16 and 32 warps (512 threads cap a thread at 128
    registers, 1024 at 64: 16 elements spilled 200-472 B at 16 warps on sm_80 and sm_90a, 8 fit in 63-64 registers at
    32 warps with none, `python -m helpers kernels --grid`). 32 warps only from 4096 columns (narrower rows already
    lost at 16 warps on the H200: data/reference/nvidia-h200/rmsnorm_tune.jsonl). Rows wider than one default block
    (MAX_BLOCK) also keep launch_config's loop over blocks, whose dot-product pre-pass reads x and dy twice (5 row
    passes instead of 3); the one-block layout is the one that reads them once (8192 columns at 32 warps)."""
    base = launch_config(H, "backward")
    block = triton.next_power_of_2(max(H, 1))
    out = []
    for warps in (4, 8, 16, 32):
        if warps == 32 and block < 4096:
            continue
        for rows in (1, 2, 4, 8):
            if 8 <= rows * block // (32 * warps) <= (16 if warps <= 8 else 8):
                out.append(LaunchConfig(block, 1, warps, rows, base.programs_per_sm))
    return out + [base] if base.chunks > 1 else out


def backward_config(H: int, dtype: torch.dtype, arch: str | None) -> LaunchConfig:
    """The backward's layout: the tuned table's row for (arch, dtype, width) where it has one (helpers.rmsnorm_tuned;
    fp16 reads bf16's), else launch_config's. `arch` None (the interpreter) takes launch_config's."""
    name = "float32" if dtype == torch.float32 else "bfloat16"
    block = triton.next_power_of_2(max(H, 1))
    for row in BACKWARD:
        if row[:3] == (arch, name, block):
            return LaunchConfig(row[3], triton.cdiv(H, row[3]), *row[4:])  # blocks to cover the row
    return launch_config(H, "backward")


def _arch(device: torch.device) -> str | None:
    """sm_90a from compute capability 9 on, else sm_80; None off CUDA (the table's architectures)."""
    if device.type != "cuda":
        return None
    return "sm_90a" if torch.cuda.get_device_capability(device)[0] >= 9 else "sm_80"


def _bwd_programs(n_rows: int, device: torch.device, per_sm: int = 4) -> int:
    """How many programs share the backward rows (and so how many dg partials): a few per SM on CUDA."""
    if device.type == "cuda":
        return max(1, min(n_rows, per_sm * torch.cuda.get_device_properties(device).multi_processor_count))
    return max(1, min(n_rows, 4))  # the interpreter runs programs one after another


def rmsnorm_triton_forward(x2: Tensor, g: Tensor, max_block: int | None = None) -> tuple[Tensor, Tensor]:
    """Launch the forward kernel on contiguous (N, H) x: returns y (N, H) in x.dtype and rrms (N,) fp32."""
    n_rows, H = x2.shape
    y = torch.empty_like(x2)
    rrms = torch.empty(n_rows, device=x2.device, dtype=torch.float32)
    if n_rows:
        cfg = launch_config(H, "forward", max_block)
        rmsnorm_fwd_kernel[(n_rows,)](
            x2, g, y, rrms, H, EPS, BLOCK_H=cfg.block_h, CHUNKS=cfg.chunks, num_warps=cfg.num_warps
        )
    return y, rrms


def rmsnorm_triton_backward(
    dy2: Tensor, x2: Tensor, g: Tensor, rrms: Tensor, max_block: int | None = None, cfg: LaunchConfig | None = None
) -> tuple[Tensor, Tensor]:
    """Launch the backward kernels on contiguous (N, H) tensors: returns dx (N, H) and dg (H,). The layout: `cfg`,
    else launch_config's with `max_block`, else the tuned table's (backward_config)."""
    n_rows, H = x2.shape
    if cfg is None:
        cfg = launch_config(H, "backward", max_block) if max_block else backward_config(H, x2.dtype, _arch(x2.device))
    programs = _bwd_programs(n_rows, x2.device, cfg.programs_per_sm)
    rows_per_program = -(-n_rows // programs)  # ceil
    dx = torch.empty_like(x2)
    partial = torch.empty(programs, H, device=x2.device, dtype=torch.float32)  # (P, H): sized by programs, not rows
    dot = torch.empty(n_rows if cfg.chunks > 1 else 1, device=x2.device, dtype=torch.float32)  # (N,) wide rows only
    dg = torch.empty_like(g)
    if n_rows:
        if cfg.chunks > 1:
            rmsnorm_bwd_dot_kernel[(n_rows,)](
                dy2, x2, g, rrms, dot, H, BLOCK_H=cfg.block_h, CHUNKS=cfg.chunks, num_warps=cfg.num_warps
            )
        rmsnorm_bwd_kernel[(programs, cfg.chunks)](
            dy2,
            x2,
            g,
            rrms,
            dot,
            dx,
            partial,
            n_rows,
            H,
            rows_per_program,
            BLOCK_H=cfg.block_h,
            CHUNKS=cfg.chunks,
            ROWS=cfg.rows,
            num_warps=cfg.num_warps,
        )
    else:
        partial.zero_()
    sum_rows_kernel[(triton.cdiv(H, SUM_ROWS["BLOCK_C"]),)](partial, dg, programs, H, **SUM_ROWS)
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
