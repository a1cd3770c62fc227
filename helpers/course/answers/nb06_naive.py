"""Notebook 06 §1's questions (the 2025 edition's pytorch_attention and torch_compile, kept by 2026) and their answers:
naive attention on the handout's grid, the smallest configuration that runs out of memory, torch.compile of attention
(notebook 06) and of the whole model (notebook 02 §5's loop)."""

from __future__ import annotations

import itertools

import pandas as pd
import torch

from helpers import attention as A
from helpers.course.answers.core import (
    ANSWERS,
    Answer,
    NotMeasured,
    Question,
    answers,
    cap,
    compare_text,
    coverage,
    fmt_mib,
    fmt_s,
    register,
    series_text,
    short_of,
)
from helpers.course.answers.nb02 import COMPILE_LIMIT
from helpers.experiments.rmsnorm_model import STEP
from helpers.model import ARCH_NAMES, size_edition
from helpers.timing import ratio_of

BOTH = (2025, 2026)  # "Attention and FlashAttention-2 as in 2025"
HANDOUT_GRID = dict(batch=8, head_dims=(16, 32, 64, 128), seq_lens=(256, 1024, 4096, 8192, 16384))

Q = Question
QUESTIONS = [
    Q(
        "pytorch_attention(a)",
        "Naive attention, batch 8 and one head, per head dim and sequence length: how long do "
        "forward and backward take, and where does it run out of memory?",
        notebook="06",
        section="§1 Naive attention's cost",
        reads=("06_naive_attention",),
        editions=BOTH,
        name="pytorch_attention",
        gpu="The handout's grid (batch 8, d 16-128, T 256-16,384) runs on a GPU: `make writeup PROFILE=gpu`.",
    ),
    Q(
        "pytorch_attention(b)",
        "How much memory does the smallest configuration keep for backward, how does it grow "
        "with the sequence, and what removes it?",
        notebook="06",
        section="§1 and §5 Memory",
        reads=("06_naive_memory", "06_naive_attention"),
        editions=BOTH,
        name="pytorch_attention",
        gpu="Carries over exactly: the bytes are the same arithmetic on any device (checked byte for byte here).",
    ),
    Q(
        "torch_compile(a)",
        "Is torch.compile of naive attention faster than the eager version?",
        notebook="06",
        section="§1 torch.compile",
        reads=("06_compile_ratios",),
        editions=BOTH,
        name="torch_compile",
        gpu="Inductor emits C++ loops for a CPU and Triton kernels for a GPU: `make writeup PROFILE=gpu` times the "
        "GPU case.",
    ),
    Q(
        "torch_compile(b)",
        "Is the whole model faster compiled, forward and forward+backward+optimizer?",
        notebook="02",
        section="§5 torch.compile of the whole model",
        reads=("rmsnorm_model_ratios",),
        editions=BOTH,
        name="torch_compile",
        gpu="Fusion there saves memory traffic and kernel launches; the gain is usually larger.",
    ),
]
register(QUESTIONS)


def _configs(pairs) -> str:
    """(d, T) pairs grouped by length: "d 16, 32, 64, 128 at T 256; d 16 at T 1,024" ("every d" where all of the
    handout's head dims are there)."""
    by_T = {T: sorted(d for d, t in pairs if t == T) for T in sorted({t for _, t in pairs})}
    every = sorted(HANDOUT_GRID["head_dims"])
    return "; ".join(
        f"{'every d' if ds == every else 'd ' + ', '.join(map(str, ds))} at T {T:,}" for T, ds in by_T.items()
    )


def grid_cut(t: pd.DataFrame, provenance: dict) -> tuple[str, str]:
    """What of the handout's grid (batch 8, HANDOUT_GRID) the saved 06_naive_attention rows cover, an out-of-memory
    row counting as run: (a sentence naming the configurations that ran, what is missing: "" when none)."""
    B = HANDOUT_GRID["batch"]
    grid = [(d, T) for d in HANDOUT_GRID["head_dims"] for T in HANDOUT_GRID["seq_lens"]]
    ran = {(int(d), int(T)) for b, d, T in zip(t["batch"], t["d"], t["T"], strict=True) if int(b) == B}
    missing = [c for c in grid if c not in ran]
    other = sorted({int(b) for b in t["batch"]} - {B})
    said = (
        f"Ran {len(grid) - len(missing)} of the handout's {len(grid)} configurations (batch {B}, one head, fp32, not "
        "causal)" + (f": {_configs([c for c in grid if c in ran])}" if len(missing) < len(grid) else "")
    )
    said += f"; also at batch {', '.join(map(str, other))}, outside the handout's grid." if other else "."
    if not missing:
        return said, ""
    max_flops = (provenance.get("grid") or {}).get("max_flops")
    why = (
        f"the cpu profile times only the configurations of at most {max_flops / 1e9:g} GFLOP per forward+backward"
        if max_flops
        else "this run's grid did not include them"
    )
    which = "other " if len(missing) < len(grid) else ""
    return said, (
        f"the handout's {which}{len(missing)} configurations ({_configs(missing)}): {why}; `make writeup "
        "PROFILE=gpu` times the whole grid, recording an out-of-memory error as a row"
    )


def _growth_line(d, part) -> str:
    """forward+backward at the shortest and longest length timed for one head dim, and the growth between them."""
    lo, hi = part.index.min(), part.index.max()
    first = f"d {d}: forward+backward {fmt_s(part.loc[lo, 'fwd+bwd'])} at T {lo:,}"
    if lo == hi:
        return first
    grew = part.loc[hi, "fwd+bwd"] / part.loc[lo, "fwd+bwd"]
    return (
        f"{first}, {fmt_s(part.loc[hi, 'fwd+bwd'])} at T {hi:,}: {grew:.0f}x for {hi // lo}x the length "
        f"({(hi // lo) ** 2}x the T² scores)"
    )


@answers("pytorch_attention(a)")
def naive_times(q, saved):
    run = saved.run("06_naive_attention")
    t = run.frame()
    oom = t[t["oom"].astype(bool)]
    per = t.pivot_table(index=["d", "T"], columns="pass", values="median_s", dropna=False)  # NaN: out of memory
    per = per.reindex(index=sorted({(int(d), int(T)) for d, T in zip(t["d"], t["T"], strict=True)}))
    lines, flat = [], []
    for d in sorted(set(per.index.get_level_values("d"))):
        part = per.loc[d].dropna(subset=["fwd+bwd"])
        if part.empty:
            continue
        if not part["fwd+bwd"].is_monotonic_increasing:
            flat.append(str(d))
        lines.append(_growth_line(d, part))
    shown = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward+backward"}
    rows = [
        {"d": d, "T": T, **{n: "out of memory" if pd.isna(r[p]) else fmt_s(r[p]) for p, n in shown.items()}}
        for (d, T), r in per.iterrows()
    ]
    said, missing = grid_cut(t, run.provenance)
    where = (
        f"It ran out of memory first at T {int(oom['T'].min()):,} (d {int(oom.sort_values('T')['d'].iloc[0])})."
        if len(oom)
        else "Nothing ran out of memory here; pytorch_attention(b) counts where a GPU's memory runs out."
    )
    B, d, T = HANDOUT_GRID["batch"], max(HANDOUT_GRID["head_dims"]), max(HANDOUT_GRID["seq_lens"])
    kept = B * T * T * 4 + B * T * d * 4  # P + O, fp32 (experiments.attention.saved_bytes_formula)
    noise = (
        f" For d {', '.join(flat)} a longer sequence was not always slower: there the machine's load, not "
        "attention, set the times (rerun notebook 06 on a quiet machine)."
        if flat
        else ""
    )
    steps = run.provenance.get("steps")
    timed = f"median of {steps} timed passes after {run.provenance.get('warmup')} warm-up" if steps else "median"
    text = (
        f"{said} Forward, backward and both, {timed} (the handout times 100): " + "; ".join(lines) + f".{noise} "
        f"{where} For the handout's largest shape (batch {B}, T {T:,}, d {d}) the forward alone keeps P + O = "
        f"{fmt_mib(kept / 2**20)} for backward, before backward's own T × T gradients. Every timing:"
    )
    return Answer(text, table=tuple(rows), status="partial" if missing else "", missing=missing)


def _accounting(shape, device: str, device_bytes: float) -> str:
    """The handout's memory accounting of naive attention on (B, 1, T, d), fp32, against one device's memory."""
    from helpers.experiments.gpu_plans import naive_pass_bytes

    B, _, T, d = shape
    S, X = A.score_matrix_bytes(B, T, T, torch.float32), B * T * d * 4
    peak = naive_pass_bytes(shape)
    return (
        f"batch {B}, T {T:,}, d {d}, fp32: q, k and v take {fmt_mib(X / 2**20)} each; the scores S = QKᵀ/√d and "
        f"P = softmax(S) are B·T²·4 = {fmt_mib(S / 2**20)} each (S is freed once P exists); the forward keeps P and "
        f"O ({fmt_mib(X / 2**20)}) for backward, {fmt_mib((S + X) / 2**20)}, the bytes notebook 06 checks byte for "
        f"byte at the shapes it runs; backward adds dP and dS, {fmt_mib(S / 2**20)} each. Our benchmark's peak, with "
        f"the graph it keeps to time the backward alone, is 4 such T × T matrices and 7 (B, T, d) tensors at once, "
        f"{fmt_mib(peak / 2**20)} (gpu_plans.naive_pass_bytes, the memory tracker's peak on a CPU): "
        + (
            f"more than {device}'s {fmt_mib(device_bytes / 2**20)}"
            if peak > device_bytes
            else f"within {device}'s {fmt_mib(device_bytes / 2**20)} by this count, so the CUDA context, the "
            "allocator's cache and fragmentation took the rest"
        )
    )


def _first_oom_table(B: int) -> tuple:
    """Per card of formulas.plans.LEADERBOARD_GPUS: the first configuration of the handout's grid (or past it) whose
    benchmark peak exceeds its memory."""
    from helpers.experiments.gpu_plans import naive_pass_bytes, smallest_naive_oom
    from helpers.formulas.plans import LEADERBOARD_GPUS

    rows = []
    for gpu, spec in LEADERBOARD_GPUS.items():
        shape = smallest_naive_oom(B, HANDOUT_GRID["head_dims"], HANDOUT_GRID["seq_lens"], spec["memory"])
        rows.append(
            {
                "GPU": gpu,
                "first out of memory (fp32)": f"batch {B}, T {shape[2]:,}, d {shape[3]}",
                "in the handout's grid": "yes" if shape[2] in HANDOUT_GRID["seq_lens"] else "no: past T 16,384",
                "peak": fmt_mib(naive_pass_bytes(shape) / 2**20),
                "memory": fmt_mib(spec["memory"] / 2**20),
            }
        )
    return tuple(rows)


@answers("pytorch_attention(b)")
def naive_memory(q, saved):
    from helpers.experiments.gpu_plans import naive_pass_bytes, smallest_naive_oom
    from helpers.formulas.plans import LEADERBOARD_GPUS

    m = saved.frame("06_naive_memory")
    ran = m[~m["oom"].astype(bool)].sort_values(["T", "d"])
    if not (ran["saved_bytes"] == ran["formula_bytes"]).all():
        raise NotMeasured("the saved memory does not match its formula")
    d0 = ran[ran["d"] == ran["d"].min()].set_index("T")["saved_bytes"]
    growth = ", ".join(
        f"T {a:,}→{b:,}: {d0[b] / d0[a]:.2f}x, against {(b // a) ** 2}x for P alone"
        for a, b in itertools.pairwise(d0.index)
    )
    d_min = int(ran["d"].min())
    grows = (
        f"With the sequence it grows towards the square of the length's growth as P takes over (d {d_min}: {growth}); "
        if growth
        else ""
    ) + "measured by the memory tracker for every configuration that ran, equal to P + O byte for byte."
    removes = (
        " FlashAttention removes it: it never stores P, keeps O and one logsumexp per row, and recomputes the scores "
        "tile by tile in backward, so what it keeps grows as O(T) (§5 measures both)."
    )
    run = saved.run("06_naive_attention")
    t, B = run.frame(), HANDOUT_GRID["batch"]
    oom = t[t["oom"].astype(bool) & (t["batch"] == B)]
    grid = (B, HANDOUT_GRID["head_dims"], HANDOUT_GRID["seq_lens"])
    largest = (B, 1, max(HANDOUT_GRID["seq_lens"]), max(HANDOUT_GRID["head_dims"]))
    h100 = LEADERBOARD_GPUS["H100 80 GB"]["memory"]
    if run.provenance.get("device_type") == "cuda":  # measured: the grid ran here, an OOM recorded as a row
        device, memory = f"this {run.provenance.get('device', 'GPU')}", run.provenance.get("device_bytes")
        device, memory = (device, memory) if memory else ("an 80 GB H100", h100)  # a run saved before device_bytes
        if len(oom):
            shape = min(((B, 1, int(T), int(d)) for d, T in zip(oom["d"], oom["T"], strict=True)), key=naive_pass_bytes)
            head = f"The smallest configuration that ran out of memory on {device}: "
        else:
            shape = smallest_naive_oom(*grid, memory)
            head = (
                f"Nothing of the handout's grid ran out of memory on {device}; counted against its memory, the "
                "first configuration that would is past the grid: "
            )
        return head + _accounting(shape, device, memory) + ". " + cap(grows) + removes
    text = (
        "Nothing runs out of memory on this CPU, so the smallest configuration that would is counted, not observed. "
        f"On an 80 GB H100 (2025's GPU) the whole handout grid fits (its largest, batch {B}, T {largest[2]:,}, d "
        f"{largest[3]}, peaks at {fmt_mib(naive_pass_bytes(largest) / 2**20)}); the first to run out is "
        + _accounting(smallest_naive_oom(*grid, h100), "the H100", h100)
        + ". Per card, below. "
        + cap(grows)
        + removes
    )
    return Answer(
        text,
        table=_first_oom_table(B),
        status="partial",
        missing="the out-of-memory error itself, observed on a GPU (`make writeup PROFILE=gpu` records it per "
        "configuration); here it is counted from the bytes notebook 06 measures",
    )


@answers("torch_compile(a)")
def compiled_attention(q, saved):
    r = saved.frame("06_compile_ratios")
    r = r[r["label"] == "compiled"]
    parts, faster = [], []
    for row in r.to_dict("records"):
        ratio = ratio_of(row)
        parts.append(f"{row['pass']}: " + compare_text("compiled", "eager naive", ratio, f"{row['pass']} time"))
        faster.append(ratio.differs and ratio.median < 1)
    shape = saved.run("06_compile_ratios").provenance.get("shape")
    grid = [(dh, t) for dh in HANDOUT_GRID["head_dims"] for t in HANDOUT_GRID["seq_lens"]]
    short_of(  # notebook 06 compiles one shape; the handout asks its whole grid
        f"configurations: 1 of the handout's {len(grid)} (batch {HANDOUT_GRID['batch']}, head dims "
        f"{', '.join(map(str, HANDOUT_GRID['head_dims']))} × sequence lengths "
        f"{', '.join(map(str, HANDOUT_GRID['seq_lens']))}) ran, at shape {shape}"
    )
    gpu = (
        "Compiled was measurably faster here; on a GPU inductor fuses the scale, mask and softmax into Triton "
        "kernels around the two matmuls, which usually helps more, but the T × T matrices remain."
        if all(faster)
        else "Compiled was not measurably faster here in every pass; on a GPU inductor's fused Triton softmax usually "
        "helps, though the T × T matrices remain: `make writeup PROFILE=gpu` measures it."
    )
    return Answer(f"Shape (B, H, T, d) = {shape}, interleaved: " + "; ".join(parts) + ".", gpu)


COMPILED_PASSES = {  # the passes of notebook 02 §5 (rmsnorm_model.COMPILE_PASSES) torch_compile(b) asks: label, time
    "fwd": ("Forward", "forward time"),
    STEP: ("The training step (forward, backward and AdamW's step; the optimizer eager in both)", "training step time"),
}


@answers("torch_compile(b)")
def compiled_model(q, saved):
    """Notebook 02 §5's whole-model loop, eager against compiled: the forward and the training step with the
    optimizer's step (2025/2026 ask both); a run saved before the step was timed answers forward+backward, partial."""
    r = saved.frame("rmsnorm_model_ratios")
    r = r[r["loop"] == "compile"]
    names = {"True": "compiled model", "False": "eager model"}
    sizes = coverage(list(r["size"]), saved.profile, limit=COMPILE_LIMIT)
    if STEP not in set(r["pass"]):
        return Answer(
            ANSWERS["2.3.1(c)"](q, saved),
            status="partial",
            missing="the training step with AdamW's step, compiled against eager: this run of notebook 02 timed "
            "forward and forward+backward only (rerun it: §5 times the whole step)",
        )
    parts = [
        f"{label}: " + series_text(r[r["pass"] == p], "True", "False", "size", names, what)
        for p, (label, what) in COMPILED_PASSES.items()
    ]
    text = ". ".join(parts) + sizes + "."
    ran = sorted({size_edition(s) for s in r["size"]})
    if ran != ["2024"]:
        return text
    return Answer(  # notebook 02 builds the 2024 model (its 2.1.5 compares norms in it); 2025/2026 ask theirs
        text + f" Measured on the 2024 edition's model ({ARCH_NAMES['gpt']}) with RMSNorm.",
        status="partial",
        missing=f"the handout's own model ({ARCH_NAMES['basics']}): notebook 02 compiles the 2024 model",
    )
