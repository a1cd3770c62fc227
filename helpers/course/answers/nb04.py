"""Notebook 04's questions (DDP: 2024's 3.3.1-3.4.4; kept by the 2025 edition) and their answers."""

from __future__ import annotations

import re

import pandas as pd

from helpers import formulas
from helpers.course.answers.core import (
    Answer,
    Question,
    Saved,
    and_join,
    answers,
    cap,
    fmt_s,
    pct,
    ref,
    register,
    series_text,
    shown,
)
from helpers.model import for_edition, size_edition
from helpers.timing import MIN_PAIRS, identical_noise, ratio_of

Q = Question
QUESTIONS = [
    Q(
        "3.3.1",
        "Does naive DDP (one all-reduce per parameter after backward) train exactly like one process on "
        "the full batch?",
        notebook="04",
        section="§1 Correctness",
        reads=("04_ddp_checks",),
        gpu="Carries over: the bound is float arithmetic and covers any reduction order, NCCL's included.",
    ),
    Q(
        "3.3.2",
        "How long is a naive DDP step, and how much of it is communication?",
        notebook="04",
        section="§2 Speed",
        reads=("04_ddp_speed", "04_ddp_ratios"),
        gpu="Does not carry over: two gloo ranks share this CPU's cores; NCCL over NVLink is orders of magnitude "
        "faster.",
        references=ref("xl naive DDP step 201 ms on one node, 334 ms over two nodes (H100s)"),
    ),
    Q(
        "3.4.1",
        "Does one all-reduce of all gradients (flattened) beat one per parameter?",
        notebook="04",
        section="§2 Speed",
        reads=("04_ddp_ratios",),
        gpu="The per-call start-up cost α is smaller with NCCL, so flattening saves less there.",
        references=ref("xl step 195 ms flat vs 201 ms naive, one node (H100s)"),
    ),
    Q(
        "3.4.2",
        "With the gradients batched into one call, how much communication time is left?",
        notebook="04",
        section="§2 Speed",
        reads=("04_ddp_speed", "04_ddp_ratios"),
        gpu="As 3.4.1.",
        references=ref("xl step 197 ms with batched gradients, one node (H100s)"),
    ),
    Q(
        "3.4.3(a)",
        "Does overlapping each parameter's all-reduce with backward make the step faster?",
        notebook="04",
        section="§2 Speed",
        reads=("04_ddp_ratios",),
        gpu="Does not carry over: NCCL runs on its own stream and copy engines, gloo here shares the CPU cores with "
        "backward.",
        references=ref("xl overlapped 216 ms vs 201 ms naive, one node (H100s)"),
    ),
    Q(
        "3.4.3(b)",
        "What do traces show for overlapped vs naive communication?",
        notebook="04",
        section="§3 Overlap",
        reads=("04_ddp_overlap",),
        gpu="Use NCCL and a CUDA trace there; the gloo events recorded here do not exist with NCCL.",
    ),
    Q(
        "3.4.3(c)",
        "What fraction of the communication overlaps backward?",
        notebook="04",
        section="§3 Overlap",
        reads=("04_ddp_overlap",),
        gpu="The fraction depends on the backend and its streams.",
        references=ref("12.5% on rank 0, 9.1% on rank 1; naive 0% (H100s)"),
    ),
    Q(
        "3.4.4(a)",
        "How does the step time change with the bucket size?",
        notebook="04",
        section="§4 The bucket-size model",
        reads=("04_ddp_bucket_sweep", "04_ddp_ratios"),
        gpu="The optimum moves with α, β and the backward time, all different there.",
        references=ref("NCCL, large: 128-130 ms for every bucket size from 5 to 500 MB (H100s)"),
    ),
    Q(
        "3.4.4(b)",
        "What bucket size minimises the overhead, from α, β, the gradient bytes and the backward time?",
        notebook="04",
        section="§4 The bucket-size model",
        reads=("04_ddp_bucket_sweep",),
        gpu="The formula carries over; plug in the GPU's α, β and backward time.",
    ),
]
register(QUESTIONS)

# ---- 3.3-3.4 DDP (notebook 04) ---------------------------------------------------------------------------------------

DDP_NAMES = {
    "naive": "naive DDP",
    "flat": "flat DDP",
    "per_parameter": "overlapped per-parameter DDP",
    "local": "compute alone",
    "torch_ddp 25 MB": "torch DDP (25 MiB)",
    "bucketed 25 MB": "bucketed (25 MiB)",
}
BUCKET_UNIT = (  # said once, on 3.4.4(a): what a bucket size of "b MB" is in bytes, here and in the handout
    "Bucket sizes are the handout's bucket_size_mb: the 2025 handout defines its MB as 1024² bytes "
    "(memory_profiling(d)), and DDPBucketed, like torch's bucket_cap_mb, computes 2^20 bytes per MB, so they are "
    "written MiB here."
)


def ddp_name(variant: str) -> str:
    """A saved variant label on the page: "bucketed 10 MB" -> "bucketed (10 MiB)" (its size is bucket_size_mb · 2^20
    bytes, helpers.ddp.MB); the named variants from DDP_NAMES."""
    if variant in DDP_NAMES:
        return DDP_NAMES[variant]
    m = re.fullmatch(r"(bucketed|torch_ddp) ([\d.]+) MB", variant)
    return f"{'torch DDP' if m[1] == 'torch_ddp' else m[1]} ({m[2]} MiB)" if m else variant


def _ddp_ratios(saved: Saved, field: str = "step") -> pd.DataFrame:
    """04_ddp_ratios for one timed field: "step", "backward" or "comm"."""
    r = saved.frame("04_ddp_ratios")
    return r[r["field"] == field]


HANDOUT_MODEL = "xl"  # 3.3.2-3.4.3 (every edition): 1 node, 2 GPUs, the xl model


def sizes_cut(text: str, models, saved: Saved, gpu: str = "") -> Answer:
    """The answer `text` with the model sizes it measured named, and partial (saying so) when the handouts' xl (its
    cpu preset on the cpu profile) is not among them."""
    names = list(dict.fromkeys(models))
    if any(re.sub(r"-20\d\d$", "", m.split("/")[0]) == HANDOUT_MODEL for m in names):  # xl, xl-2026/cpu
        return Answer(text, gpu)
    asked = f"{HANDOUT_MODEL}/cpu" if saved.profile == "cpu" else HANDOUT_MODEL
    asked = for_edition(asked, size_edition(names[0])) if names else asked  # as the run's edition names it
    said = f" Measured on {and_join(names)}; the handouts ask {HANDOUT_MODEL}, which notebook 04 does not run."
    missing = (
        f"the handouts' {HANDOUT_MODEL} model ({asked} on the {saved.profile} profile): notebook 04's PROFILES run "
        f"{and_join(names)} here, so the measurement above is of {'those sizes' if len(names) > 1 else 'that size'}"
    )
    return Answer(text + said, gpu, status="partial", missing=missing)


@answers("3.3.1")
def ddp_correct(q, saved):
    c = saved.frame("04_ddp_checks")
    naive = c[c["variant"] == "naive"]
    ok = naive["start_equal"].all() and naive["ranks_equal"].all() and (naive["grad_ratio"] <= 1).all()
    verdict_ = "Yes" if ok else "No"
    return (
        f"{verdict_}: on {', '.join(naive['model'])} (tied weights, a frozen and an unused parameter in the toy "
        f"model), after the broadcast both ranks start from one process's weights, end bit-identical, and every "
        f"averaged gradient is within {naive['grad_ratio'].max():.2g} of the float32 rounding bound of one "
        f"process's full-batch gradient (≤ 1 required). All {len(c)} wrapper runs pass the same check: "
        f"{'yes' if (c['grad_ratio'] <= 1).all() else 'no'}."
    )


@answers("3.3.2")
def ddp_naive_speed(q, saved):
    speed = saved.frame("04_ddp_speed")
    naive = speed[speed["variant"] == "naive"]
    shares = ", ".join(
        f"{row.model} {fmt_s(row.step_s)} ({pct(row.comm_s / row.step_s)} communicating)" for row in naive.itertuples()
    )
    text = (
        f"Naive DDP step (slowest rank's median) and its share spent in the after-backward all-reduces: {shares}. "
        + cap(series_text(_ddp_ratios(saved), "naive", "local", "model", DDP_NAMES, "step time"))
        + "."
    )
    return sizes_cut(text, naive["model"], saved)


@answers("3.4.1")
def ddp_flat(q, saved):
    r = _ddp_ratios(saved)
    return sizes_cut(series_text(r, "flat", "naive", "model", DDP_NAMES, "step time") + ".", r["model"], saved)


@answers("3.4.2")
def ddp_flat_comm(q, saved):
    s = saved.frame("04_ddp_speed").set_index(["model", "variant"])
    models = list(dict.fromkeys(s.index.get_level_values("model")))
    calls = ", ".join(
        f"{m} {fmt_s(s.loc[(m, 'naive'), 'comm_s'])} → {fmt_s(s.loc[(m, 'flat'), 'comm_s'])}" for m in models
    )
    text = (
        f"Time waiting for communication after backward, naive (one call per parameter) → flat (one call): "
        f"{calls}. "
        + cap(series_text(_ddp_ratios(saved, "comm"), "flat", "naive", "model", DDP_NAMES, "communication time"))
        + "."
    )
    return sizes_cut(text, models, saved)


@answers("3.4.3(a)")
def ddp_overlap_speed(q, saved):
    r = _ddp_ratios(saved)
    texts = [series_text(r, "per_parameter", b, "model", DDP_NAMES, "step time") for b in ("naive", "flat")]
    vs_naive = [ratio_of(row) for row in r[(r["a"] == "per_parameter") & (r["b"] == "naive")].to_dict("records")]
    models = list(r[(r["a"] == "per_parameter") & (r["b"] == "naive")]["model"])
    quicker = [m for m, x in zip(models, vs_naive, strict=True) if x.differs and x.median < 1]
    if vs_naive and len(quicker) == len(vs_naive):
        gpu = (
            "Not necessarily: overlapping was measurably faster here even with gloo sharing the CPU cores with "
            "backward, and NCCL runs on its own stream, but per-parameter calls pay NCCL's launch cost once per "
            "tensor, and the published H100 run above was slower with them."
        )
    elif quicker:
        gpu = (
            f"Partly: overlapping was measurably faster here for {', '.join(quicker)} but not for "
            f"{', '.join(m for m in models if m not in quicker)}, with gloo sharing the CPU cores with backward; "
            "NCCL runs on its own stream and copy engines, so on GPUs the overlap can pay more widely, though "
            "per-parameter calls pay NCCL's launch cost once per tensor (the published H100 run was slower)."
        )
    else:
        gpu = (
            "Does not carry over: overlapping was not measurably faster here, where gloo shares the CPU cores with "
            "backward; NCCL runs on its own stream and copy engines, so on GPUs the overlap can pay."
        )
    return sizes_cut("; ".join(texts) + ".", r["model"], saved, gpu)


@answers("3.4.3(b)")
def ddp_traces(q, saved):
    o = saved.frame("04_ddp_overlap")
    model = saved.run("04_ddp_overlap").provenance.get("model")
    where = (
        "profiler traces (gloo's own all-reduce events)"
        if any(c.startswith("trace") for c in o.columns)
        else "launch → done intervals"
    )
    traces = saved.folder / "04_traces"
    folder = f" under `{shown(traces)}/`" if traces.is_dir() else ""
    text = (
        f"Notebook 04 §3 draws, for {model}, each variant's backward and its all-reduces from {where}; one Chrome "
        f"trace per variant and rank is saved{folder} (open it in Perfetto). Naive DDP's all-reduces all start "
        "after backward ends; the per-parameter ones start from the gradient hooks, inside backward."
    )
    return sizes_cut(text, [model], saved)


@answers("3.4.3(c)")
def ddp_overlap_fraction(q, saved):
    o = saved.frame("04_ddp_overlap").set_index("variant")
    o = o[~o.index.duplicated()]  # a run saved before shown_variants listed 25 MB once
    col = "trace overlap" if "trace overlap" in o.columns else "launch→done overlap"
    text = (
        f"Share of communication time inside backward ({col.split(' overlap')[0]}, mean over ranks and steps): "
        + ", ".join(f"{ddp_name(v)} {pct(x)}" for v, x in o[col].items())
        + ". Naive is 0 by construction; torch DDP waits for its last bucket inside backward, so its share says "
        "little about how much it overlapped."
    )
    return sizes_cut(text, [saved.run("04_ddp_overlap").provenance.get("model")], saved)


@answers("3.4.4(a)")
def bucket_sweep(q, saved):
    sweep = saved.frame("04_ddp_bucket_sweep")
    model = saved.run("04_ddp_bucket_sweep").provenance.get("model")
    best = sweep.loc[sweep["step_s"].idxmin()]
    r = _ddp_ratios(saved)
    r = r[(r["model"] == model) & r["a"].isin(sweep["variant"]) & r["b"].isin(sweep["variant"])]
    pair = lambda a, b: ratio_of(r[(r["a"] == a) & (r["b"] == b)].iloc[0])  # noqa: E731
    one = list(sweep[sweep["buckets"] == 1]["variant"])  # sizes that all build the same single bucket
    noise = identical_noise(pair(a, b) for a in one for b in one if a < b)
    tied = [
        f"{mb:g}"
        for v, mb in zip(sweep["variant"], sweep["bucket_MB"], strict=True)
        if v != best["variant"] and not pair(v, best["variant"]).beyond(noise)
    ]
    floor = (
        f"the {len(one)} sizes that build one bucket (identical configurations) time up to {noise:.1%} apart, so a "
        "size is ranked only when its paired interval lies beyond that too; "
        if noise
        else ""
    )
    return (
        f"{model}, {len(sweep)} bucket sizes from {sweep['bucket_MB'].min():g} to {sweep['bucket_MB'].max():g} MiB: "
        f"step medians from {fmt_s(sweep['step_s'].min())} to {fmt_s(sweep['step_s'].max())}; the "
        f"lowest median is {best['bucket_MB']:g} MiB ({int(best['buckets'])} bucket"
        f"{'s' if best['buckets'] != 1 else ''}); {floor}"
        + (
            f"no measurable difference from it for {', '.join(tied)} MiB, so the sweep cannot rank those."
            if tied
            else f"every other size is measurably slower (paired per step, at least {MIN_PAIRS} steps)."
        )
        + f" {BUCKET_UNIT}"
    )


@answers("3.4.4(b)")
def bucket_model(q, saved):
    run = saved.run("04_ddp_bucket_sweep")
    p, sweep = run.provenance, run.frame()
    S, Tb, a, b, n = (float(p[k]) for k in ("grad_bytes", "backward_s", "alpha_s", "beta_Bps", "n_star"))
    best = sweep.loc[sweep["step_s"].idxmin(), "bucket_MB"]
    tensors = formulas.param_tensor_count(run.provenance["model"])
    finest = (
        f" That is more buckets than {run.provenance['model']} has gradient tensors ({tensors}): the finest "
        "split DDPBucketed can build is one tensor per bucket."
        if n > tensors
        else ""
    )
    b_handout = formulas.handout_bucket_size(S, a, b)
    miss = sweep["step_s"] / sweep["predicted_s"] - 1  # measured over modelled step, per swept size
    return (
        f"With n equal buckets of S/n bytes, each all-reduce costing α + S/(nβ), the overhead after backward is "
        f"max(α + S/(nβ), nα + S/β − T_b(1 − 1/n)), minimised at n* = max((T_b − S/β)/α, √(T_b/α)) and "
        f"b* = S/n* (derived and checked numerically in notebook 04 §4). Under the handout's assumption (a bucket's "
        f"gradients take as long to compute as to send: T_b = S/β) the overhead is nα + S/(nβ), least at "
        f"n* = √(S/(αβ)), so b* = √(S·β·α), in the handout's letters √(s·w·o). Here S = {S / 2**20:.3g} MiB, "
        f"T_b = {fmt_s(Tb)}, α = {a * 1e6:.0f} µs, β = {b / 1e9:.2f} GB/s give n* = {n:.1f} and b* = "
        f"{S / n / 2**20:.3g} MiB (the handout's b* = {b_handout / 2**20:.3g} MiB); the sweep's lowest median was "
        f"at {best:g} MiB. The model misses the measured steps by {miss.median():+.0%} (median over the "
        f"{len(miss)} sizes; {miss.min():+.0%} to {miss.max():+.0%}): it adds only the all-reduces' overhead after "
        "backward to the step without communication, not their contention with backward for the same cores and "
        "memory." + finest
    )
