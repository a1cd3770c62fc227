"""Notebook 01's memory questions (2024's 2.4.1 and 2026's memory_profiling(f)) and their answers from what notebook
01 saved (peaks per size and pass, the timeline, the largest live tensors)."""

from __future__ import annotations

import math

import pandas as pd

from helpers import formulas
from helpers.course.answers.core import (
    Answer,
    NotMeasured,
    Question,
    Saved,
    answers,
    coverage,
    fmt_mib,
    pct,
    ref,
    register,
    short_of,
    span,
)
from helpers.course.answers.nb01 import ran_on
from helpers.experiments import benchmarking as XB
from helpers.experiments.benchmarking_sections_memory import handout_residual
from helpers.model import get_config

Q = Question
QUESTIONS = [
    Q(
        "2.4.1(a)",
        "How does memory move through a forward-only pass and through a full step?",
        notebook="01",
        section="§5 Memory",
        reads=("01_memory_peaks",),
        gpu="The shape of the timeline carries over; the CUDA caching allocator keeps its own reserve on top.",
    ),
    Q(
        "2.4.1(b)",
        "What is the peak memory per size, forward only and full step?",
        notebook="01",
        section="§5 Memory",
        reads=("01_memory_peaks",),
        gpu="Scales with the model: the reference sizes need GiB, not MiB.",
        references=ref("full-step peak: small 2.81 GiB, 2.7B 38.56 GiB (H100)"),
    ),
    Q(
        "2.4.1(c)",
        "Does mixed precision change the peak?",
        notebook="01",
        section="§5 Memory",
        reads=("01_memory_peaks",),
        gpu="Carries over: autocast keeps fp32 parameters and adds 16-bit copies on every device.",
        references=ref("2.7B with autocast: forward 14.63 GiB (from 10.07), full step 43.30 GiB (from 38.56) (H100)"),
    ),
    Q(
        "2.4.1(d)",
        "How large is the residual stream's activation?",
        notebook="01",
        section="§5 Memory",
        reads=("01_memory_peaks",),
        gpu="A formula: B·T·d_model·4 bytes on any device.",
        references=ref("20 MiB for 2.7B at batch 16 × context 128"),
    ),
    Q(
        "2.4.1(e)",
        "Which tensors are largest at the peak, and where were they allocated?",
        notebook="01",
        section="§5 Memory",
        reads=("01_largest_tensors",),
        gpu="The kinds of tensor carry over; their sizes scale with the model.",
        references=ref("100 MiB tensors: the 2.7B feed-forward weights (H100)"),
    ),
    Q(
        "memory_profiling(f)",
        "What does one TransformerBlock save for backward, which 5 ops contribute most and with "
        "what share, and how large are one block's gradients (the 2026 Table 1 sizes)?",
        notebook="01",
        section="§5 Memory",
        reads=("01_block_memory",),
        editions=(2026,),
        name="memory_profiling",
        gpu="The bytes are the same on every device (fp32, the same ops); the handout reads them from NVTX-labelled "
        "CUDA memory profiles.",
    ),
]
register(QUESTIONS)

# ---- 2.4 memory (notebook 01) ----------------------------------------------------------------------------------------


def _peaks(saved: Saved, precision: str = "fp32") -> pd.DataFrame:
    """01_memory_peaks: peak MiB per size, or per context where the edition profiles one model over its contexts
    (rows, in run order; "xl-2026/cpu, T = 32"), and pass (columns) for one precision."""
    p = saved.frame("01_memory_peaks")
    p = p[(p["precision"] == precision) & (p["status"] == "ok")]
    if p.empty:
        raise NotMeasured(f"01_memory_peaks has no {precision} rows")
    if saved.run("01_memory_peaks").provenance.get("memory_size"):
        p = p.assign(size=[f"{s}, T = {int(t)}" for s, t in zip(p["size"], p["context"], strict=True)])
    return p.pivot_table(index="size", columns="pass", values="peak_MiB", sort=False)


def _context_coverage(saved: Saved) -> str:
    """ "" unless the edition profiles one model over contexts and the budget left some out: then a clause naming
    them (the cpu profile runs the handout's contexts ÷ 4)."""
    prov = saved.run("01_memory_peaks").provenance
    edition = prov.get("edition")
    if not prov.get("memory_size") or edition not in XB.EDITIONS:
        return ""
    asked = XB.EDITIONS[edition].for_profile(saved.profile)["memory_contexts"]
    ran = {int(t) for t in saved.frame("01_memory_peaks")["context"]}
    left = [t for t in asked if t not in ran]
    if not left:
        return ""
    quarter = " (the handout's contexts ÷ 4 on the cpu profile)" if saved.profile == "cpu" else ""
    short_of(f"contexts: T = {', '.join(str(t) for t in asked if t in ran)} of {', '.join(map(str, asked))} ran")
    return (
        f" The time budget ran T = {', '.join(str(t) for t in asked if t in ran)} of {', '.join(map(str, asked))}"
        f'{quarter}; T = {", ".join(map(str, left))} needs BUDGET = "none" in notebook 01.'
    )


def _over(saved: Saved) -> str:
    """ "over the sizes", or "over the contexts" where one model was profiled at several."""
    return "over the contexts" if saved.run("01_memory_peaks").provenance.get("memory_size") else "over the sizes"


def _memory_contexts(saved: Saved) -> list[int]:
    """The contexts 01_memory_peaks profiled (its rows' own, where one model ran over several; else the run's)."""
    frame = saved.frame("01_memory_peaks")
    if "context" in frame and frame["context"].notna().any():
        return sorted({int(t) for t in frame["context"].dropna()})
    return [int(saved.run("01_memory_peaks").provenance["context"])]


def _memory_ran_on(saved: Saved) -> str:
    """ran_on for 01_memory_peaks, naming the contexts its rows profiled (not the timing's context)."""
    text, prov = ran_on(saved, "01_memory_peaks"), saved.run("01_memory_peaks").provenance
    contexts = _memory_contexts(saved)
    if contexts == [int(prov["context"])]:
        return text
    return text.replace(f"context {prov['context']}", f"context {' and '.join(map(str, contexts))}")


@answers("2.4.1(a)")
def memory_timeline(q, saved):
    p = _peaks(saved)
    ratio = p["full step"] / p["forward"]
    return (
        "Forward-only (no graph) stays nearly flat: each block's intermediates are freed once used. A full step "
        "climbs through forward as every block saves tensors for backward, peaks as backward starts, falls as "
        f"backward frees them and stays flat through AdamW (plot in notebook 01 §5). Here the full step's peak is "
        f"{span(ratio)} the forward-only peak {_over(saved)}, on {_memory_ran_on(saved)}."
    )


@answers("2.4.1(b)")
def memory_peaks(q, saved):
    p = _peaks(saved)
    return (
        f"Peak live tensor memory on {_memory_ran_on(saved)}, forward only / full step (fp32, parameters "
        "and AdamW state included): "
        + ", ".join(f"{s} {fmt_mib(r['forward'])} / {fmt_mib(r['full step'])}" for s, r in p.iterrows())
        + "."
        + _context_coverage(saved)
    )


@answers("2.4.1(c)")
def memory_autocast(q, saved):
    p = saved.frame("01_memory_peaks")
    fp32 = _peaks(saved)
    parts = []
    for precision in [x for x in dict.fromkeys(p["precision"]) if x != "fp32"]:
        r = (_peaks(saved, precision) / fp32).dropna()
        parts.append(f"{precision}: forward peak {span(r['forward'], 2)} fp32's, full step {span(r['full step'], 2)}")
    if not parts:
        raise NotMeasured("01_memory_peaks has no autocast rows")
    return (
        "; ".join(parts)
        + ("" if _over(saved).endswith("contexts") else coverage(list(fp32.index), saved.profile, _edition(saved)))
        + ". Autocast keeps the fp32 parameters, gradients and AdamW state and adds 16-bit copies "
        "of the weights and 16-bit activations beside the fp32 ones it keeps (norms, softmax, loss), so the peak "
        "is not halved."
    )


@answers("2.4.1(d)")
def residual_stream(q, saved):
    prov = saved.run("01_memory_peaks").provenance
    batch = int(prov["batch"])
    size = prov.get("memory_size") or list(saved.frame("01_memory_peaks")["size"])[-1]
    d = get_config(size).d_model
    here = " and ".join(
        f"{fmt_mib(formulas.residual_stream_bytes(batch, t, d) / 2**20)} at {batch} × {t}"
        for t in _memory_contexts(saved)
    )
    asked, b, t = handout_residual(_edition(saved) or "2024")
    ref_ = formulas.residual_stream_bytes(b, t, get_config(asked).d_model)
    return (
        f"One (B, T, d_model) fp32 tensor: B·T·d·4 bytes; for {size}, the model profiled here, {here}; "
        f"{fmt_mib(ref_ / 2**20)} for the handout's {asked} at {b} × {t}. Notebook 01 §5 checks the formula against "
        "the block output a forward hook sees, byte for byte."
    )


def _edition(saved: Saved) -> str | None:
    """The edition whose model 01_memory_peaks measured (None for a run saved before editions were recorded)."""
    return saved.edition_of(["01_memory_peaks"])


@answers("2.4.1(e)")
def largest_tensors(q, saved):
    run = saved.run("01_largest_tensors")
    top = run.frame().groupby(["MiB", "op", "module"], sort=False).size().reset_index(name="n")

    def where(r) -> str:
        return (
            "already live when the step began (parameters, AdamW state or the batch)"
            if r["op"] == "existing"
            else f"allocated by {r['op']} in {r['module']}"
        )

    listed = "; ".join(f"{r['n']} × {fmt_mib(r['MiB'])} {where(r)}" for _, r in top.iterrows())
    edition = str(run.provenance.get("edition") or "2024")
    asked = (XB.EDITIONS[edition].memory_size if edition in XB.EDITIONS else None) or "2.7B"  # 2024: the 2.7B
    size = str(run.provenance.get("size"))
    if size.split("/")[0] != asked:
        snapshot = " (its forward's memory snapshot)" if edition != "2024" else ""
        short_of(f"model: the full step of {size} was profiled; the {edition} handout asks {asked}{snapshot}")
    return (
        f"At the full step's peak ({run.provenance.get('size')}, {fmt_mib(run.provenance.get('peak_MiB', 0))} in "
        f"all) the {int(top['n'].sum())} largest live storages are: {listed}."
    )


@answers("memory_profiling(f)")
def block_memory(q, saved):
    from helpers.model import SIZES_2026, parameter_shapes

    B, contexts = 4, (128, 2048)  # the handout profiles the xl at contexts 128 and 2048, batch 4
    rows = []
    for name, cfg in SIZES_2026.items():
        grads = sum(math.prod(shape) for k, shape in parameter_shapes(cfg).items() if k.startswith("blocks.0."))
        row = {"size (2026)": name.removesuffix("-2026"), "gradients per block": fmt_mib(4 * grads / 2**20)}
        for T in contexts:
            parts = formulas.block_saved_parts(cfg, B, T)
            total = sum(parts.values())
            row[f"saved per block, T = {T}"] = fmt_mib(total / 2**20)
            row[f"top 5 share, T = {T}"] = pct(sum(list(parts.values())[:5]) / total)
        rows.append(row)
    xl = SIZES_2026["xl-2026"]
    said = []
    for T in contexts:
        parts = formulas.block_saved_parts(xl, B, T)
        total = sum(parts.values())
        top = "; ".join(f"{k} {fmt_mib(v / 2**20)} ({pct(v / total)})" for k, v in list(parts.items())[:5])
        said.append(f"at context {T} one block saves {fmt_mib(total / 2**20)}; the 5 largest: {top}")
    run = saved.run("01_block_memory")
    m, p = run.frame(), run.provenance
    measured = "; ".join(
        f"context {int(r['context'])}: {fmt_mib(r['saved_MiB'])} saved (closed form {fmt_mib(r['saved_formula_MiB'])}),"
        f" the 5 largest ops {pct(r['top5_share'])} ({r['top5_ops']}), gradients {fmt_mib(r['grads_MiB'])}"
        for r in m.to_dict("records")
    )
    fused = get_config(xl, ops="fused")  # ours: F.silu, torch.softmax
    lighter = [
        sum(formulas.block_saved_parts(xl, B, T).values()) - sum(formulas.block_saved_parts(fused, B, T).values())
        for T in contexts
    ]
    return Answer(
        f"The handout's block as the course's staff code computes it (cs336-basics: SwiGLU with three matrices and "
        f"SiLU as x·sigmoid(x), RoPE, softmax as exp(x - max) / sum; fp32), batch {B}, closed form "
        f"(`formulas.block_saved_parts`): for the 2026 xl, "
        + "; ".join(said)
        + ". The staff's SiLU keeps the sigmoid beside its input and its softmax keeps the exp, the sum and the max's "
        f"indices beside its output: {' and '.join(fmt_mib(b / 2**20) for b in lighter)} more than F.silu and "
        "torch.softmax would keep (helpers.model's ops=\"fused\"). One block's gradients are its parameters' "
        "bytes (fp32): the rise per block in backward's profile. "
        f"Measured here with the memory tracker on {p.get('model')} at batch {p.get('batch_size')} (a quarter of "
        f"the contexts, as the cpu presets run): {measured}; byte for byte the closed form at the same shape. "
        "Every 2026 size, closed form:",
        table=tuple(rows),
        status="partial",
        missing="the handout reads the same off NVTX-labelled CUDA memory profiles of the xl itself, on a GPU",
    )
