"""What each later handout asks, problem by problem and part by part (read in the 2025 v1.0.4 and 2026 v26.1.3
handouts), and which of the page's answers covers each part: the maps are built from this, so a map lists every part
its handout has and none it does not.

    parts(2026)                      # [("benchmarking_script", "a"), ..., ("leaderboard", "")]
    covering(2026)                   # {("tp_calcs", "d"): ["tp_calcs(b)"], ...}
"""

from __future__ import annotations

from helpers.course.answers.core import PROBLEMS, QUESTIONS, Question

_COMMON = {  # in both later handouts, in their order; "" where the problem has no lettered parts
    "benchmarking_script": "abc",
    "nsys_profile": "abcde",
    "mixed_precision_accumulation": "",
    "benchmarking_mixed_precision": "abc",
    "memory_profiling": "abcde",
}
_ATTENTION = {
    "pytorch_attention": "a",
    "torch_compile": "ab",
    "flash_forward": "abc",
    "flash_backward": "",
    "flash_benchmarking": "a",
}
_DDP = {
    "distributed_communication_single_node": "",
    "naive_ddp": "",
    "naive_ddp_benchmarking": "",
    "minimal_ddp_flat_benchmarking": "",
    "ddp_overlap_individual_parameters": "",
    "ddp_overlap_individual_parameters_benchmarking": "ab",
}
PARTS: dict[int, dict[str, str]] = {
    2025: {
        **_COMMON,
        **_ATTENTION,
        "leaderboard": "",  # the FlashAttention-2 leaderboard (a section, not a numbered problem)
        **_DDP,
        "ddp_overlap_bucketed": "",
        "ddp_bucketed_benchmarking": "ab",
        "communication_accounting": "abcd",
        "optimizer_state_sharding": "",
        "optimizer_state_sharding_accounting": "abc",
    },
    2026: {
        **{**_COMMON, "memory_profiling": "abcdef"},
        "gradient_checkpointing": "ab",
        **_ATTENTION,
        **_DDP,
        "optimizer_state_sharding": "",
        "optimizer_state_sharding_accounting": "abc",
        "fsdp": "",
        "fsdp_accounting": "ab",
        "alternate_ring_all_reduce": "",
        "data_parallel_calcs": "abc",
        "fsdp_calcs": "abc",
        "tp_calcs": "abcd",
        "fsdp_tp_calcs": "abcd",
        "leaderboard": "",
    },
}
IMPLEMENTATIONS = {  # parts that ask for code only: no written answer; `python -m helpers yours` checks a student's
    "naive_ddp",
    "ddp_overlap_individual_parameters",
    "ddp_overlap_bucketed",
    "optimizer_state_sharding",
}
# 2024 parts the later handouts renumber (benchmarking_mixed_precision: (a) dtypes, (b) the norm, (c) time)
LATER_LETTERS = {"2.1.4(a)": "c", "2.1.4(b)": "a", "2.1.4(c)": "b"}
COVERS = {  # answers that cover other parts than their own number says (one answer for several parts, or renamed)
    "pytorch_attention(b)": "a",  # the handout's one part asks both; the page answers it in two
    "data_parallel_calcs": "abc",
    "fsdp_calcs": "abc",
    "tp_calcs(a)": "abc",  # the backward's equations, with the FLOPs and the communication of both passes
    "tp_calcs(b)": "d",  # how large N_TP can become
    "nsys_profile": "bde",  # the leading kernel per stage, the full step's matmul share, softmax against matmuls
    "flash_benchmarking": "a",
}
RENAMED = {  # 2024 answers that cover a part a later handout asks under another problem's name
    "2.1.2(a)": ("nsys_profile", "a"),  # the profiled forward against the timed one
    "2.1.2(c)": ("nsys_profile", "c"),  # the kernels besides matmuls
}

OWN_EDITION_ONLY = {  # problems whose name a later handout reuses for another question: answered only in their edition
    "2.3.1",  # 2024's torch_compile compiles RMSNorm; 2025/2026's compiles attention and the whole model
    "2025 leaderboard",  # each edition's leaderboard is its own (FlashAttention-2; the 2026 training run)
    "2026 leaderboard",
}


def parts(year: int) -> list[tuple[str, str]]:
    """Every (problem, letter) the edition's handout asks, in its order; letter "" for a problem without parts."""
    return [(p, letter) for p, letters in PARTS[year].items() for letter in (letters or [""])]


def covers(q: Question, year: int) -> list[tuple[str, str]]:
    """The parts of the edition's handout that answer `q` covers (none when that handout does not ask it)."""
    if q.number in RENAMED:
        problem, letter = RENAMED[q.number]
        return [(problem, letter)] if letter in PARTS[year].get(problem, "") else []
    problem = q.name or PROBLEMS[q.group]
    if problem not in PARTS[year] or (q.group in OWN_EDITION_ONLY and year not in q.editions):
        return []
    if q.number in COVERS:
        letters = COVERS[q.number]
    elif q.number in LATER_LETTERS:
        letters = LATER_LETTERS[q.number]
    else:
        letters = q.number[-2] if q.number.endswith(")") else ""
    asked = PARTS[year][problem]
    return [(problem, letter) for letter in (letters or "") if letter in asked] or (
        [(problem, "")] if not letters and not asked else []
    )


def covering(year: int) -> dict[tuple[str, str], list[Question]]:
    """Each part of the edition's handout -> the answers that cover it (empty: an implementation, or not answered)."""
    out = {part: [] for part in parts(year)}
    for q in QUESTIONS:
        for part in covers(q, year):
            out[part].append(q)
    return out
