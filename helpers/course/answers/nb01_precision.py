"""Notebook 01's mixed-precision questions (2024's 2.1.4) and their answers from what notebook 01 saved: autocast's
speed per size beside fp32, the dtypes autocast gives, and the norm's rounding per dtype."""

from __future__ import annotations

from helpers.course.answers.core import Answer, Question, answers, coverage, ref, register, series_text
from helpers.timing import ratio_of

Q = Question
QUESTIONS = [
    Q(
        "2.1.4(a)",
        "Is forward+backward faster under autocast (bf16/fp16) than in fp32, per size?",
        notebook="01",
        section="§4 Mixed precision",
        reads=("01_precision_ratios",),
        gpu="Does not carry over: GPU tensor cores run bf16/fp16 matmuls many times faster than fp32, while a CPU "
        "without bf16 instructions only adds casts.",
        references=ref("2.7B forward+backward 213 ms fp32 vs 197 ms mixed; small 24.1 vs 30.6 ms (H100)"),
    ),
    Q(
        "2.1.4(b)",
        "Under autocast, which dtype do the parameters, fc1's output, the norm's output, the logits, the "
        "loss and the gradients get?",
        notebook="01",
        section="§4 Mixed precision",
        reads=("01_autocast_dtypes",),
        gpu="Partly: CUDA autocast keeps layer_norm in fp32, CPU autocast does not; the rest agree.",
        references=ref("fc1 output fp16, LayerNorm output fp32, logits fp16 (H100, fp16 autocast)"),
    ),
    Q(
        "2.1.4(c)",
        "Why keep the norm in fp32, and does that change with bf16?",
        notebook="01",
        section="§4 Mixed precision",
        reads=("01_norm_precision",),
        gpu="Carries over exactly: rounding is the same arithmetic everywhere.",
    ),
]
register(QUESTIONS)


@answers("2.1.4(a)")
def autocast_speed(q, saved):
    rows = saved.frame("01_precision_ratios")
    rows = rows[rows["b"] == "fp32"]
    parts = [series_text(rows, a, "fp32", "size", what="forward+backward time") for a in sorted(set(rows["a"]))]
    ratios = [ratio_of(r) for r in rows.to_dict("records")]
    faster = [r.differs and r.median < 1 for r in ratios]
    slower = [r.differs and r.median > 1 for r in ratios]
    ran = list(dict.fromkeys(rows["size"]))
    run = saved.run("01_precision_ratios")
    note = coverage(ran, saved.profile, saved.edition_of(["01_precision_ratios"]))
    every = "at every size here" if not note else f"at each of the {len(ran)} sizes timed here"
    if all(faster):
        gpu = (
            f"Only for the large sizes: autocast was measurably faster {every}, because this CPU multiplies 16-bit "
            "numbers natively; GPU tensor cores do so at several times their fp32 rate, so the large sizes gain "
            "there too, but the small ones stay bound by kernel launches and the casts can make them slower (the "
            "published H100 run above: the 2.7B faster mixed, small slower)."
        )
    elif all(slower):
        gpu = (
            f"Does not carry over: autocast was measurably slower {every}, where this CPU multiplies 16-bit "
            "numbers slower than fp32; GPU tensor cores run bf16/fp16 matmuls several times faster than fp32, so "
            "there it pays for all but the smallest models."
        )
    else:
        gpu = (
            "Mixed here (faster at some sizes, slower or inside the noise at others); on a GPU, tensor cores run "
            "bf16/fp16 matmuls several times faster than fp32, so the large sizes gain there."
        )
    slow = run.provenance.get("bf16_slowdown")
    factor = (
        f" This CPU's calibration: a bf16 matmul takes {float(slow):.1f}x an fp32 one."
        if slow and float(slow) >= 2
        else f" This CPU's calibration: bf16 matmuls run at {1 / float(slow):.1f}x fp32's speed."
        if slow
        else ""
    )
    caps = run.provenance.get("cpu_caps") or {}
    capped = (
        f" This run capped the CPU's instruction set ({', '.join(f'{k}={v}' for k, v in caps.items())}), which "
        "sends bf16 matmuls to a slow path."
        if caps
        else ""
    )
    cpu_reading = (
        " Where it does not, a slowdown comes mostly from the matmuls themselves, not from the casts: without a fast "
        "bf16 path a bf16 matmul takes many times an fp32 one (notebook 01 prints this CPU's factor from its "
        "calibration), while the casts are a few elementwise passes."
        if saved.gpu_device(["01_precision_ratios"]) is None
        else ""
    )
    return Answer(
        "Forward+backward: " + "; ".join(parts) + f"{note}. Autocast pays only where the hardware multiplies "
        "16-bit numbers faster than 32-bit ones (GPU tensor cores, CPUs with avx512_bf16 or AMX)."
        + cpu_reading
        + factor
        + capped,
        gpu,
    )


@answers("2.1.4(b)")
def autocast_dtypes(q, saved):
    d = saved.frame("01_autocast_dtypes").set_index("tensor")
    text = " ".join(
        f"Under {col}: " + ", ".join(f"{t} {str(v).replace('torch.', '')}" for t, v in d[col].items()) + "."
        for col in d.columns
    )
    if any("float16 on cuda" in c for c in d.columns):
        return text
    return Answer(
        text + " The question asks fp16 autocast on a GPU: CUDA's autocast runs layer_norm in fp32 (its fp32 list), "
        "so there the norm's output is fp32, while CPU autocast has no such rule; the rest agree.",
        status="partial",
        missing="CUDA autocast measured (this run had no GPU): the CUDA difference is from PyTorch's autocast op lists",
    )


@answers("2.1.4(c)")
def norm_precision(q, saved):
    err = saved.frame("01_norm_precision").set_index("dtype")["max_rel_error"]
    return (
        f"The mean of squares over 4096 values, rounded in each dtype, is off by at most {err['float32']:.1e} "
        f"(fp32), {err['bfloat16']:.1e} (bf16) and {err['float16']:.1e} (fp16) relative to fp64, and the norm "
        "scales every activation by it. bf16 has fp32's range (no overflow above 65,504 as fp16 has) but only 8 "
        "significant bits, so its error stays large: keep norms and their reductions in fp32 with either."
    )
