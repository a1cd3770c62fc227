"""Every Triton kernel compiled for real GPUs on any machine: registers, spill bytes and shared memory per launch
configuration the code uses, from the ptxas shipped in the triton wheel (no GPU needed).

    python -m helpers kernels                       # every configuration, sm_80 and sm_90a; ends "N ... S with spills"
    python -m helpers kernels --quick               # a subset (what `make test` runs)

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


def rmsnorm_configs(widths=GPU_WIDTHS, dtypes=("float32", "bfloat16")) -> list[KernelConfig]:
    """The RMSNorm kernels at the launch configurations helpers.rmsnorm picks for each width and dtype."""
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
            b = R.launch_config(H, "backward")
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
            }
            out.append(
                KernelConfig(
                    f"rmsnorm bwd {dtype} H={H}",
                    R.rmsnorm_bwd_kernel,
                    sig,
                    {"BLOCK_H": b.block_h, "CHUNKS": b.chunks},
                    b.num_warps,
                )
            )
            if b.chunks > 1:
                sig = {
                    "dy_ptr": t,
                    "x_ptr": t,
                    "g_ptr": t,
                    "rrms_ptr": "*fp32",
                    "dot_ptr": "*fp32",
                    "H": "i32",
                    "BLOCK_H": "constexpr",
                    "CHUNKS": "constexpr",
                }
                out.append(
                    KernelConfig(
                        f"rmsnorm bwd dot {dtype} H={H}",
                        R.rmsnorm_bwd_dot_kernel,
                        sig,
                        {"BLOCK_H": b.block_h, "CHUNKS": b.chunks},
                        b.num_warps,
                    )
                )
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


def attention_configs(
    head_dims=ATTENTION_HEAD_DIMS, dtypes=("float32", "bfloat16"), causal=(False, True)
) -> list[KernelConfig]:
    """The FlashAttention-2 kernels (forward, dK/dV, dQ) at the tiles helpers.attention._launch_config picks on CUDA."""
    import torch

    from helpers import attention as A

    out = []
    for dtype in dtypes:
        for d in head_dims:
            cfg = A._launch_config(d, getattr(torch, dtype), "cuda")
            for is_causal in causal:
                common = dict(D=d, IS_CAUSAL=is_causal, PRECISION=cfg.dot_precision)
                for name, kernel, tiles in (
                    ("fwd", A.attn_fwd_kernel, dict(BQ=cfg.block_q, BK=cfg.block_k)),
                    ("bwd dkdv", A.attn_bwd_dkdv_kernel, dict(BN=cfg.block_own, BM=cfg.block_loop)),
                    ("bwd dq", A.attn_bwd_dq_kernel, dict(BM=cfg.block_own, BN=cfg.block_loop)),
                ):
                    sig, consts, attrs = _attention_signature(kernel, dtype, {**common, **tiles})
                    label = f"attn {name} {dtype} d={d}{' causal' if is_causal else ''}"
                    out.append(
                        KernelConfig(label, kernel, sig, consts, cfg.num_warps, cfg.num_stages, extra={"attrs": attrs})
                    )
    return out


def all_configs(quick: bool = False) -> list[KernelConfig]:
    """Every kernel configuration of the project (quick: two RMSNorm widths in bf16, the attention kernels at the
    leaderboard's bf16 causal d = 64, and at fp32 d = 128, the most registers per tile, where triton 3.6 spilled)."""
    if quick:
        return (
            rmsnorm_configs(widths=(4096, 65536), dtypes=("bfloat16",))
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


def check(quick: bool = False) -> list[dict]:
    """Rows of compile_config for every configuration and architecture."""
    return [compile_config(cfg, arch) for cfg in all_configs(quick) for arch in ARCHS]


def main(argv: list[str]) -> int:
    """`python -m helpers kernels`: print one row per configuration and a summary line; 1 if any spills."""
    parser = argparse.ArgumentParser(prog="python -m helpers kernels", description=main.__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a subset: RMSNorm at two widths, attention at bf16 causal d=64 and fp32 d=128",
    )
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter cannot compile: run again without it
        env = {**os.environ, "TRITON_INTERPRET": "0"}
        return subprocess.run([sys.executable, "-m", "helpers", "kernels", *argv], env=env).returncode
    rows = check(args.quick)
    for r in rows:
        print(
            f"{r['kernel']:<36} {r['arch']:<7} warps {r['num_warps']:>2}  registers {r['registers']:>3}  "
            f"spill bytes {r['spill_bytes']:>5}  shared {r['shared_bytes']:>6} B"
        )
    spilled = sum(r["spill_bytes"] > 0 for r in rows)
    print(f"{len(rows)} configurations compiled for {', '.join(ARCHS)}; {spilled} with spills")
    return 1 if spilled else 0
