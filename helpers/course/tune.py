"""`python -m helpers tune attention|rmsnorm`: time a grid of kernel configurations on a GPU in about a minute each,
save every row with provenance under data/reference/<device>/, and write the fastest into the tables the kernels
read (helpers/attention/tuned.py, helpers/rmsnorm_tuned.py; commit them with the rows).

    python -m helpers tune attention --estimate   # the plan and its estimated device time; runs nothing
    python -m helpers tune attention              # a GPU: each kernel's candidates at the leaderboard's shape, then
                                                  #   ours (tuned, seed) against SDPA at the handout's shapes
    python -m helpers tune rmsnorm                # a GPU: backward layouts per width and dtype at 50,000 rows
    python -m helpers tune all --check            # anywhere: every candidate compiled for sm_80/sm_90a (0 spills),
                                                  #   a representative subset run in the interpreter against the spec
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from helpers import attention as A
from helpers import rmsnorm as R
from helpers.formulas.attention_cost import achieved, kernel_costs
from helpers.results import save_results
from helpers.timing import benchmark, compare

LEADERBOARD = dict(batch=1, heads=16, T=16384)  # bf16, causal, d = 64: the 2025 leaderboard's (notebook 06)
TUNE_SHAPES = {("bfloat16", 64): 16384, ("bfloat16", 128): 8192}  # T each (dtype, d) is tuned at (batch 1, 16 heads)
BENCH_T = (1024, 4096, 16384)  # notebook 06's benchmark: (1, 16, T, 64) in fp32 and bf16, causal
RMS_ROWS, RMS_WIDTHS = 50_000, (1024, 2048, 4096, 8192)  # notebook 02's gpu profile
COMPILE_S = 2.5  # seconds a first launch spends compiling one kernel (Triton + ptxas on a GPU host; an estimate)
RATE = {"bfloat16": 250e12, "float32": 30e12}  # FLOP/s assumed for the estimate (a slow kernel's)
WARMUP, STEPS = 2, 10
ROOT = Path(__file__).resolve().parents[2]


# ---- the plan and its estimate -----------------------------------------------------------------------------------


def attention_plan(arch: str | None = None) -> list[dict]:
    """Every timing the attention sweep makes on `arch` (default: this machine's, sm_90a without CUDA): (what,
    dtype, d, T, kernel, tiles); the candidates listed for that architecture first, then the comparisons (ours
    tuned, ours seed, SDPA; forward and forward + backward) at the benchmark shapes."""
    arch = arch or A.tiles.device_arch("cuda")
    plan = []
    for (dtype, d), T in TUNE_SHAPES.items():
        for kernel in A.KERNELS:
            for tiles, archs in A.GRID[(dtype, d)][kernel]:
                if arch in archs:
                    plan.append(dict(what="candidate", dtype=dtype, d=d, T=T, kernel=kernel, tiles=tiles))
    for dtype in ("bfloat16", "float32"):
        for T in BENCH_T:
            plan.append(dict(what="compare", dtype=dtype, d=64, T=T, kernel="fwd+bwd", tiles=None))
    return plan


def estimate_attention_s(arch: str | None = None) -> float:
    """Device seconds the attention sweep should take on `arch` (attention_plan's): a compile per candidate kernel
    and per fp32 kernel, and (WARMUP + STEPS) runs of each timing at RATE over the kernel's executed FLOPs."""
    total = 0.0
    for p in attention_plan(arch):
        costs = kernel_costs(LEADERBOARD["heads"], p["T"], p["T"], p["d"], True)
        runs = WARMUP + STEPS
        if p["what"] == "candidate":
            total += COMPILE_S + runs * costs[p["kernel"]].flops_executed / RATE[p["dtype"]]
        else:  # 3 implementations x 2 passes, interleaved; fp32 compiles its 4 kernels once
            fb = sum(c.flops_executed for c in costs.values())
            total += 3 * runs * (fb + costs["fwd"].flops_executed) / RATE[p["dtype"]]
    return total + 4 * COMPILE_S


def estimate_rmsnorm_s() -> float:
    """Device seconds of the RMSNorm sweep: a compile per layout, and its runs at ~2.5 TB/s (3 row passes)."""
    total = 0.0
    for dtype in (torch.float32, torch.bfloat16):
        for H in RMS_WIDTHS:
            grid = R.backward_grid(H)
            per_run = 3 * RMS_ROWS * H * dtype.itemsize / 2.5e12
            total += len(grid) * (COMPILE_S / 2 + (WARMUP + STEPS) * per_run) + 2 * (WARMUP + STEPS) * 2 * per_run
    return total


# ---- attention on a GPU --------------------------------------------------------------------------------------------


def _inputs(T: int, d: int, dtype: torch.dtype, seed: int = 0):
    """q, k, v, dO of shape (1, 16, T, d) on CUDA."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(1, LEADERBOARD["heads"], T, d, generator=gen, device="cuda", dtype=dtype) for _ in range(4)]


def _with(cfg: A.LaunchConfig, kernel: str, tiles: A.Tiles) -> A.LaunchConfig:
    """cfg with one kernel's tiles replaced."""
    return A.LaunchConfig(
        **{**{k: getattr(cfg, k) for k in A.KERNELS}, kernel: tiles, "dot_precision": cfg.dot_precision}
    )


def tune_attention(arch: str, device_name: str) -> tuple[list[dict], dict]:
    """Time each kernel's candidates at its (dtype, d) tuning shape (the others at the seed's tiles); the rows and
    the chosen LaunchConfig per (dtype, d)."""
    rows, chosen = [], {}
    for (dtype_name, d), T in TUNE_SHAPES.items():
        dtype = getattr(torch, dtype_name)
        seed = A.tiles_for(d, dtype, arch)
        q, k, v, do = _inputs(T, d, dtype)
        o, lse = A.flash_forward_triton(q, k, v, True, seed)
        delta = A.bwd_delta(o, do)
        costs = kernel_costs(LEADERBOARD["heads"], T, T, d, True)
        best = {}
        for kernel in A.KERNELS:
            for tiles, archs in A.GRID[(dtype_name, d)][kernel]:
                if arch not in archs:
                    continue
                cfg = _with(seed, kernel, tiles)
                if kernel == "fwd":
                    fn = functools.partial(A.flash_forward_triton, q, k, v, True, cfg)
                else:
                    fn = functools.partial(A.bwd_kernel, kernel, q, k, v, do, lse, delta, True, cfg)
                t = benchmark(fn, warmup=WARMUP, steps=STEPS, device="cuda", label=f"{kernel} {tiles}")
                rate = achieved(costs[kernel], t.median, device_name)
                rows.append(
                    dict(what="candidate", arch=arch, dtype=dtype_name, d=d, T=T, heads=LEADERBOARD["heads"],
                         causal=True, kernel=kernel, own=tiles.own, loop=tiles.loop, num_warps=tiles.num_warps,
                         num_stages=tiles.num_stages, seed=tiles == getattr(seed, kernel), median_ms=t.median * 1e3,
                         TFLOPs=rate.tflops, fraction_of_peak=rate.fraction_of_peak, GBps_model=rate.GBps)
                )  # fmt: skip
                if kernel not in best or t.median < best[kernel][0]:
                    best[kernel] = (t.median, tiles)
        chosen[(dtype_name, d)] = A.LaunchConfig(*(best[k][1] for k in A.KERNELS), seed.dot_precision)
    return rows, chosen


def _ours_step(q, k, v, do, cfg: A.LaunchConfig, backward: bool) -> None:
    """Our forward (and backward) kernels at cfg's tiles, without autograd."""
    o, lse = A.flash_forward_triton(q, k, v, True, cfg)
    if backward:
        A.flash_backward_triton(q, k, v, o, lse, do, True, cfg)


def _sdpa_step(q, k, v, do, backward: bool) -> None:
    """PyTorch's fused attention forward (and backward through autograd)."""
    import torch.nn.functional as F

    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if backward:
        torch.autograd.grad(o, (q, k, v), do)


def compare_attention(arch: str, chosen: dict) -> list[dict]:
    """Ours (tuned), ours (seed) and SDPA interleaved (timing.compare) at notebook 06's benchmark shapes, causal:
    forward and forward + backward, the ratio to SDPA with its interval."""
    rows = []
    for dtype_name in ("bfloat16", "float32"):
        dtype = getattr(torch, dtype_name)
        seed = A.tiles_for(64, dtype, arch)
        tuned = chosen.get((dtype_name, 64), seed)
        for T in BENCH_T:
            q, k, v, do = _inputs(T, 64, dtype)

            ours = functools.partial(_ours_step, q, k, v, do)
            sdpa = functools.partial(_sdpa_step, *(x.clone().requires_grad_() for x in (q, k, v)), do)
            for pass_, backward in (("fwd", False), ("fwd+bwd", True)):
                fns = {
                    "sdpa": functools.partial(sdpa, backward),
                    "ours (tuned)": functools.partial(ours, tuned, backward),
                }
                if tuned != seed:
                    fns["ours (seed)"] = functools.partial(ours, seed, backward)
                c = compare(fns, steps=STEPS, warmup=WARMUP, device="cuda", baseline="sdpa")
                for label, r in c.table().iterrows():
                    rows.append(
                        dict(what="compare", arch=arch, dtype=dtype_name, d=64, T=T, heads=LEADERBOARD["heads"],
                             causal=True, impl=label, pass_=pass_, median_ms=r.median_s * 1e3, ratio_to_sdpa=r.ratio,
                             ratio_low=r.ratio_low, ratio_high=r.ratio_high)
                    )  # fmt: skip
    return rows


# ---- RMSNorm on a GPU ----------------------------------------------------------------------------------------------


def tune_rmsnorm(arch: str) -> tuple[list[dict], dict]:
    """Time every backward layout (rmsnorm.backward_grid) per width and dtype at RMS_ROWS rows, then the fastest
    against launch_config's default interleaved; the rows and the chosen layout per (dtype, H)."""
    rows, chosen = [], {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        for H in RMS_WIDTHS:
            gen = torch.Generator(device="cuda").manual_seed(0)
            x, dy = (torch.randn(RMS_ROWS, H, generator=gen, device="cuda", dtype=dtype) for _ in range(2))
            g = torch.ones(H, device="cuda", dtype=dtype)
            _, rrms = R.rmsnorm_triton_forward(x, g)
            nbytes = 3 * RMS_ROWS * H * dtype.itemsize
            best = None
            for cfg in R.backward_grid(H):
                step = functools.partial(R.rmsnorm_triton_backward, dy, x, g, rrms, cfg=cfg)
                t = benchmark(step, WARMUP, STEPS, "cuda")
                rows.append(
                    dict(what="candidate", arch=arch, dtype=name, rows=RMS_ROWS, H=H, block_h=cfg.block_h,
                         num_warps=cfg.num_warps, rows_per_step=cfg.rows, programs_per_sm=cfg.programs_per_sm,
                         median_ms=t.median * 1e3, GBps=nbytes / t.median / 1e9)
                )  # fmt: skip
                if best is None or t.median < best[0]:
                    best = (t.median, cfg)
            chosen[(name, H)] = best[1]
            default = R.launch_config(H, "backward")
            c = compare(
                {
                    "default": functools.partial(R.rmsnorm_triton_backward, dy, x, g, rrms, cfg=default),
                    "tuned": functools.partial(R.rmsnorm_triton_backward, dy, x, g, rrms, cfg=best[1]),
                },
                steps=STEPS,
                warmup=WARMUP,
                device="cuda",
            )
            r = c.ratio("tuned")
            rows.append(dict(what="compare", arch=arch, dtype=name, rows=RMS_ROWS, H=H, ratio_tuned_to_default=r.median,
                             ratio_low=r.low, ratio_high=r.high))  # fmt: skip
    return rows, chosen


# ---- the tables as code --------------------------------------------------------------------------------------------


def _table_text(path: Path, name: str, header: str, rows: list[tuple], source: str) -> str:
    """The table file at `path` with its SOURCE line and `name` = (rows...) replaced; its docstring kept."""
    text = path.read_text()
    doc = text[: text.index('\nSOURCE = "')]
    body = "".join(f"    {tuple(r)!r},\n".replace("'", '"') for r in sorted(rows))
    return f'{doc}\nSOURCE = "{source}"\n\n{name} = (\n    # {header}\n{body})\n'


def write_attention_table(arch: str, chosen: dict, source: str, path: Path | None = None) -> Path:
    """Replace `arch`'s rows of helpers/attention/tuned.py by `chosen` ((dtype, d) -> LaunchConfig)."""
    from helpers.attention import tuned

    path = path or Path(tuned.__file__)
    keep = [r for r in tuned.TILES if not (r[0] == arch and (r[1], r[2]) in chosen)]
    new = [
        (
            arch,
            dtype,
            d,
            kernel,
            *(getattr(getattr(cfg, kernel), f) for f in ("own", "loop", "num_warps", "num_stages")),
        )
        for (dtype, d), cfg in chosen.items()
        for kernel in A.KERNELS
    ]
    header = "(arch, dtype, d, kernel, own, loop, num_warps, num_stages)"
    path.write_text(_table_text(path, "TILES", header, keep + new, source))
    return path


def write_rmsnorm_table(arch: str, chosen: dict, source: str, path: Path | None = None) -> Path:
    """Replace `arch`'s rows of helpers/rmsnorm_tuned.py by `chosen` ((dtype, H) -> rmsnorm.LaunchConfig)."""
    from helpers import rmsnorm_tuned

    path = path or Path(rmsnorm_tuned.__file__)
    keep = [r for r in rmsnorm_tuned.BACKWARD if not (r[0] == arch and (r[1], r[2]) in chosen)]
    new = [(arch, dt, H, c.block_h, c.num_warps, c.rows, c.programs_per_sm) for (dt, H), c in chosen.items()]
    header = "(arch, dtype, H, block_h, num_warps, rows, programs_per_sm)"
    path.write_text(_table_text(path, "BACKWARD", header, keep + new, source))
    return path


# ---- the CPU check ---------------------------------------------------------------------------------------------------


def interpreter_subset() -> list[A.LaunchConfig]:
    """One LaunchConfig per distinct 16-bit (own, loop) tile shape of the grid, kernel by kernel (warps and stages
    do not change what the interpreter computes), padded with the seed's tiles: what --check runs against the spec."""
    out = []
    for d in (64, 128):
        seed = A.tiles_for(d, torch.bfloat16, "sm_90a")
        shapes = {k: list(dict.fromkeys((t.own, t.loop) for t, _ in A.GRID[("bfloat16", d)][k])) for k in A.KERNELS}
        for i in range(max(len(v) for v in shapes.values())):
            tiles = [A.Tiles(*shapes[k][min(i, len(shapes[k]) - 1)], 4, 1) for k in A.KERNELS]
            out.append((d, A.LaunchConfig(*tiles, seed.dot_precision)))
    return out


def check_attention_config(cfg: A.LaunchConfig, d: int, T: int = 150, is_causal: bool = True) -> float:
    """fwd + bwd at cfg's tiles in bf16 on (1, 2, T, d) against fp64 naive attention; the largest error relative
    to its bound 4 eps max|reference| (tests/test_attention.py's, from bf16's rounding); raise above 1."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, T, d, generator=gen).to(torch.bfloat16) for _ in range(4))
    o, lse = A.flash_forward_triton(q, k, v, is_causal, cfg)
    dq, dk, dv = A.flash_backward_triton(q, k, v, o, lse, do, is_causal, cfg)
    ref = [x.double().requires_grad_() for x in (q, k, v)]
    o_ref = A.naive_attention(*ref, is_causal)
    grads = torch.autograd.grad(o_ref, ref, do.double())
    worst, eps = 0.0, torch.finfo(torch.bfloat16).eps
    for name, got, want in zip(("o", "dq", "dk", "dv"), (o, dq, dk, dv), (o_ref.detach(), *grads), strict=True):
        ratio = (got.double() - want).abs().max().item() / (4 * eps * want.abs().max().item())
        if not ratio <= 1:
            raise AssertionError(f"{name} at {cfg}: error {ratio:.2f}x its bound")
        worst = max(worst, ratio)
    lse_err = (lse.double() - A.attention_lse(q.double(), k.double(), is_causal)).abs().max().item()
    if not lse_err < 1e-4:
        raise AssertionError(f"L at {cfg}: error {lse_err:.2e}")
    return worst


def check(what: str, workers: int = 2) -> int:
    """--check: the grid's interpreter subset against the spec, then every configuration compiled for sm_80/sm_90a
    (`python -m helpers kernels --grid --only what`); 1 if anything fails or spills."""
    if what in ("attention", "all") and os.environ.get("TRITON_INTERPRET") == "1":
        for d, cfg in interpreter_subset():
            for causal in (True, False):
                worst = check_attention_config(cfg, d, is_causal=causal)
                print(f"interpreter: attention d={d} causal={causal} {cfg}: worst error {worst:.2f}x its bound")
    if what in ("rmsnorm", "all") and os.environ.get("TRITON_INTERPRET") == "1":
        for H in (1024, 8192):
            for cfg in R.backward_grid(H)[:3]:
                _check_rmsnorm_layout(cfg, H)
                print(f"interpreter: rmsnorm backward H={H} {cfg}: matches the spec")
    only = [] if what == "all" else ["--only", what]
    cmd = [sys.executable, "-m", "helpers", "kernels", "--grid", "--workers", str(workers), *only]
    return subprocess.run(cmd).returncode


def _check_rmsnorm_layout(cfg, H: int, n_rows: int = 11) -> None:
    """rmsnorm_triton_backward at `cfg` (rows per step, ragged last step) against the spec, in fp32."""
    gen = torch.Generator().manual_seed(0)
    x, dy = torch.randn(n_rows, H, generator=gen), torch.randn(n_rows, H, generator=gen)
    g = 1 + 0.5 * torch.randn(H, generator=gen)
    _, rrms = R.rmsnorm_triton_forward(x, g)
    dx, dg = R.rmsnorm_triton_backward(dy, x, g, rrms, cfg=cfg)
    torch.testing.assert_close(dx, R.rmsnorm_backward_x(dy, x, g), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dg, R.rmsnorm_backward_g(dy, x, g), rtol=1e-4, atol=1e-5)


# ---- the command -----------------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """`python -m helpers tune attention|rmsnorm|all [--check | --estimate]`."""
    p = argparse.ArgumentParser(prog="python -m helpers tune", description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("attention", "rmsnorm", "all"))
    p.add_argument("--check", action="store_true", help="compile every candidate, run a subset in the interpreter")
    p.add_argument("--estimate", action="store_true", help="print the plan's estimated device time and stop")
    p.add_argument("--workers", type=int, default=2, help="parallel compiles for --check")
    p.add_argument("--no-write", action="store_true", help="save the rows but leave the tables in the code as they are")
    args = p.parse_args(argv)
    kinds = ["attention", "rmsnorm"] if args.what == "all" else [args.what]
    est = {"attention": estimate_attention_s(), "rmsnorm": estimate_rmsnorm_s()}
    arch = A.tiles.device_arch("cuda")
    n = sum(p["what"] == "candidate" for p in attention_plan(arch))
    what = {"attention": f" ({n} tile candidates for {arch})", "rmsnorm": ""}
    for kind in kinds:
        print(f"tune {kind}: estimated {est[kind]:.0f} s of device time{what[kind]}")
    if args.estimate:
        return 0
    if args.check:
        return check(args.what, args.workers)
    if not torch.cuda.is_available():
        raise ValueError(
            "tune times kernels and needs a CUDA GPU; here run `python -m helpers tune all --check` (compiles every "
            "candidate for sm_80/sm_90a and checks a subset in the interpreter) or `--estimate`"
        )
    from helpers.results import provenance

    arch, device_name = A.tiles.device_arch("cuda"), torch.cuda.get_device_name()
    prov = provenance("gpu")
    source = f"tuned on {device_name} ({prov['date'][:10]}, commit {prov['commit']})"
    for kind in kinds:
        start = time.perf_counter()
        if kind == "attention":
            rows, chosen = tune_attention(arch, device_name)
            rows += compare_attention(arch, chosen)
            write = write_attention_table
        else:
            rows, chosen = tune_rmsnorm(arch)
            write = write_rmsnorm_table
        spent = time.perf_counter() - start
        path = save_results(rows, f"{kind}_tune", profile="gpu", kind="reference", wall_s=spent, estimate_s=est[kind])
        print(f"tune {kind}: {len(rows)} rows in {spent:.0f} s (estimated {est[kind]:.0f} s) -> {path}")
        if not args.no_write:
            print(f"tune {kind}: chosen table written to {write(arch, chosen, source)}")
    return 0
