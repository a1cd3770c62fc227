"""Notebook 06's FlashAttention-2 questions (the 2025 edition's, kept by 2026, and the 2025 leaderboard) and their
answers from what notebook 06 saved; naive attention and torch.compile (its §1) are nb06_naive's."""

from __future__ import annotations

import torch

from helpers import attention as A
from helpers.course.answers.core import (
    Answer,
    NeedsGPU,
    NotMeasured,
    Question,
    Reference,
    answers,
    compare_text,
    fmt_mib,
    fmt_s,
    register,
)
from helpers.course.answers.nb06_naive import BOTH
from helpers.published import MARKS
from helpers.timing import ratio_of

LEADERBOARD_CMD = "`python -m helpers bench attention` on an H100 (defaults: the leaderboard's shape, bf16, causal)"

Q = Question
QUESTIONS = [
    Q(
        "flash_forward(a)",
        "A tiled PyTorch FlashAttention-2 forward (online softmax, saves L): is it exact?",
        notebook="06",
        section="§2 The algorithm, step by step",
        reads=("06_checks",),
        editions=BOTH,
        name="flash_forward",
        gpu="Carries over: the same arithmetic; checked in float64 and float32 here.",
    ),
    Q(
        "flash_forward(b)",
        "The Triton forward kernel (grid of query tiles × batch, one loop over key tiles, fp32 "
        "on-chip buffers): does it match its spec?",
        notebook="06",
        section="§3 Triton kernels",
        reads=("06_checks",),
        editions=BOTH,
        name="flash_forward",
        gpu="Checked here in Triton's interpreter; `python -m helpers kernels` compiles it for sm_80/sm_90a "
        "(registers, spills); it is timed only on a GPU (`make writeup PROFILE=gpu`).",
    ),
    Q(
        "flash_forward(c)",
        "Causal masking inside the tile: is it right?",
        notebook="06",
        section="§3 Triton kernels",
        reads=("06_checks",),
        editions=BOTH,
        name="flash_forward",
        gpu="As (b): checked here in the interpreter, causal and not.",
    ),
    Q(
        "flash_backward",
        "The backward by recomputation from L with D = rowsum(dO ∘ O): is it exact?",
        notebook="06",
        section="§2 and §3",
        reads=("06_checks",),
        editions=BOTH,
        name="flash_backward",
        gpu="As flash_forward(b): the Triton backward kernels are checked here in the interpreter, timed on a GPU.",
    ),
    Q(
        "flash_benchmarking",
        "Forward, backward and end-to-end latency of the FlashAttention kernels against plain "
        "PyTorch attention, per sequence length, head dim and dtype (batch 1, causal)?",
        notebook="06",
        section="§4 Benchmarks",
        reads=("attention_bench",),
        editions=BOTH,
        name="flash_benchmarking",
        gpu="The Triton kernel is timed only on a GPU: `make writeup PROFILE=gpu`, or `python -m helpers bench "
        "attention --seq 128 1024 8192 65536 --head-dim 64`.",
    ),
    Q(
        "2025 leaderboard",
        "FlashAttention-2 forward+backward, bf16, causal, 16 heads × d 64, sequence 16,384 on one H100: how fast?",
        notebook="06",
        section="The leaderboard configuration",
        reads=("06_leaderboard",),
        editions=(2025,),
        name="leaderboard",
        gpu="Only on a GPU: " + LEADERBOARD_CMD + ".",
        references=(Reference.of(MARKS["leaderboard_2025_best"]), Reference.of(MARKS["leaderboard_2025_naive"])),
    ),
]
register(QUESTIONS)


def _checks(saved, *wanted: str):
    """The rows of 06_checks whose check names start with one of `wanted` (every check passed, or it saved none)."""
    c = saved.frame("06_checks")
    rows = [r for r in c.to_dict("records") if r["check"].startswith(wanted)]
    if not rows:
        raise NotMeasured(f"06_checks has no {' or '.join(wanted)} row")
    return rows


def _listed(rows) -> str:
    return "; ".join(f"{r['check']} ({r['detail']})" for r in rows)


@answers("flash_forward(a)")
def flash_pytorch(q, saved):
    rows = _checks(saved, "online softmax", "FlashAttentionPyTorch")
    return (
        "`helpers.attention.FlashAttentionPyTorch` loops over query tiles and, inside, key tiles, keeping a "
        "running max m, a rescaled running sum l and an unnormalised output; it returns O and saves L = m + log l "
        "(one number per row) with q, k, v and O. Checked in this run: " + _listed(rows) + "."
    )


@answers("flash_forward(b)", "flash_forward(c)")
def flash_triton(q, saved):
    rows = _checks(saved, "Triton forward", "FlashAttentionTriton")
    mode = saved.run("06_checks").provenance.get("triton_mode")
    what = (
        "`helpers.attention.attn_fwd_kernel`: one program per (query tile, batch·head), one loop over key tiles "
        "with fp32 accumulators on chip, P̃ cast to V's dtype before the second matmul"
        if q.number.endswith("(b)")
        else "Causal masking compares query and key indices inside the tile and sets masked scores to -1e6 (key tiles "
        "wholly above the diagonal are skipped)"
    )
    return f"{what}. Checked in this run (Triton {mode}), causal and not: " + _listed(rows) + "."


@answers("flash_backward")
def flash_backward(q, saved):
    rows = _checks(saved, "backward from L", "Triton backward", "FlashAttentionPyTorch", "FlashAttentionTriton")
    return (
        "The backward recomputes S = QKᵀ/√d and P = exp(S − L) tile by tile from the saved L, with D = rowsum(dO ∘ "
        "O) so that dS = P ∘ (dP − D); one kernel accumulates dK, dV over query tiles, another dQ over key tiles. "
        "Checked in this run: " + _listed(rows) + "."
    )


@answers("flash_benchmarking")
def flash_bench(q, saved):
    b = saved.frame("attention_bench")
    b = b[~b["oom"].astype(bool)]
    parts = []
    for (dtype, T, d), g in b.groupby(["dtype", "T", "d"]):
        per = g.pivot_table(index="impl", columns="pass", values="median_s")
        parts.append(
            f"{dtype} T {T} d {d}: "
            + ", ".join(
                f"{impl} {fmt_s(r['fwd'])} / {fmt_s(r['bwd'])} / {fmt_s(r['fwd+bwd'])}" for impl, r in per.iterrows()
            )
        )
    timed = set(b["impl"])
    triton = (
        ""
        if "flash_triton" in timed
        else " The Triton kernel was not timed on this machine (it runs in the interpreter here); "
        + q.gpu.split("only on a GPU: ")[-1]
    )
    text = (
        "Forward / backward / forward+backward medians, causal, from separate loops (a table, not a ranking; "
        "the paired comparison is the leaderboard's): " + "; ".join(parts) + "." + triton
    )
    return Answer(text, status="partial", missing="the Triton kernel timed on a GPU") if triton else text


@answers("2025 leaderboard")
def leaderboard_2025(q, saved):
    cfg = {"batch": 1, "heads": 16, "T": 16384, "d": 64}
    flops = sum(
        A.attention_flops(cfg["batch"] * cfg["heads"], cfg["T"], cfg["T"], cfg["d"], True, backward=bw)
        for bw in (False, True)
    )
    p_bytes = A.score_matrix_bytes(cfg["batch"] * cfg["heads"], cfg["T"], cfg["T"], torch.bfloat16)
    facts = (
        f"The configuration is {flops / 1e12:.2f} TFLOP per forward+backward (causal half) and naive attention's "
        f"P alone is {fmt_mib(p_bytes / 2**20)} in bf16."
    )
    if not saved.has("06_leaderboard"):
        raise NeedsGPU(f"{facts} It needs a GPU: run {LEADERBOARD_CMD}, or notebook 06 with PROFILE=gpu")
    lb = saved.frame("06_leaderboard").set_index("impl")
    best, naive = MARKS["leaderboard_2025_best"], MARKS["leaderboard_2025_naive"]
    ours = lb.loc["flash_triton"]
    vs = "; ".join(
        compare_text(impl, "flash_triton", ratio_of(row)) for impl, row in lb.iterrows() if impl != "flash_triton"
    )
    device = saved.run("06_leaderboard").provenance.get("device")
    return (
        f"On {device}: flash_triton {ours['median_ms']:.2f} ms ({ours['TFLOPs']:.0f} TFLOP/s), "
        f"{best.share(ours['median_ms']):.0%} of the best class entry's speed ({best.value:g} ms) and "
        f"{naive.value / ours['median_ms']:.1f}x faster than the published naive ({naive.value:g} ms). {vs}. " + facts
    )
