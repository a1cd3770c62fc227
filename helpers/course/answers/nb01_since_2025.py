"""Notebook 01's questions new in the 2025 edition (mixed_precision_accumulation, nsys_profile) and their answers;
the profiler's tables are read as nb01 reads them."""

from __future__ import annotations

from helpers import formulas
from helpers.course.answers.core import (
    Answer,
    Question,
    answers,
    pct,
    register,
)
from helpers.course.answers.nb01 import flame_shares, profile_table
from helpers.model import get_config

Q = Question
QUESTIONS = [
    Q(
        "mixed_precision_accumulation",
        "0.01 added a thousand times into fp32, fp16, and fp32 fed fp16 values (cast up "
        "or not): what does each give, and why?",
        notebook="01",
        section="§4 Mixed precision: accumulating in 16 bits",
        reads=(),
        editions=(2025,),
        name="mixed_precision_accumulation",
        gpu="Carries over exactly: scalar IEEE rounding is the same on every device (computed here, not timed).",
    ),
    Q(
        "nsys_profile",
        "Forward, backward and optimizer per size: which kernels dominate, and how does softmax's time "
        "compare with the matmuls' against their FLOPs?",
        notebook="01",
        section="§2 Profiler tables and §3 Flame graph",
        reads=("01_profile", "01_flame", "01_timing"),
        editions=(2025,),
        name="nsys_profile",
        gpu="nsys needs a GPU; here the torch profiler stands in with CPU op times. On a GPU: `nsys profile --trace="
        "cuda,nvtx python -m helpers writeup --profile gpu notebooks/01_benchmarking_and_profiling.ipynb` (its "
        "profiler tables then list CUDA kernels).",
    ),
]
register(QUESTIONS)


@answers("mixed_precision_accumulation")
def accumulation(q, saved):
    from helpers.experiments.benchmarking import accumulation_demo, accumulation_text

    acc = accumulation_demo()
    values = "; ".join(f"{case}: {v:.10g}" for case, v in acc["value"].items())
    return (
        f"{values} (the answer should be 10). "
        + accumulation_text(acc).replace("\n", " ")
        + " Hence master weights, optimizer state and reductions stay in fp32, and tensor cores accumulate "
        "16-bit products in fp32."
    )


@answers("nsys_profile")
def kernels_and_softmax(q, saved):
    share = {run: profile_table(saved, run).iloc[0] for run in ("forward", "forward+backward", "full step")}
    lead = "; ".join(f"{run}: {r['op']} {pct(r['share'])}" for run, r in share.items())
    f = flame_shares(saved)
    size = saved.run("01_flame").provenance.get("size")
    cfg, T = get_config(size), int(saved.run("01_timing").provenance["context"])  # one context for the notebook
    softmax_flops = 5 * cfg.n_heads * T * T * cfg.n_layers  # ~5 per score element (max, sub, exp, sum, div), per seq
    matmul_flops = sum(formulas.forward_flops(cfg, 1, T).values())
    soft = float(f.loc["softmax", "share"])
    mm = profile_table(saved, "full step")["matmul_share"].iloc[0]
    # within self-attention's forward: softmax (~5 FLOPs per score) against QKᵀ and PV (2·T²·d_head each, per head)
    attn_flop_ratio = 5 / (4 * cfg.head_dim)
    fwd = profile_table(saved, "forward").set_index("op")["share"]
    soft_fwd = float(fwd[[o for o in fwd.index if "softmax" in o]].sum())
    bmm_fwd = float(fwd.get("aten::bmm", 0.0))  # QKᵀ and PV: the model's only batched (4-D) matmuls
    within = (
        f"Within self-attention's forward, softmax does {attn_flop_ratio:.1%} of the FLOPs of the QKᵀ and PV "
        f"matmuls (5 per score against 4·d_head = {4 * cfg.head_dim}) yet takes {soft_fwd / bmm_fwd:.2f}x their "
        f"time here ({pct(soft_fwd)} against {pct(bmm_fwd)} of the forward)"
        if soft_fwd and bmm_fwd
        else f"Within self-attention's forward, softmax does {attn_flop_ratio:.1%} of the FLOPs of the QKᵀ and PV "
        f"matmuls (5 per score against 4·d_head = {4 * cfg.head_dim}) yet takes more time: {pct(soft_fwd)} of the "
        f"forward, while aten::bmm (QKᵀ and PV together) falls below the smallest op saved ({pct(fwd.min())})"
        if soft_fwd and soft_fwd > fwd.min()
        else f"Within self-attention's forward, softmax does {attn_flop_ratio:.1%} of the FLOPs of the QKᵀ and PV "
        "matmuls (5 per score against 4·d_head); their times are not both among the forward's saved top ops "
        "here, so the time ratio is not shown"
    )
    on_gpu = saved.run("01_profile").provenance.get("device_type") == "cuda"
    where = (
        "The torch profiler's CUDA kernels, as nsys would list them"
        if on_gpu
        else "Torch profiler standing in for nsys (no GPU here)"
    )
    text = (
        f"{where}, {size}: the leading op per stage is {lead}. "
        f"{within}: time follows bytes moved, not FLOPs, for the elementwise softmax. Over the whole step, "
        f"softmax takes {pct(soft)} while doing about {softmax_flops / matmul_flops:.2%} of the forward's FLOPs, "
        f"and matmuls take {pct(mm)} of the step."
    )
    return (
        text
        if on_gpu
        else Answer(text, status="partial", missing="nsys with NVTX ranges on a GPU; the torch profiler stands in")
    )
