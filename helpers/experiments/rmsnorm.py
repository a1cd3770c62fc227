"""Notebook 02's experiments: every RMSNorm implementation (and LayerNorm, torch.compile) timed on (rows, H) against
the copy bandwidth, and inside the model; `python -m helpers bench rmsnorm`.

    bench_norm("triton", 50_000, 4096, torch.bfloat16, "cuda", backward=True)   # a row: time, GB/s, fraction of copy
    bench_model("small/cpu", norm="rmsnorm_triton")                               # the model's fwd and fwd+bwd
    check_against_spec(RMSNormTritonFunction.apply, (2, 3, 37), torch.bfloat16)  # y, dx, dg within TOL[dtype]
    python -m helpers bench rmsnorm --rows 50000 --hidden 1024 4096 --dtype bfloat16

The code, one idea per module (all importable from here, as the notebook, the tests and helpers.course use it):
    rmsnorm_checks   tolerances, the spec's inputs, any f(x, g) against the spec, the norms in a tiny model
    rmsnorm_bench    the norms by name, the copy yardstick and its bound, one norm timed alone on (rows, H)
    rmsnorm_compare  every norm and the copy in one interleaved loop per shape; the sentences and answer rows
    rmsnorm_model    the norms inside the model: timed, swapped in one loop, eager vs torch.compile
    rmsnorm_sections the notebook's sections 1-3, one call each returning a Result (helpers.section)
    rmsnorm_speed    sections 4 and 5: bandwidth vs copy, the published mark, the fastest, torch.compile
and here: PROFILES, setup (the notebook's profile, device and budget) and `python -m helpers bench rmsnorm`.
"""

from __future__ import annotations

import argparse

import pandas as pd
import torch

from helpers.experiments.common import positive_int
from helpers.experiments.rmsnorm_bench import (
    MAX_FRACTION_OF_COPY,
    NORM_FUNCTIONS,
    bench_kernels,
    bench_norm,
    check_fraction_of_copy,
    copy_bandwidth,
    norm_function,
    triton_timing_note,
)
from helpers.experiments.rmsnorm_checks import (
    DERIVED_TOL,
    GRADCHECK,
    LOSS_TOL,
    RRMS_TOL,
    TINY,
    TOL,
    check_against_spec,
    check_model_norms,
    fwd_bwd,
    spec_inputs,
    tiny_model_runs,
)
from helpers.experiments.rmsnorm_compare import (
    COPY,
    PASSES,
    check_forward_le_both,
    compare_shape,
    compare_shapes,
    fastest_lines,
    ratio_lines,
    ratio_rows,
)
from helpers.experiments.rmsnorm_model import (
    COMPILE_PASSES,
    STEP,
    bench_model,
    compare_compiled,
    compare_model_norms,
    compiled_lines,
    model_lines,
    plan_model_norms,
)
from helpers.experiments.rmsnorm_sections import (
    PYTORCH_NORMS,
    TRITON_LEFT_OUT,
    Bandwidth,
    Setup,
    Timed,
    fit_card,
    gradients_section,
    kernels_at,
    model_norms,
    model_section,
    shapes_section,
    spec_section,
    triton_timed,
    where,
)
from helpers.experiments.rmsnorm_speed import (
    TARGETS,
    bandwidth_mark_table,
    bandwidth_section,
    compile_section,
    fastest_section,
    fraction_of_copy_figure,
    mark_section,
    plot_bandwidth_mark,
)

__all__ = [
    # rmsnorm_checks
    "TOL",
    "DERIVED_TOL",
    "GRADCHECK",
    "RRMS_TOL",
    "LOSS_TOL",
    "TINY",
    "spec_inputs",
    "fwd_bwd",
    "check_against_spec",
    "tiny_model_runs",
    "check_model_norms",
    # rmsnorm_bench
    "NORM_FUNCTIONS",
    "norm_function",
    "copy_bandwidth",
    "MAX_FRACTION_OF_COPY",
    "check_fraction_of_copy",
    "bench_norm",
    "triton_timing_note",
    "bench_kernels",
    # rmsnorm_compare
    "PASSES",
    "COPY",
    "compare_shape",
    "compare_shapes",
    "check_forward_le_both",
    "ratio_lines",
    "ratio_rows",
    "fastest_lines",
    # rmsnorm_model
    "COMPILE_PASSES",
    "STEP",
    "bench_model",
    "plan_model_norms",
    "compare_model_norms",
    "model_lines",
    "compare_compiled",
    "compiled_lines",
    # rmsnorm_sections: notebook 02's sections 1-3, one Result each
    "PYTORCH_NORMS",
    "TRITON_LEFT_OUT",
    "Setup",
    "Timed",
    "Bandwidth",
    "fit_card",
    "where",
    "kernels_at",
    "triton_timed",
    "model_norms",
    "shapes_section",
    "model_section",
    "gradients_section",
    "spec_section",
    # rmsnorm_speed: sections 4 and 5
    "TARGETS",
    "bandwidth_section",
    "fraction_of_copy_figure",
    "plot_bandwidth_mark",
    "bandwidth_mark_table",
    "mark_section",
    "fastest_section",
    "compile_section",
    # here
    "PROFILES",
    "setup",
    "bench_main",
]

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


def setup(profile: str = "auto", budget="auto") -> Setup:
    """Notebook 02's set-up: the profile resolved (its sizes: PROFILES), the machine's device, the time budget."""
    return Setup.resolve(profile, budget, PROFILES)


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
