"""Notebook 01's questions on timing, profiling and mixed precision (2024's 2.1.1-2.1.4) and their answers from what
notebook 01 saved. Its mixed-precision questions: nb01_precision; its memory questions: nb01_memory; the 2025
edition's additions: nb01_since_2025."""

from __future__ import annotations

import pandas as pd

from helpers.course.answers.core import (
    Answer,
    NotMeasured,
    Question,
    Saved,
    and_join,
    answers,
    coverage,
    fmt_s,
    pct,
    ran_against,
    ref,
    register,
    span,
)
from helpers.experiments import benchmarking as XB
from helpers.model import ARCH_NAMES, edition_arch
from helpers.timing import MIN_PAIRS, Ratio

Q = Question
QUESTIONS = [
    Q(
        "2.1.1(a)",
        "How is a forward / backward pass timed: model built, warm-up, synchronised steps?",
        notebook="01",
        section="§1 Timing",
        reads=("01_timing",),
        gpu="The same code runs; each step is then timed by a pair of CUDA events.",
    ),
    Q(
        "2.1.1(b)",
        "How long do forward, backward and both take per model size after warm-up, and how much do the steps vary?",
        notebook="01",
        section="§1 Timing",
        reads=("01_timing",),
        gpu="Absolute times do not carry over: a GPU runs the reference sizes, and small models there are bound by "
        "kernel launches rather than arithmetic.",
        references=ref("xl forward+backward 180 ms, 2.7B 213 ms (H100, 1 warm-up, 5 steps)"),
    ),
    Q(
        "2.1.1(c)",
        "Without warm-up, what changes and why?",
        notebook="01",
        section="§1 Timing",
        reads=("01_timing",),
        gpu="The effect is larger there (CUDA context, kernel loading, cuBLAS heuristics on the first call).",
        references=ref("small forward without warm-up: mean 79.8 ms with std 103 ms, against 13.6 ms warmed up (H100)"),
    ),
    Q(
        "2.1.2(a)",
        "How long is a forward pass according to the profiler, against the timing script?",
        notebook="01",
        section="§2 Profiler tables",
        reads=("01_profile", "01_timing"),
        gpu="The profiler then reports CUDA kernel time, not CPU time: rerun with `make writeup PROFILE=gpu`.",
        references=ref("xl forward: about 90 ms in the profiler against 81 ms timed (H100)"),
    ),
    Q(
        "2.1.2(b)",
        "Which op (kernel) takes the most time in the forward pass, how often is it called, and is it the "
        "same once backward runs too?",
        notebook="01",
        section="§2 Profiler tables",
        reads=("01_profile",),
        gpu="The table then lists CUDA kernels (cuBLAS GEMMs); matmuls usually still lead.",
        references=ref("a TF32 cuBLAS GEMM, 192 calls per xl forward; another GEMM leads forward+backward (H100)"),
    ),
    Q(
        "2.1.2(c)",
        "Besides matrix multiplies, which ops take a non-trivial share of the forward pass?",
        notebook="01",
        section="§2 Profiler tables",
        reads=("01_profile",),
        gpu="Elementwise ops are memory-bound on both; their share is typically larger there, where matmuls are much "
        "faster.",
        references=ref("aten::mul, add_, div, sum, copy_ and clone (H100)"),
    ),
    Q(
        "2.1.2(d)",
        "With the optimizer step included, how does the matmul share change?",
        notebook="01",
        section="§2 Profiler tables",
        reads=("01_profile",),
        gpu="Direction carries over (AdamW is all elementwise); the shares do not.",
        references=ref("aten::mm share falls from 30% to 18% once AdamW runs (H100)"),
    ),
    Q(
        "2.1.3(a)",
        "What does the full training step look like as a flame graph?",
        notebook="01",
        section="§3 Flame graph",
        reads=("01_flame",),
        gpu="The stack structure is the same; the widths become kernel times.",
    ),
    Q(
        "2.1.3(b)",
        "What share of the step goes to RMSNorm?",
        notebook="01",
        section="§3 Flame graph",
        reads=("01_flame",),
        gpu="The shares move: matmuls speed up more than the norms' elementwise work.",
        references=ref("2.91% for xl, 97 norm layers (H100)"),
    ),
    Q(
        "2.1.3(c)",
        "What share of the step goes to softmax?",
        notebook="01",
        section="§3 Flame graph",
        reads=("01_flame",),
        gpu="As for RMSNorm: the shares move.",
        references=ref("2.88% for xl, 48 calls (H100)"),
    ),
    Q(
        "2.1.3(d)",
        "Does the graph match expectations; what is surprising?",
        notebook="01",
        section="§3 Flame graph",
        reads=("01_flame", "01_profile"),
        gpu="The lesson (FLOPs are not time) holds on both; the numbers differ.",
    ),
]
register(QUESTIONS)

# ---- 2.1 timing, profiling, mixed precision (notebook 01) -----------------------------------------------------------


def _warm_cold(saved: Saved) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """01_timing's rows that ran, indexed by (size, pass): cold (no warm-up), warm, and the warm-up count."""
    t = saved.frame("01_timing")
    ok = t[t["status"] == "ok"]
    warmup = int(ok["warm-up"].max())
    if warmup == 0:
        raise NotMeasured("01_timing has no warmed-up run")
    idx = ok.set_index(["size", "pass"])
    return idx[idx["warm-up"] == 0], idx[idx["warm-up"] == warmup], warmup


PASS_NAMES = {"forward": "forward", "backward": "backward", "both": "forward+backward", "step": "full step"}
# 01_timing's passes -> the handout's words ("step": forward, backward and AdamW's step, which 2026 times too)


def _passes(warm: pd.DataFrame) -> list[str]:
    """The passes 01_timing timed, in PASS_NAMES' order."""
    timed = set(warm.index.get_level_values("pass"))
    return [p_ for p_ in PASS_NAMES if p_ in timed]


def ran_on(saved: Saved, name: str) -> str:
    """ "the 2026 edition's model (cs336-basics: SwiGLU, RoPE) at batch 4 × context 128": what a notebook 01 result
    was measured on, from its provenance ("at batch ..." alone for a run saved before editions were recorded)."""
    prov = saved.run(name).provenance
    shape = f"batch {prov.get('batch')} × context {prov.get('context')}"
    edition = prov.get("edition")
    if not edition:
        return shape
    arch = ARCH_NAMES[edition_arch(edition)]
    return f"the {edition} edition's model ({arch}) at {shape}"


@answers("2.1.1(a)")
def timing_script(q, saved):
    _, warm, warmup = _warm_cold(saved)
    sizes = list(dict.fromkeys(warm.index.get_level_values("size")))
    timed = _passes(warm)
    passes = ", ".join(PASS_NAMES[p_] for p_ in timed)
    interleaved = ", ".join(PASS_NAMES[p_] for p_ in timed if p_ != "step")
    step = " then the full step (AdamW's in-place update) in a loop of its own on the same model;" * ("step" in timed)
    return (
        f"`benchmarking.time_sizes` builds one model per size and times {interleaved} on it interleaved in one loop "
        f"(`helpers.timing.compare`);{step} {warmup} untimed warm-up rounds, then {int(warm['steps'].iloc[0])} "
        "rounds, each call between device synchronisations; a cold "
        f"run builds a fresh model per pass and times it with no warm-up. Here it timed {len(sizes)} "
        f"size{'s' * (len(sizes) != 1)} "
        f"({', '.join(sizes)}) × {passes}, on {ran_on(saved, '01_timing')}."
    )


@answers("2.1.1(b)")
def warm_timings(q, saved):
    _, warm, warmup = _warm_cold(saved)
    order, passes = list(dict.fromkeys(warm.index.get_level_values("size"))), _passes(warm)
    per = warm["mean_s"].unstack("pass").reindex(index=order, columns=passes)
    spread = warm["std_s"] / warm["mean_s"]
    sizes = ", ".join(f"{s} " + " / ".join(fmt_s(r[p_]) for p_ in passes) for s, r in per.iterrows())
    handout = XB.PROFILES["gpu"]  # the handouts' warm-up and timed steps (5 and 10)
    steps = int(warm["steps"].iloc[0])
    ran_against("warm-up/timed steps", [f"{warmup}/{steps}"], [f"{handout['warmup']}/{handout['steps']}"])
    cut = coverage(order, saved.profile, saved.edition_of(["01_timing"]))
    step = (
        full_step_text(warm)
        if "step" in passes
        else ' The optimizer step was not timed: the 2026 handout\'s full training step needs EDITION = "2026".'
    )
    return (
        f"Mean {' / '.join(PASS_NAMES[p_] for p_ in passes)} after {warmup} warm-up steps, on "
        f"{ran_on(saved, '01_timing')}: {sizes}{cut}. Step-to-step spread (std/mean): {pct(spread.median())} in the "
        f"median run, at most {pct(spread.max())} ({spread.idxmax()[0]} {spread.idxmax()[1]}).{step}"
    )


def full_step_text(warm: pd.DataFrame) -> str:
    """The full step against forward+backward, paired by round (01_timing's step rows: ratio_vs_both), and why the
    full step's mean can come out below forward+backward's: two loops, gradients accumulated in one and set to None
    in the other."""
    rows = warm.xs("step", level="pass")
    rows = rows[rows["pairs_vs_both"].notna()] if "pairs_vs_both" in rows else rows.iloc[:0]
    if rows.empty:
        return ""
    r = max(
        (
            Ratio(x.ratio_vs_both, x.ratio_low_vs_both, x.ratio_high_vs_both, int(x.pairs_vs_both))
            for x in rows.itertuples()
        ),
        key=lambda r: r.pairs,
    )
    ratios = [float(v) for v in rows["ratio_vs_both"]]
    said = (
        f"measurably {'longer' if r.median > 1 else 'shorter'}"
        if r.beyond()
        else f"no measurable difference ({r.pairs} pairs{', fewer than ' + str(MIN_PAIRS) if not r.enough else ''})"
    )
    both = warm.xs("both", level="pass")["mean_s"]
    below = [s for s, t in warm.xs("step", level="pass")["mean_s"].items() if s in both and t < both[s]]
    why = (
        f" For {and_join(below)} the full step's mean is below forward+backward's although it does more: "
        "forward+backward accumulates into the gradients the round before left (one more read and add of every "
        "gradient), while the full step sets them to None first, so backward writes them fresh; and the full step ran "
        "in a loop of its own after the interleaved one, so it is paired with forward+backward by round, not "
        "interleaved."
        if below
        else " The difference is AdamW's update, all elementwise over every parameter and its two moments."
        if r.beyond() and r.median > 1
        else ""
    )
    return (
        f" The full step (forward, backward, AdamW) over forward+backward, paired by round: {span(ratios, 2)} over the "
        f"sizes ({r.median:.2f}x [{r.low:.2f}-{r.high:.2f}] with the most pairs): {said}.{why}"
    )


@answers("2.1.1(c)")
def cold_timings(q, saved):
    cold, warm, _ = _warm_cold(saved)
    first = (cold["first_s"] / warm["median_s"]).dropna()
    noise = (warm["std_s"] / warm["mean_s"]).median()
    spread = ((cold["std_s"] / cold["mean_s"]) / (warm["std_s"] / warm["mean_s"])).median()
    worst = first.idxmax()
    cold_steps = int(cold["steps"].min())
    ran_against("steps without warm-up", [cold_steps], [XB.PROFILES["gpu"]["cold_steps"]])
    after = [
        f"after {w} warm-up step{'s' * (w > 1)} the mean of the rest is {ratio:.2f}x"
        for w in (1, 2)
        if f"after_{w}_s" in cold and cold[f"after_{w}_s"].notna().any()
        for ratio in [(cold[f"after_{w}_s"] / warm["mean_s"]).median()]
    ]
    text = (
        f"Without warm-up the first call takes {first.median():.1f}x the warm median (median over sizes and "
        f"passes; up to {first.max():.1f}x for {worst[0]} {worst[1]}), and the cold runs' relative spread is "
        f"{spread:.1f}x the warm runs'. "
        + (
            f"The same cold runs read as if 1 or 2 steps had warmed them up: {' and '.join(after)} the warm mean "
            "(medians over sizes and passes). "
            if after and cold_steps - 2 >= MIN_PAIRS
            else f"How many warm-up steps suffice these cold runs cannot tell: they took {cold_steps} steps each, so "
            f"after 2 of them {cold_steps - 2} step{'s' * (cold_steps != 3)} would be left, fewer than the "
            f"{MIN_PAIRS} a comparison needs. "
            if after
            else ""
        )
    )
    if first.median() <= 1 + 2 * noise:
        if first.max() > 1 + 2 * noise:
            costly = [f"{s} {p_} {v:.1f}x" for (s, p_), v in first.items() if v > 1 + 2 * noise]
            return text + (
                f"The median is within twice the warm steps' own spread ({pct(noise)} std/mean), but "
                f"{len(costly)} of {len(first)} first calls are not ({', '.join(costly)}): a first-call "
                "cost that shows only for some sizes and passes in this run."
            )
        return text + (
            f"Every first call is within twice the warm steps' own spread ({pct(noise)} std/mean): no "
            "measurable first-call cost on this machine in this run."
        )
    return text + (
        "The first call pays one-time work (allocating every buffer, lazy initialisation; on a GPU also the "
        "CUDA context and kernel selection), so a mean without warm-up mixes two different things."
    )


def profile_table(saved: Saved, run: str) -> pd.DataFrame:
    """01_profile's op table of one profiled step ("forward", "forward+backward", "full step")."""
    p = saved.frame("01_profile")
    part = p[p["run"] == run]
    if part.empty:
        raise NotMeasured(f"01_profile has no {run!r} table")
    return part.sort_values("ms/step", ascending=False)


@answers("2.1.2(a)")
def profiled_forward(q, saved):
    fwd = profile_table(saved, "forward")
    size = saved.run("01_profile").provenance.get("size")
    total_ms = float((fwd["ms/step"] / fwd["share"]).iloc[0])
    _, warm, _ = _warm_cold(saved)
    if (size, "forward") not in warm.index:  # section 1's budget stopped before the profiled size
        return Answer(
            f"The profiler puts a forward pass of {size} at {total_ms:.3g} ms of op self time; section 1's time "
            f"budget did not time {size}, so there is no timed forward to set it against in this run.",
            status="partial",
            missing=f'a timed forward of {size}: run notebook 01 with BUDGET = "none"',
        )
    timed = warm.loc[(size, "forward"), "median_s"] * 1e3
    ratio, steps = total_ms / timed, saved.run("01_profile").provenance.get("steps")
    return (
        f"The profiler puts a forward pass of {size} at {total_ms:.3g} ms of op self time; the timing script's "
        f"warm forward has a median of {timed:.3g} ms, so the profiler's figure is {ratio:.2f}x the timed one. "
        "They differ in what they include: the profiled pass builds no autograd graph, the timed one does, and "
        "the profiler adds its own overhead per op."
        + (
            ""
            if 0.5 <= ratio <= 2
            else f" A factor this large is more than those differences: the profiler "
            f"averaged only {steps} steps, so a change in the machine's load between the two runs is the likely "
            "cause; re-run notebook 01 on a quiet machine to compare them."
        )
    )


@answers("2.1.2(b)")
def top_op(q, saved):
    fwd, both = profile_table(saved, "forward").iloc[0], profile_table(saved, "forward+backward").iloc[0]
    same = "the same op" if fwd["op"] == both["op"] else f"a different op, {both['op']}"
    return (
        f"In the forward pass {fwd['op']} takes the most time: {pct(fwd['share'])} of it, "
        f"{fwd['calls/step']:g} calls per pass. With backward too, {same} leads with {pct(both['share'])} "
        f"({both['calls/step']:g} calls per step)."
    )


@answers("2.1.2(c)")
def non_matmul_ops(q, saved):
    fwd = profile_table(saved, "forward")
    other = fwd[fwd["class"] != "matmul"]
    listed = ", ".join(f"{r['op']} {pct(r['share'])}" for _, r in other.head(5).iterrows())
    return (
        f"Outside matrix multiplies, the forward pass's largest ops are {listed or 'none among the top ops'}; all "
        f"non-matmul ops together take {pct(1 - fwd['matmul_share'].iloc[0])} of it. They do few FLOPs but read "
        "and write whole tensors, so memory bandwidth sets their time."
    )


@answers("2.1.2(d)")
def matmul_share(q, saved):
    share = {
        run: profile_table(saved, run)["matmul_share"].iloc[0] for run in ("forward", "forward+backward", "full step")
    }
    top = profile_table(saved, "full step").iloc[0]
    return (
        f"Matrix multiplies take {pct(share['forward'])} of the forward pass, {pct(share['forward+backward'])} of "
        f"forward+backward and {pct(share['full step'])} of the full step with AdamW, whose update is all "
        f"elementwise (mul_, lerp_, addcdiv_, sqrt over every parameter); the full step's top op is {top['op']} "
        f"({pct(top['share'])})."
    )


def flame_shares(saved: Saved) -> pd.DataFrame:
    """01_flame's shares (parts and stages of the step), indexed by part."""
    return saved.frame("01_flame").set_index("part")


@answers("2.1.3(a)")
def flame_stages(q, saved):
    f = flame_shares(saved)
    stages = f[f["kind"] == "stage"]["share"]
    size = saved.run("01_flame").provenance.get("size")
    return (
        f"The flame graph of one full step of {size} is drawn in notebook 01 §3 (stacks: step part → module → op; "
        "backward ops attributed to the module whose forward recorded them). The step splits into "
        + ", ".join(f"{k} {pct(v)}" for k, v in stages.items())
        + "; every block repeats the same pattern, one tower per layer."
    )


@answers("2.1.3(b)", "2.1.3(c)")
def flame_part(q, saved):
    part, what = ("RMSNorm", "norm layers") if q.number == "2.1.3(b)" else ("softmax", "calls")
    f = flame_shares(saved)
    share, count = float(f.loc[part, "share"]), f.loc[part, "count"]
    return (
        f"{part} (forward and backward) takes {pct(share)} of the full step here, over {int(count)} {what}: "
        f"{share / count:.2%} each."
    )


@answers("2.1.3(d)")
def flame_surprise(q, saved):
    f = flame_shares(saved)
    stages = f[f["kind"] == "stage"]["share"]
    mm = profile_table(saved, "full step")["matmul_share"].iloc[0]
    backward = stages.get("backward", 0.0) / stages.get("forward", float("nan"))
    return (
        f"Matmuls carry nearly all the FLOPs yet take {pct(mm)} of the full step; the rest is elementwise work "
        "(norms, the feed-forward's activation, softmax, AdamW), and the optimizer step alone takes "
        f"{pct(stages.get('optimizer step', 0.0))}. Backward takes {backward:.1f}x the forward's time, against "
        "the 2x its two matmuls per forward matmul predict."
    )
