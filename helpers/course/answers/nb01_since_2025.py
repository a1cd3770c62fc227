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
from helpers.experiments.benchmarking_attention import MEMORY_BOUND_FACTOR
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
        section="§2 Profiler tables and §3 Flame graph (softmax against the matmuls around it)",
        reads=("01_profile", "01_flame", "01_timing", "01_attention_parts"),
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
    within = attention_parts_sentence(saved)
    on_gpu = saved.run("01_profile").provenance.get("device_type") == "cuda"
    where = (
        "The torch profiler's CUDA kernels, as nsys would list them"
        if on_gpu
        else "Torch profiler standing in for nsys (no GPU here)"
    )
    text = (
        f"{where}, {size}: the leading op per stage is {lead}. "
        f"{within} Over the whole step, "
        f"softmax takes {pct(soft)} while doing about {softmax_flops / matmul_flops:.2%} of the forward's FLOPs, "
        f"and matmuls take {pct(mm)} of the step."
    )
    return (
        text
        if on_gpu
        else Answer(text, status="partial", missing="nsys with NVTX ranges on a GPU; the torch profiler stands in")
    )


def attention_parts_sentence(saved) -> str:
    """Part (e): inside attention's forward, softmax's measured time against QKᵀ and PV's (notebook 01 §3's
    01_attention_parts: the three ops timed alone at the model's shapes, interleaved), beside their FLOP ratio."""
    run = saved.run("01_attention_parts")
    rows = run.frame().set_index("op")
    r = rows.loc["softmax / (QKᵀ + PV)"]
    prov = run.provenance
    return (
        f"Within self-attention's forward ({prov.get('size')}, batch {prov.get('batch')} x context "
        f"{prov.get('context')}, each op timed alone), softmax does {r['flop_ratio']:.1%} of the FLOPs of the QKᵀ "
        f"and PV matmuls yet takes {r['ratio']:.2f}x their time (95% CI {r['ratio_low']:.2f}-{r['ratio_high']:.2f}, "
        f"{int(r['pairs'])} pairs; QKᵀ {rows.loc['QKᵀ', 'median_s'] * 1e3:.3g} ms, softmax "
        f"{rows.loc['softmax', 'median_s'] * 1e3:.3g} ms, PV {rows.loc['PV', 'median_s'] * 1e3:.3g} ms)"
        + (
            ": time follows the bytes moved, not the FLOPs, for an elementwise op that touches every score."
            if r["ratio_low"] > MEMORY_BOUND_FACTOR * r["flop_ratio"]
            else "."
        )
    )
