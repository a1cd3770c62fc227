"""Notebook 06's experiments: naive attention's time and O(T^2) memory, the FlashAttention-2 algorithm step by step,
each Triton kernel against its spec, benchmarks in time and TFLOP/s, and the attention choice inside the model.

    bench_attention("naive", shape=(8, 1, 1024, 64), dtype=torch.float32, device="cuda")    # fwd, bwd, fwd+bwd rows
    saved_memory("flash_pytorch", (2, 1, 512, 64))          # bytes live before backward, measured and closed form
    check_kernel("fwd", (1, 2, 40, 16), torch.float32)      # one Triton kernel vs its PyTorch spec
    compare_models("small/cpu", ["naive", "sdpa", "flash_pytorch"])   # model fwd+bwd, interleaved
    python -m helpers bench attention        # CUDA: the leaderboard configuration (Triton vs SDPA vs naive)
    python -m helpers bench attention --seq 256 1024 --head-dim 64 --dtype bfloat16 --impls flash_triton sdpa

The code, one idea per module (all importable from here, as the notebook, the tests and helpers.course use it):
    attention_impls        the inputs, each implementation by name, the three timed passes of one
    attention_bench        one implementation timed per pass (TFLOP/s, out-of-memory rows), the sweep, the bounds
    attention_memory       bytes saved for backward, measured beside the closed form
    attention_checks       the algorithm step by step, any function and each Triton kernel against naive attention
    attention_model        the attention choice inside the model: outputs and gradients, an interleaved step
    attention_leaderboard  interleaved comparisons on one input, the leaderboard configuration and its marks
    attention_sections     sections 1-3 as one call each (run, check, save, one helpers.section.Result)
    attention_bench_sections  sections 4-6 and the leaderboard, the same way
and here: PROFILES and `python -m helpers bench attention` (which saves through this module's `save_results`, as
tests/test_attention_experiments.py replaces it).
"""

from __future__ import annotations

import argparse

import pandas as pd
import torch

from helpers.env import triton_mode
from helpers.experiments.attention_bench import TILED_STEPS, bench_attention, check_physical_bounds, sweep
from helpers.experiments.attention_bench_sections import (
    benchmark,
    leaderboard,
    leaderboard_marks,
    memory_curves,
    model_outputs,
    model_steps,
    tflops,
    yours_against_ours,
)
from helpers.experiments.attention_checks import (
    KERNELS,
    TOL,
    backward_from_lse,
    check_function,
    check_kernel,
    naive_grads,
    online_softmax,
    run_kernel,
)
from helpers.experiments.attention_impls import PASSES, attention_fn, compiled_naive, inputs, pass_steps
from helpers.experiments.attention_leaderboard import (
    LEADERBOARD,
    PUBLISHED_MS,
    compare_impls,
    leaderboard_comparison,
    leaderboard_mark_table,
    plot_leaderboard_marks,
)
from helpers.experiments.attention_memory import saved_bytes_formula, saved_memory
from helpers.experiments.attention_model import MODEL_TOL, TINY, check_model_outputs, compare_models, tiny_model_outputs
from helpers.experiments.attention_sections import (
    Setup,
    backward_check,
    checks_summary,
    compile_ratios,
    fit_card,
    function_checks,
    kernel_checks,
    naive_memory,
    naive_shapes,
    naive_times,
    online_softmax_check,
)
from helpers.experiments.common import positive_int
from helpers.model import ATTENTION_IMPLS
from helpers.results import save_results

__all__ = [
    # attention_impls
    "PASSES",
    "inputs",
    "compiled_naive",
    "attention_fn",
    "pass_steps",
    # attention_bench
    "bench_attention",
    "sweep",
    "TILED_STEPS",
    "check_physical_bounds",
    # attention_memory
    "saved_bytes_formula",
    "saved_memory",
    # attention_checks
    "TOL",
    "online_softmax",
    "backward_from_lse",
    "naive_grads",
    "check_function",
    "run_kernel",
    "KERNELS",
    "check_kernel",
    # attention_model
    "MODEL_TOL",
    "TINY",
    "tiny_model_outputs",
    "check_model_outputs",
    "compare_models",
    # attention_leaderboard
    "LEADERBOARD",
    "PUBLISHED_MS",
    "compare_impls",
    "leaderboard_comparison",
    "plot_leaderboard_marks",
    "leaderboard_mark_table",
    # attention_sections and attention_bench_sections: one call per notebook section
    "Setup",
    "fit_card",
    "naive_times",
    "naive_memory",
    "naive_shapes",
    "compile_ratios",
    "online_softmax_check",
    "backward_check",
    "function_checks",
    "kernel_checks",
    "checks_summary",
    "benchmark",
    "tflops",
    "yours_against_ours",
    "memory_curves",
    "model_outputs",
    "model_steps",
    "leaderboard",
    "leaderboard_marks",
    # here
    "PROFILES",
    "setup",
    "bench_main",
]

PROFILES = {  # what notebook 06 measures per profile
    "gpu": dict(
        batch=8,
        head_dims=[16, 32, 64, 128],
        seq_lens=[256, 1024, 4096, 8192, 16384],
        naive_max_flops=None,  # §1 runs the whole grid; an out-of-memory error is recorded as a row
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
        batch=8,  # §1: the handout's grid (pytorch_attention: batch 8, d 16-128, T 256-16,384) ...
        head_dims=[16, 32, 64, 128],
        seq_lens=[256, 1024, 4096, 8192, 16384],
        naive_max_flops=2e9,  # ... where one forward+backward is at most 2 GFLOP (d 16-128 at T 256, d 16 at 1024)
        warmup=2,
        steps=6,  # timing.MIN_PAIRS
        compile_shape=(8, 1, 256, 64),  # one configuration of §1's grid, as torch_compile(a) asks
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


def setup(profile: str = "auto") -> Setup:
    """Notebook 06's set-up: `profile` ("auto" | "cpu" | "gpu") resolved, the device, what it measures (PROFILES)."""
    return Setup.resolve(profile, PROFILES)


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
