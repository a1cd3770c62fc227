"""Every Triton kernel compiled for real GPUs on any machine: registers, spill bytes and shared memory per launch
configuration the code uses, from the ptxas shipped in the triton wheel (no GPU needed).

    python -m helpers kernels                       # every configuration, sm_80 and sm_90a; ends "N ... S with spills"
    python -m helpers kernels --quick               # a subset (what `make test-ci` runs, CI after make test)
    python -m helpers kernels --quick --arch sm_90a # one architecture (make test-newest-triton's run)
    python -m helpers kernels --grid                # every configuration `python -m helpers tune` may time (minutes)

Compiling needs Triton's real compiler, not its interpreter: the command runs itself in a child process with
TRITON_INTERPRET=0 when the interpreter is on (as it is on a machine without CUDA).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ARCHS = {"sm_80": 80, "sm_90a": 90}
TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
GPU_WIDTHS = (1024, 2048, 4096, 8192, 16384, 65536, 262144)  # the gpu profile's H and wider: no width may spill


@dataclass
class KernelConfig:
    """One kernel at one launch configuration: pointer dtypes, constexprs and warps exactly as the launch code
    passes."""

    label: str
    kernel: object
    signature: dict
    constexprs: dict
    num_warps: int
    num_stages: int = 3
    extra: dict = field(default_factory=dict)
    archs: tuple = tuple(ARCHS)  # a tuned table's row is for one architecture


def _rmsnorm_bwd_configs(layouts, dtype: str, H: int, arch: str, tag: str = "") -> list[KernelConfig]:
    """The backward kernel (and for wide rows the dot kernel) at each rmsnorm.LaunchConfig of `layouts`, for `arch`."""
    from helpers import rmsnorm as R

    t, out = "*" + TYPES[dtype], []
    for b in layouts:
        sig = {
            "dy_ptr": t,
            "x_ptr": t,
            "g_ptr": t,
            "rrms_ptr": "*fp32",
            "dot_ptr": "*fp32",
            "dx_ptr": t,
            "dg_partial_ptr": "*fp32",
            "n_rows": "i32",
            "H": "i32",
            "rows_per_program": "i32",
            "BLOCK_H": "constexpr",
            "CHUNKS": "constexpr",
            "ROWS": "constexpr",
        }
        how = f" {tag}w{b.num_warps} r{b.rows}" if tag else ""
        consts = {"BLOCK_H": b.block_h, "CHUNKS": b.chunks, "ROWS": b.rows}
        out.append(
            KernelConfig(
                f"rmsnorm bwd {dtype} H={H}{how}", R.rmsnorm_bwd_kernel, sig, consts, b.num_warps, archs=(arch,)
            )
        )
        if b.chunks > 1:
            sig = {k: sig[k] for k in ("dy_ptr", "x_ptr", "g_ptr", "rrms_ptr", "dot_ptr", "H", "BLOCK_H", "CHUNKS")}
            consts = {"BLOCK_H": b.block_h, "CHUNKS": b.chunks}
            out.append(
                KernelConfig(
                    f"rmsnorm bwd dot {dtype} H={H}", R.rmsnorm_bwd_dot_kernel, sig, consts, b.num_warps, archs=(arch,)
                )
            )
    return out


def rmsnorm_grid_configs(widths=(1024, 2048, 4096, 8192), dtypes=("float32", "bfloat16")) -> list[KernelConfig]:
    """Every backward layout `python -m helpers tune rmsnorm` times (rmsnorm.backward_grid), for both archs."""
    from helpers import rmsnorm as R

    return [
        c
        for dtype in dtypes
        for H in widths
        for arch in ARCHS
        for c in _rmsnorm_bwd_configs(R.backward_grid(H), dtype, H, arch, tag="grid ")
    ]


def rmsnorm_configs(widths=GPU_WIDTHS, dtypes=("float32", "bfloat16")) -> list[KernelConfig]:
    """The RMSNorm kernels at the launch configurations helpers.rmsnorm picks for each width and dtype (the
    backward's per architecture, from its tuned table)."""
    import torch

    from helpers import rmsnorm as R

    out = []
    for dtype in dtypes:
        t = "*" + TYPES[dtype]
        for H in widths:
            f = R.launch_config(H, "forward")
            out.append(
                KernelConfig(
                    f"rmsnorm fwd {dtype} H={H}",
                    R.rmsnorm_fwd_kernel,
                    {
                        "x_ptr": t,
                        "g_ptr": t,
                        "y_ptr": t,
                        "rrms_ptr": "*fp32",
                        "H": "i32",
                        "eps": "fp32",
                        "BLOCK_H": "constexpr",
                        "CHUNKS": "constexpr",
                    },
                    {"BLOCK_H": f.block_h, "CHUNKS": f.chunks},
                    f.num_warps,
                )
            )
            for arch in ARCHS:
                out += _rmsnorm_bwd_configs([R.backward_config(H, getattr(torch, dtype), arch)], dtype, H, arch)
        out.append(
            KernelConfig(
                f"rmsnorm dg sum {dtype}",
                R.sum_rows_kernel,
                {
                    "partial_ptr": "*fp32",
                    "out_ptr": t,
                    "P": "i32",
                    "H": "i32",
                    "BLOCK_P": "constexpr",
                    "BLOCK_C": "constexpr",
                },
                {k: v for k, v in R.SUM_ROWS.items() if k != "num_warps"},
                R.SUM_ROWS["num_warps"],
            )
        )
    return out


ATTENTION_HEAD_DIMS = (64, 128)  # notebook 06's gpu profile sweeps d up to 128; the leaderboard runs d = 64
_ATTENTION_POINTERS = ("Q", "K", "V", "O", "L", "Delta", "dO", "dQ", "dK", "dV")


def _attention_signature(kernel, dtype: str, constexprs: dict) -> tuple[dict, dict, dict]:
    """signature, constexprs and divisibility attrs as Triton's JIT specialises them for contiguous (B, H, T, d)
    tensors: pointers 16-byte aligned (L, Delta fp32), strides along d equal 1 (a constexpr), the others multiples
    of 16; H, Tq, Tk plain i32 (any length)."""
    sig, consts, attrs = {}, dict(constexprs), {}
    for i, name in enumerate(kernel.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif name in _ATTENTION_POINTERS:
            sig[name] = "*fp32" if name in ("L", "Delta") else "*" + TYPES[dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name.startswith("s") and name.endswith("_d"):
            sig[name], consts[name] = "constexpr", 1
        elif name == "scale":
            sig[name] = "fp32"
        elif name.startswith("s"):  # strides along b, h, t
            sig[name] = "i32"
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:  # H, Tq, Tk
            sig[name] = "i32"
    return sig, consts, attrs


_ATTENTION_KERNELS = {"fwd": ("attn_fwd_kernel", "BQ", "BK"), "dkdv": ("attn_bwd_dkdv_kernel", "BN", "BM")}
_ATTENTION_KERNELS["dq"] = ("attn_bwd_dq_kernel", "BM", "BN")  # (kernel, the owned tile's name, the streamed one's)


def _attention_config(name: str, tiles, dtype: str, d: int, is_causal: bool, arch: str, tag: str = "") -> KernelConfig:
    """One attention kernel (fwd | dkdv | dq) at `tiles` (attention.Tiles) for `arch`."""
    from helpers import attention as A

    kernel_name, own, loop = _ATTENTION_KERNELS[name]
    precision = "ieee" if dtype == "float32" else "tf32"
    consts = dict(D=d, IS_CAUSAL=is_causal, PRECISION=precision, **{own: tiles.own, loop: tiles.loop})
    kernel = getattr(A, kernel_name)
    sig, consts, attrs = _attention_signature(kernel, dtype, consts)
    how = f" {tag}{tiles.own}x{tiles.loop} w{tiles.num_warps} s{tiles.num_stages}" if tag else ""
    label = f"attn {'fwd' if name == 'fwd' else 'bwd ' + name} {dtype} d={d}{' causal' if is_causal else ''}{how}"
    return KernelConfig(
        label, kernel, sig, consts, tiles.num_warps, tiles.num_stages, extra={"attrs": attrs}, archs=(arch,)
    )


def attention_configs(
    head_dims=ATTENTION_HEAD_DIMS, dtypes=("float32", "bfloat16"), causal=(False, True)
) -> list[KernelConfig]:
    """The FlashAttention-2 kernels (forward, D, dK/dV, dQ) at the tiles helpers.attention's table holds per
    architecture."""
    import torch

    from helpers import attention as A

    out = []
    for dtype in dtypes:
        for d in head_dims:
            for arch in ARCHS:
                cfg = A.tiles_for(d, getattr(torch, dtype), arch)
                for is_causal in causal:
                    out += [_attention_config(n, getattr(cfg, n), dtype, d, is_causal, arch) for n in A.KERNELS]
            sig, consts, attrs = _attention_signature(A.attn_bwd_delta_kernel, dtype, {"D": d, "BLOCK": A.DELTA_BLOCK})
            label = f"attn bwd delta {dtype} d={d}"
            out.append(KernelConfig(label, A.attn_bwd_delta_kernel, sig, consts, 4, extra={"attrs": attrs}))
    return out


def attention_grid_configs(keys=None) -> list[KernelConfig]:
    """Every (kernel, tiles) `python -m helpers tune attention` may time (attention.GRID), causal and not, for the
    architectures each candidate is listed for."""
    from helpers import attention as A

    out = []
    for (dtype, d), kernels in A.GRID.items():
        if keys is not None and (dtype, d) not in keys:
            continue
        for name, candidates in kernels.items():
            for tiles, archs in candidates:
                for arch in archs:
                    out += [_attention_config(name, tiles, dtype, d, c, arch, tag="grid ") for c in (True, False)]
    return out


def all_configs(quick: bool = False, grid: bool = False) -> list[KernelConfig]:
    """Every kernel configuration of the project (quick: RMSNorm in bf16 at the widest one-block width, the
    handout's widest (8192, where a one-block backward spilled) and a looped one, the attention kernels at the
    leaderboard's bf16 causal d = 64, and at fp32 d = 128, the most registers per tile, where triton 3.6 spilled;
    grid: every configuration the tune command may time)."""
    if grid:
        return attention_grid_configs() + rmsnorm_grid_configs()
    if quick:
        return (
            rmsnorm_configs(widths=(4096, 8192, 65536), dtypes=("bfloat16",))
            + attention_configs(head_dims=(64,), dtypes=("bfloat16",), causal=(True,))
            + attention_configs(head_dims=(128,), dtypes=("float32",), causal=(False,))
        )
    return rmsnorm_configs() + attention_configs()


def _ptxas() -> Path:
    """The ptxas in the triton wheel that accepts this triton's PTX (ptxas-blackwell where the plain one is older)."""
    import triton

    bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    for name in ("ptxas-blackwell", "ptxas"):
        if (bindir / name).exists():
            return bindir / name
    raise FileNotFoundError(f"no ptxas in {bindir}: this triton wheel ships no NVIDIA backend")


def compile_config(cfg: KernelConfig, arch: str) -> dict:
    """Compile `cfg` for `arch` (sm_80 / sm_90a) and read registers, spill bytes and shared memory from ptxas -v."""
    import triton
    from triton.backends.compiler import GPUTarget

    src = triton.compiler.ASTSource(
        fn=cfg.kernel, signature=cfg.signature, constexprs=cfg.constexprs, attrs=cfg.extra.get("attrs")
    )
    k = triton.compile(
        src,
        target=GPUTarget("cuda", ARCHS[arch], 32),
        options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
    )
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(k.asm["ptx"])
        run = subprocess.run(
            [str(_ptxas()), "-v", "--gpu-name", arch, str(ptx), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True,
            text=True,
        )
    if run.returncode:
        raise RuntimeError(f"ptxas failed on {cfg.label} for {arch}: {run.stderr.strip()[-400:]}")
    text = run.stdout + run.stderr
    regs = int(re.search(r"Used (\d+) registers", text).group(1))
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", text))
    return {
        "kernel": cfg.label,
        "arch": arch,
        "num_warps": cfg.num_warps,
        "registers": regs,
        "spill_bytes": spills,
        "shared_bytes": k.metadata.shared,
    }


def check(quick: bool = False, grid: bool = False, configs=None, workers: int = 1, archs=tuple(ARCHS)) -> list[dict]:
    """Rows of compile_config for every configuration (all_configs', or `configs`) and each of its architectures
    among `archs`; `workers` compile in parallel processes (ptxas and Triton's passes are single-threaded)."""
    configs = configs if configs is not None else all_configs(quick, grid)
    jobs = [(cfg, arch) for cfg in configs for arch in cfg.archs if arch in archs]
    if workers <= 1:
        return [compile_config(cfg, arch) for cfg, arch in jobs]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers) as pool:  # the kernels are found again by name in each worker (_by_label)
        return list(pool.map(_compile_labelled, [(cfg.label, arch, quick, grid) for cfg, arch in jobs]))


def _compile_labelled(job) -> dict:
    """compile_config for the configuration labelled `label` among all_configs(quick, grid) (a picklable job)."""
    label, arch, quick, grid = job
    return compile_config(next(c for c in all_configs(quick, grid) if c.label == label and arch in c.archs), arch)


def main(argv: list[str]) -> int:
    """`python -m helpers kernels`: print one row per configuration and a summary line; 1 if any spills."""
    parser = argparse.ArgumentParser(prog="python -m helpers kernels", description=main.__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a subset: RMSNorm at two widths, attention at bf16 causal d=64 and fp32 d=128",
    )
    parser.add_argument("--grid", action="store_true", help="every configuration `python -m helpers tune` may time")
    parser.add_argument("--only", choices=("attention", "rmsnorm"), help="with --grid: one kernel family")
    parser.add_argument("--workers", type=int, default=1, help="parallel compiler processes")
    parser.add_argument(
        "--arch", action="append", choices=tuple(ARCHS), help="only this architecture (repeat for more; default: all)"
    )
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter cannot compile: run again without it
        env = {**os.environ, "TRITON_INTERPRET": "0"}
        return subprocess.run([sys.executable, "-m", "helpers", "kernels", *argv], env=env).returncode
    configs = None
    if args.grid and args.only:
        configs = attention_grid_configs() if args.only == "attention" else rmsnorm_grid_configs()
    archs = tuple(args.arch or ARCHS)
    rows = check(args.quick, args.grid, configs=configs, workers=args.workers, archs=archs)
    for r in rows:
        print(
            f"{r['kernel']:<54} {r['arch']:<7} warps {r['num_warps']:>2}  registers {r['registers']:>3}  "
            f"spill bytes {r['spill_bytes']:>5}  shared {r['shared_bytes']:>6} B"
        )
    spilled = sum(r["spill_bytes"] > 0 for r in rows)
    print(f"{len(rows)} configurations compiled for {', '.join(archs)}; {spilled} with spills")
    return 1 if spilled else 0
