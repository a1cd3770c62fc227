"""Notebook 07's closed-form questions of the 2026 edition: the four calculators (data parallel, FSDP, tensor
parallel, FSDP + TP: FLOPs, communication and the compute-bound inequality of one gated FFN, with a worked example)
and the leaderboard plan; answered from `formulas`, the same on every machine."""

from __future__ import annotations

import math
from dataclasses import replace

from helpers import formulas
from helpers.course.answers.core import (
    READ_ERRORS,
    Answer,
    NotMeasured,
    Question,
    Reference,
    answers,
    fmt_s,
    register,
)
from helpers.published import MARKS

Q = Question
QUESTIONS = [
    Q(
        "data_parallel_calcs",
        "One gated FFN (x W1, x W2, f(x1) ∗ x2, z W3), 16-bit, data-parallel over N_DP devices: FLOPs and "
        "communication per device in B, D, D_FF, N_DP, and the inequality in N_DP that keeps it compute-bound?",
        notebook="07",
        section="§7 Calculators",
        reads=(),
        editions=(2026,),
        name="data_parallel_calcs",
        gpu="Closed forms in C and W; the worked example uses H100-like figures (plug in a B200's for the 2026 "
        "handout).",
    ),
    Q(
        "fsdp_calcs",
        "The same FFN under FSDP over N_FSDP devices: FLOPs, communication and the compute-bound "
        "inequality, forward and backward?",
        notebook="07",
        section="§7 Calculators",
        reads=(),
        editions=(2026,),
        name="fsdp_calcs",
        gpu="Closed forms in C and W; the worked example uses H100-like figures.",
    ),
    Q(
        "tp_calcs(a)",
        "The same FFN under tensor parallelism (W1, W2 by columns, W3 by rows): the backward equations, "
        "and FLOPs and communication per device, forward and backward?",
        notebook="07",
        section="§7 Calculators",
        reads=(),
        editions=(2026,),
        name="tp_calcs",
        gpu="Closed forms in C and W; the worked example uses H100-like figures.",
    ),
    Q(
        "tp_calcs(b)",
        "Up to how many TP devices does it stay compute-bound, forward and backward?",
        notebook="07",
        section="§7 Calculators",
        reads=(),
        also_reads=("08_tp_speed",),  # notebook 08's measured TP steps join the closed form when saved here
        editions=(2026,),
        name="tp_calcs",
        gpu="Closed forms in C and W; the worked example uses H100-like figures.",
    ),
    *[
        Q(
            f"fsdp_tp_calcs{part}",
            ask,
            notebook="07",
            section="§7 Calculators",
            reads=(),
            also_reads=() if part == "(a)" else ("08_tp_speed",),  # notebook 08's TP axis measured, when saved here
            editions=(2026,),
            name="fsdp_tp_calcs",
            gpu="Closed forms in C and W; the worked example uses H100-like figures.",
        )
        for part, ask in (
            ("(a)", "FSDP × TP (N = N_FSDP · N_TP), forward pass: FLOPs per device?"),
            ("(b)", "Forward communication time per device?"),
            ("(c)", "With communication overlapped: the most devices N that stay compute-bound?"),
            ("(d)", "Without overlap: the most devices N that stay compute-bound?"),
        )
    ],
    Q(
        "2026 leaderboard",
        "The fastest full AdamW step of the ~8B model (d 4096, d_ff 11,008, 34 layers, vocabulary "
        "151,936, batch 2 × 32,768) on two GPUs: which plan fits, and how fast can it be?",
        notebook="07",
        section="§8 The 2026 leaderboard as a plan",
        reads=(),
        editions=(2026,),
        name="leaderboard",
        gpu="A plan from closed forms at a stated MFU and link bandwidth; timing it needs two GPUs with a trainer of "
        "this model, which the companion does not ship.",
        references=(Reference.of(MARKS["leaderboard_2026_best"]), Reference.of(MARKS["leaderboard_2026_baseline"])),
    ),
]
register(QUESTIONS)


def _m(text: str) -> str:
    """An expression set as math on the page."""
    return f"${text}$"


def _example(c) -> str:
    """The worked example's inputs, as the handout names them."""
    e = c.example
    ins = ", ".join(
        f"{k} {e[k]:,}" if isinstance(e[k], int) else f"{k} {e[k]:.3g}"
        for k in ("B", "D", "D_FF", "N_DP", "N_FSDP", "N_TP", "C", "W")
        if k in e
    )
    return ins


def _calc_rows(parts) -> tuple:
    """One row per quantity: pass, quantity, expression (math), and the worked example's value."""
    rows = []
    for c in parts:
        e = c.example
        value = {
            "FLOPs per device": f"{e.get('flops', 0) / 1e12:.3g} TFLOP ({fmt_s(e['compute_s'])})",
            "forward FLOPs per device": f"{e.get('flops', 0) / 1e12:.3g} TFLOP ({fmt_s(e['compute_s'])})",
            "bytes sent per device": f"{e.get('bytes_sent', 0) / 1e9:.3g} GB ({fmt_s(e.get('comm_s', 0))})",
            "FSDP all-gather time": fmt_s(e.get("fsdp_comm_s", 0)),
            "TP all-reduce time": fmt_s(e.get("tp_comm_s", 0)),
            "communication time": fmt_s(e.get("comm_s", 0)),
        }
        for quantity, expr in c.expressions:
            rows.append(
                {
                    "pass / part": c.part,
                    "quantity": quantity,
                    "expression": _m(expr),
                    "worked example": value.get(quantity, ""),
                }
            )
        if c.inequality != "—":
            bound = e.get("max_devices")
            rows.append(
                {
                    "pass / part": c.part,
                    "quantity": "compute-bound while",
                    "expression": _m(c.inequality),
                    "worked example": "always" if bound in (None, math.inf) else f"N ≤ {bound:.1f}",
                }
            )
    return tuple(rows)


def _calc_answer(parts, head: str) -> Answer:
    """The head sentence and the worked example's inputs (the variables are named once, in CALC_VARIABLES); the
    expressions in the table below."""
    return Answer(
        f"{head} Worked example: {_example(parts[0])}.",
        table=_calc_rows(parts),
    )


CALC_VARIABLES = (  # said once, in the 2026 edition's note, for the four calculators
    "The calculators (data_parallel_calcs, fsdp_calcs, tp_calcs, fsdp_tp_calcs) write B for the global batch in "
    "tokens, with 16-bit weights and activations, C FLOP/s and W bytes/s of egress per device; each worked example "
    "uses `formulas.CALC_EXAMPLE` (H100-like)."
)


@answers("data_parallel_calcs")
def dp_calcs(q, saved):
    parts = [formulas.dp_calc(p, **formulas.CALC_EXAMPLE) for p in ("forward", "backward")]
    return _calc_answer(
        parts,
        f"Forward needs no communication; backward all-reduces the gradients. Compute-bound "
        f"while {_m(parts[1].inequality)}.",
    )


@answers("fsdp_calcs")
def fsdp_calcs(q, saved):
    parts = [formulas.fsdp_calc(p, **formulas.CALC_EXAMPLE) for p in ("forward", "backward")]
    return _calc_answer(
        parts,
        "Forward all-gathers the weights, backward gathers them again and reduce-scatters the "
        f"gradients: both passes give {_m('N_FSDP ≤ 1 + B·W/C')}.",
    )


@answers("tp_calcs(a)")
def tp_equations(q, saved):
    parts = [formulas.tp_calc(p, **formulas.CALC_EXAMPLE) for p in ("forward", "backward")]
    eqs = "; ".join(_m(e) for e in formulas.TP_BACKWARD_EQUATIONS)
    return _calc_answer(
        parts,
        f"Device i holds W1, W2 by columns and W3 by rows. {eqs}. Backward does 12·B·D·D_FF/N_TP "
        "FLOPs (two matmuls per forward one) and one all-reduce of dx, forward one of y.",
    )


@answers("tp_calcs(b)")
def tp_bounds(q, saved):
    parts = [formulas.tp_calc(p, **formulas.CALC_EXAMPLE) for p in ("forward", "backward")]
    fwd, bwd = (c.example["max_devices"] for c in parts)
    tighter = "forward" if fwd < bwd else "backward"
    got = _calc_answer(
        parts,
        f"Forward: {_m(parts[0].inequality)}; backward: {_m(parts[1].inequality)}. The "
        f"{tighter} bound is the tighter ({fwd:.1f} against {bwd:.1f} devices in the example): "
        "forward does half the FLOPs for the same all-reduce." + _tp_measured(saved),
    )
    return replace(got, status="closed form")  # the handout asks the closed form; notebook 08's runs check it


def _tp_speed(saved):
    """Notebook 08's saved tensor-parallel FFN steps (08_tp_speed) as (rows, provenance), or None when it has not run
    here or was saved in a format these answers do not read: they stay closed forms without it."""
    try:
        run = saved.run("08_tp_speed")
        t, p = run.frame(), run.provenance
        t[["d_ff", "comm_ms", "model_comm_ms", "comm_share", "model_comm_share", "d_ff_star", "holds"]]  # all read
        float(p["alpha_s"]), float(p["beta_Bps"]), int(p["world"])
    except (NotMeasured, *READ_ERRORS):
        return None
    return t, p


def _tp_measured(saved) -> str:
    """Notebook 08's tensor-parallel FFN steps against the same α-β model, when it has run here ("" otherwise)."""
    got = _tp_speed(saved)
    if got is None:
        return ""
    t, p = got
    held = t.loc[t["holds"].astype(bool), "d_ff"].astype(int).tolist()
    shares = ", ".join(
        f"d_ff {int(r['d_ff'])}: {r['comm_share']:.0%} measured / {r['model_comm_share']:.0%} modelled"
        for r in t.to_dict("records")
    )
    return (
        f" Measured here (notebook 08: a column- then row-parallel FFN on {p.get('world')} ranks, α = "
        f"{float(p['alpha_s']) * 1e6:.0f} µs and β = {float(p['beta_Bps']) / 1e9:.2f} GB/s fitted to its all-reduces): "
        f"the model puts the communication-bound width at d_ff ≈ {float(t['d_ff_star'].median()):.0f}; the share of "
        f"each step spent communicating, {shares}; "
        + (f"the model holds at d_ff {', '.join(map(str, held))}." if held else "the model held at no width here.")
    )


def _fsdp_tp(part):
    ex = formulas.CALC_EXAMPLE
    return formulas.fsdp_tp_calc(part, B=ex["B"], D=ex["D"], D_FF=ex["D_FF"], N_FSDP=2, N_TP=4, C=ex["C"], W=ex["W"])


@answers("fsdp_tp_calcs(a)", "fsdp_tp_calcs(b)", "fsdp_tp_calcs(c)", "fsdp_tp_calcs(d)")
def fsdp_tp_calcs(q, saved):
    part = q.number[len("fsdp_tp_calcs") :]
    c = _fsdp_tp(part)
    head = {
        "(a)": f"Forward FLOPs per device: {_m(c.expressions[0][1])}.",
        "(b)": "The FSDP all-gather (over N_FSDP, of the device's 1/N_TP of the weights) and TP's all-reduce (over "
        "N_TP, of its B/N_FSDP tokens' output) run on different axes at once, so the forward communication "
        f"time is the larger: {_m('max(6·D·D_FF·(N_FSDP−1)/(N_FSDP·N_TP·W), 4·B·D·(N_TP−1)/(N_FSDP·N_TP·W))')}.",
        "(c)": f"With overlap it is compute-bound while compute outlasts each term: {_m('N_FSDP ≤ B·W/C')} and "
        f"{_m('N_TP ≤ 1.5·D_FF·W/C')}, so {_m(c.inequality)} (rings' (N−1)/N taken as 1).",
        "(d)": "Without overlap compute must outlast their sum; the product N_FSDP·N_TP is largest with each term at "
        f"half the compute, so {_m(c.inequality)} (rings' (N−1)/N taken as 1), a quarter of (c)'s.",
    }[part]
    got = _calc_answer([c], head)
    more, rows = _fsdp_tp_measured(part, saved)
    return replace(got, text=got.text + more, table=got.table + rows)


MEASURED = "measured here (notebook 08)"  # the column the measured rows fill, beside the worked example's


def _fsdp_tp_measured(part: str, saved) -> tuple[str, tuple]:
    """fsdp_tp_calcs's parts that notebook 08's TP runs check, when saved here: one sentence and the measured rows
    (("", ()) otherwise, and for (a), whose FLOPs it does not count). Its runs are the TP axis alone (N_FSDP = 1,
    so the FSDP term is zero) without overlap: (b)'s TP all-reduce and (d)'s sum; (c) only says why it is not
    checked. Its two-matrix FFN's training step does 12·B·D·D_FF/N FLOPs per two all-reduces, the 6·B·D·D_FF/N per
    all-reduce of the gated FFN's forward that these parts count, so the inequality is the same."""
    got = _tp_speed(saved) if part != "(a)" else None
    if got is None:
        return "", ()
    t, p = got
    N, alpha = int(p["world"]), float(p["alpha_s"])
    one = t["model_comm_ms"].astype(float) / 2e3  # the α-β model's all-reduce, s (the same at every width)
    bw = float(one.median()) - alpha  # its bandwidth term alone: the handout's, which leaves α out
    shape = f", {p['tokens']} tokens of width {p['d_model']}" if {"tokens", "d_model"} <= set(p) else ""
    where = (
        f" Measured here (notebook 08: the TP axis alone, N_FSDP = 1 and N_TP = {N}{shape} in fp32, α = "
        f"{alpha * 1e6:.0f} µs and β = {float(p['beta_Bps']) / 1e9:.2f} GB/s fitted to its all-reduces; rows below)"
    )
    if part == "(c)":
        return (
            where + ": its all-reduces run between its matmuls, not beside them, so its runs check (d)'s sum, not "
            "this overlapped bound.",
            (),
        )
    if part == "(b)":
        meas = t["comm_ms"].astype(float) / 2e3  # the step's communication, per all-reduce (g forward, f backward)
        alone = p.get("all_reduce_s")  # one all-reduce of S bytes timed alone (the same tensor at every width)
        step = (
            f"inside the TP steps the communication per all-reduce reads {fmt_s(float(meas.min()))}-"
            f"{fmt_s(float(meas.max()))} over the widths, though the tensor is the same S bytes at every width: that "
            "figure includes a rank waiting for its peer to finish its matmuls, not the all-reduce alone"
        )
        if alone is None:
            head = f": {step}; the α-β model's all-reduce is {fmt_s(float(one.median()))}"
            value = f"{fmt_s(float(one.median()))} (the α-β model; no all-reduce timed alone in this run)"
        else:
            head = (
                f": one all-reduce of S bytes timed alone takes {fmt_s(float(alone))}, against the α-β model's "
                f"{fmt_s(float(one.median()))} ({float(alone) / float(one.median()):.2f}x it); {step}"
            )
            value = f"{fmt_s(float(alone))} timed alone (model {fmt_s(float(one.median()))}, of which α {fmt_s(alpha)})"
        return (
            where + head + f". α is {alpha / float(one.median()):.0%} of the model, which the handout's "
            f"bandwidth-only term ({fmt_s(bw)}) leaves out.",
            (
                {
                    "pass / part": "(b) measured",
                    "quantity": "TP all-reduce time of S bytes",
                    "expression": _m("α + 2·(N_TP−1)/N_TP·S/β, S = B·D·4 bytes"),
                    MEASURED: value,
                },
            ),
        )
    star = float(t["d_ff_star"].astype(float).median())
    star_bw = star * bw / (alpha + bw)  # the same point with α = 0, the handout's model
    bound = t.loc[t["comm_share"].astype(float) < 0.5, "d_ff"].astype(int).tolist()
    held = t.loc[t["holds"].astype(bool), "d_ff"].astype(int).tolist()
    tol = f" (±{float(p['share_tol']):g})" if "share_tol" in p else ""
    rows = tuple(
        {
            "pass / part": "(d) measured",
            "quantity": f"share of a step communicating, d_ff {int(r['d_ff'])}",
            "expression": _m("comm/(compute + comm)"),
            MEASURED: f"{float(r['comm_share']):.0%} measured / {float(r['model_comm_share']):.0%} α-β model: "
            + ("holds" if bool(r["holds"]) else "does not hold")
            + tol,
        }
        for r in t.to_dict("records")
    ) + (
        {
            "pass / part": "(d) measured",
            "quantity": f"compute-bound at N_TP = {N}, N_FSDP = 1",
            "expression": _m("D_FF ≥ N·C·2(α + 2(N−1)/N·S/β)/(12·B·D)"),
            MEASURED: f"model: d_ff ≥ {star:.0f} (≥ {star_bw:.0f} with α = 0); measured (share under half): "
            + (f"d_ff {', '.join(map(str, bound))}" if bound else "at no width"),
        },
    )
    return (
        where + f": without an FSDP axis the sum is TP's all-reduce alone (the two-matrix FFN's training step does "
        f"{_m('6·B·D·D_FF/N')} FLOPs per all-reduce, as this gated forward does), and the α-β model puts the "
        f"compute-bound width at d_ff ≈ {star:.0f} ({star_bw:.0f} without α); it holds{tol} at "
        + (f"d_ff {', '.join(map(str, held))}" if held else "no width")
        + (
            f" and not at d_ff {', '.join(str(int(f)) for f in t['d_ff'] if int(f) not in held)}."
            if len(held) < len(t)
            else "."
        ),
        rows,
    )


def plan_name(r: dict) -> str:
    """A plan row in words."""
    return f"{r['strategy']}, {r['checkpointing']} checkpointing, {r['head']} LM head + cross-entropy, {r['precision']}"


STATE_BYTES = {p: 2 + 2 + b for p, b in formulas.PLAN_PRECISIONS.items()}  # bf16 weights + gradients + optimizer


@answers("2026 leaderboard")
def leaderboard_2026(q, saved):
    best = MARKS["leaderboard_2026_best"]
    gpus, lm = formulas.LEADERBOARD_GPUS, formulas.LEADERBOARD_MODEL
    b200 = next(g for g in gpus if g.startswith("B200"))
    no_ckpt = formulas.llama_train_flops(**lm)
    ckpt = formulas.llama_train_flops(**lm, segments=lm["n_layers"])
    implied = [
        formulas.implied_mfu(best.value / 1e3, fl, peak_flops=gpus[b200]["flops"], world_size=lm["world_size"])
        for fl in (no_ckpt, ckpt)
    ]
    plan = formulas.leaderboard_plan(mfus=sorted({*formulas.PLAN_MFUS, *implied}))
    rows, picked = [], {}
    for gpu in gpus:
        pick = picked[gpu] = formulas.fastest_plan(plan, gpu)  # the tie rule the sentence states, nothing else
        if pick is None:
            rows.append({"GPU": gpu, "plan": f"none fits with {formulas.PLAN_MARGIN:.0%} of the card free"})
            continue
        same = [r for r in plan if all(r[k] == pick[k] for k in ("strategy", "checkpointing", "head"))]
        for r in sorted(same, key=lambda r: r["memory_GB"]):
            band = r["step_band_s"][gpu]
            rows.append(
                {
                    "GPU": gpu,
                    "plan": plan_name(r).rsplit(", ", 1)[0],
                    "precision (B/param)": f"{r['precision']} ({STATE_BYTES[r['precision']]})",
                    "GB per GPU": round(r["memory_GB"], 1),
                    "fits": "yes" if r["fits"][gpu] else "no",
                    f"s at MFU {formulas.LEADERBOARD_MFU:.0%}": round(r["step_s"][gpu], 2),
                    f"s over MFU {min(formulas.PLAN_MFUS):.0%}-{max(formulas.PLAN_MFUS):.0%}": (
                        f"{band[max(formulas.PLAN_MFUS)]:.2f}-{band[min(formulas.PLAN_MFUS)]:.2f}"
                    ),
                    "s at the MFU the best implies": f"{band[max(implied)]:.2f}-{band[min(implied)]:.2f}",
                    "chosen": "yes" if r is pick else "",
                }
            )
    chosen = sorted({p["precision"] for p in picked.values() if p})
    same_time = all(  # in this model the optimizer's precision changes memory only, never the predicted time
        r["step_s"] == p["step_s"]
        for p in picked.values()
        if p
        for r in plan
        if all(r[k] == p[k] for k in ("strategy", "checkpointing", "head"))
    )
    return Answer(
        "The handout's Config is all bf16 (`torch_dtype = torch.bfloat16`, a stock AdamW on the model's parameters, "
        f"whose moments take their dtype): {STATE_BYTES[formulas.HANDOUT_PRECISION]} B of state per parameter, no "
        f"fp32 master. Plans (`formulas.leaderboard_plan`: Ψ = {plan[0]['params'] / 1e9:.2f} B, "
        f"{no_ckpt / 1e15:.1f} PFLOP per step, {ckpt / 1e15:.1f} recomputing every block) fit with "
        f"{formulas.PLAN_MARGIN:.0%} of the card free; predicted times within {formulas.PLAN_TIE:.0%} are a tie won "
        f"by less memory (`formulas.fastest_plan`), which picks {' and '.join(chosen)} here"
        + ("; fp32 moments or masters only add memory in this model" if same_time else "")
        + f". The published best ({best.value:g} ms on 2× B200, {best.status.split(':')[0]}) implies MFU "
        f"{min(implied):.0%}-{max(implied):.0%} "
        "(without / with recomputing every block).",
        table=tuple(rows),
        status="partial",
        missing="a plan from closed forms; timing it needs two GPUs and a trainer of this model",
    )
