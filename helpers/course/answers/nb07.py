"""Notebook 07's questions on activation checkpointing (the 2026 edition) and communication accounting (the 2025
edition), and their answers from what notebook 07 saved. Its FSDP questions (FSDP, its accounting, the ring
all-reduce): nb07_fsdp; the calculators and the leaderboard plan: nb07_calcs."""

from __future__ import annotations

import math

from helpers import formulas
from helpers.course.answers.core import Answer, Question, answers, fmt_mib, fmt_s, register
from helpers.formulas import MiB
from helpers.timing import MIN_PAIRS, Ratio

Q = Question
QUESTIONS = [
    Q(
        "communication_accounting(a)",
        "The FFN-only XXL model (d 16,384, d_ff 53,248, 126 blocks), fp32 states and "
        "bf16 activations: how much memory on one device, and how many 80 GB H100s for the states alone?",
        notebook="07",
        section="§7 The 2025 XXL accounting",
        reads=(),
        editions=(2025,),
        name="communication_accounting",
        gpu="A closed form (`formulas.xxl_memory`): the same on every machine.",
    ),
    Q(
        "communication_accounting(b)",
        "With FSDP over N devices and half the activations sharded, what does each device hold, and what N fits 95 GB?",
        notebook="07",
        section="§7 The 2025 XXL accounting",
        reads=(),
        editions=(2025,),
        name="communication_accounting",
        gpu="A closed form (`formulas.xxl_min_fsdp`): the same on every machine.",
    ),
    Q(
        "communication_accounting(c)",
        "With FSDP over X = 16 × TP over Y = 4 on a TPU-v5p mesh (M_X = 2, M_Y = 1), "
        "forward only: from what per-device batch is it compute-bound, and what is the overall batch?",
        notebook="07",
        section="§7 The 2025 XXL accounting",
        reads=(),
        editions=(2025,),
        name="communication_accounting",
        gpu="A closed form with the handout's C and W (`formulas.xxl_compute_bound`); plug in another device's "
        "figures.",
    ),
    Q(
        "communication_accounting(d)",
        "Which tricks lower that batch while staying compute-bound?",
        notebook="07",
        section="§7 The 2025 XXL accounting",
        reads=(),
        editions=(2025,),
        name="communication_accounting",
        gpu="Reasoning from the same closed form; the same on every machine.",
    ),
    Q(
        "gradient_checkpointing(a)",
        "With nesting allowed, which checkpointing strategy minimises peak activation "
        "memory for N identical blocks, and what are its memory and compute?",
        notebook="07",
        section="§5 Activation checkpointing",
        reads=("07_checkpoint",),
        editions=(2026,),
        name="gradient_checkpointing",
        gpu="The asymptotics carry over; the measured one-level sweep here is a CPU preset.",
    ),
    Q(
        "gradient_checkpointing(b)",
        "One level of recomputation only: the best checkpoint block size, measured against "
        "the next smaller and larger (the handout: xl at batch 4 × 2048)?",
        notebook="07",
        section="§5 Activation checkpointing",
        reads=("07_checkpoint",),
        editions=(2026,),
        name="gradient_checkpointing",
        gpu="The gpu profile measures the 2024/2025 xl at batch 4 × 1024 (`make writeup PROFILE=gpu`); the closed form "
        "covers the 2026 handout's xl (Table 1: 2560/10240/32 layers/32 heads) at 4 × 2048.",
    ),
]
register(QUESTIONS)


@answers("communication_accounting(a)")
def xxl_memory(q, saved):
    m = formulas.xxl_memory(tokens=0)
    per_token = formulas.xxl_activation_bytes_per_token()
    x = formulas.XXL
    return (
        f"Ψ = 126 · 2 · d · d_ff = {m['params'] / 1e9:.1f} B parameters; fp32 weights, gradients and two AdamW "
        f"moments are 16Ψ = {m['states'] / 1e12:.2f} TB on one device, {math.ceil(m['states'] / 80e9)} H100s of "
        f"80 GB. Saved for backward (bf16): each block's two matmul inputs, 2(d + d_ff) = "
        f"{2 * (x['d_model'] + x['d_ff']):,} bytes per token, {per_token / 1e6:.1f} MB per token over the "
        f"126 blocks; for a batch of T tokens, T · {per_token / 1e6:.1f} MB "
        f"(e.g. {formulas.xxl_memory(2048)['activations'] / 1e9:.1f} GB at 2,048 tokens, "
        f"{math.ceil(formulas.xxl_memory(2048)['total'] / 80e9)} H100s with the states)."
    )


@answers("communication_accounting(b)")
def xxl_fsdp(q, saved):
    per_token = formulas.xxl_activation_bytes_per_token()
    cap = formulas.xxl_max_tokens()
    rows = []
    for tokens in (1024, 2048, 4096, 8192, 10_240):
        n = formulas.xxl_min_fsdp(tokens)
        rows.append(
            {
                "tokens per device": f"{tokens:,}",
                "smallest N": n,
                "GB per device at that N": round(formulas.xxl_memory(tokens, n)["total"] / 1e9, 1),
            }
        )
    return Answer(
        f"Per device, for T tokens per device: M(N) = 16Ψ/N + A(1 + 1/N)/2 with A = T · "
        f"{per_token / 1e6:.2f} MB, i.e. {16 * formulas.xxl_memory(0)['params'] / 1e12:.2f} TB/N + T · "
        f"{per_token / 2e6:.2f} MB · (1 + 1/N). It fits 95 GB when N ≥ (16Ψ + A/2)/(95 GB − A/2); as N grows "
        f"M(N) falls to A/2, so no N fits above T = 2 · 95 GB / {per_token / 1e6:.2f} MB ≈ {cap:,.0f} "
        "tokens per device. The smallest N for a few batches:",
        table=tuple(rows),
    )


@answers("communication_accounting(c)")
def xxl_compute_bound(q, saved):
    t, mesh = formulas.TPU_V5P_LIKE, formulas.MESH_2025
    b = formulas.xxl_compute_bound(**mesh)
    return (
        f"Per layer (the Scaling Book's mixed FSDP/TP): T_math = 4BDF/(XYC), the FSDP all-gather "
        f"4DF/(Y·W·M_X), the TP collective 4BD/(X·W·M_Y). FSDP side: compute-bound once B/X ≥ C/(W·M_X) = "
        f"{t['C']:.2g}/({t['W']:.2g} · {mesh['M_X']}) = {b['per_fsdp_shard']:,.0f} tokens per FSDP shard, i.e. "
        f"{b['per_device']:,.0f} tokens per device (B/(XY), Y = {mesh['Y']}); the overall batch is "
        f"B = {mesh['X']} · {b['per_fsdp_shard']:,.0f} ≈ {b['overall']:,.0f} tokens. TP side: compute-bound "
        f"whatever the batch when F ≥ Y·C/(W·M_Y) = {b['tp_min_d_ff']:,.0f}; F = {formulas.XXL['d_ff']:,} "
        f"{'satisfies' if b['tp_ok'] else 'does not satisfy'} it. These bounds let the two axes' collectives overlap "
        f"each other, each hidden under compute on its own; if they cannot (both summed against T_math), the "
        f"overall batch must reach {b['overall_summed']:,.0f} tokens. (The notation and the model are those of "
        "Austin et al., How to Scale Your Model, 2025, the chapter on training.)"
    )


@answers("communication_accounting(d)")
def xxl_tricks(q, saved):
    b = formulas.xxl_compute_bound(**formulas.MESH_2025)
    mesh = formulas.MESH_2025
    more = formulas.xxl_compute_bound(**{**mesh, "Y": 2 * mesh["Y"]})  # more TP, the FSDP axis kept
    moved = formulas.xxl_compute_bound(**{**mesh, "X": mesh["X"] // 2, "Y": 2 * mesh["Y"]})  # same chips, X -> Y
    return (
        f"The bound is B/X ≥ C/(W·M_X): the overall batch is X·C/(W·M_X) = {b['overall']:,.0f} tokens at X = "
        f"{mesh['X']}. To lower it and stay compute-bound: move chips from the FSDP axis to TP (X = {mesh['X'] // 2}, "
        f"Y = {2 * mesh['Y']}, the same {mesh['X'] * mesh['Y']} chips, halves it to {moved['overall']:,.0f} tokens, "
        f"while F = {formulas.XXL['d_ff']:,} ≥ {moved['tp_min_d_ff']:,.0f} keeps the TP side compute-bound); adding "
        f"TP with X kept (Y = {2 * mesh['Y']}) keeps the overall batch at {more['overall']:,.0f} and only spreads it "
        f"over twice the chips ({more['per_device']:,.0f} per device); more links on the FSDP axis (a larger M_X, "
        f"e.g. a wraparound torus axis); gather the weights in a lower precision (int8/fp8 halves the bytes, halving "
        f"{b['per_fsdp_shard']:,.0f} per shard); overlap each layer's gather with the previous layer's compute; or "
        "keep the weights resident (pure TP or pipeline stages) instead of gathering."
    )


def _checkpoint(saved):
    run = saved.run("07_checkpoint")
    return run.frame().set_index("segment"), run.provenance


PREFIX_SKETCH = (  # gradient_checkpointing(a)'s code sketch; tests/test_answers_closed_forms.py runs this very text
    "def prefix(blocks, x): return blocks[0](x) if len(blocks) == 1 else "
    "blocks[-1](checkpoint(prefix, blocks[:-1], x, use_reentrant=False))"
)
STRATEGY_ROWS = {  # name, peak activations in A (one block's saved tensors) and I (one kept input), asymptotics
    "none": ("no checkpointing", "N·A", "O(N) memory, O(N) compute"),
    "sqrt": ("one level, segments of k", "⌈N/k⌉·I + k·A", "O(√N) memory at k = √N, O(N) compute"),
    "nested": ("nested halving", "⌈log₂N⌉·I + A", "O(log N) memory, O(N log N) compute"),
    "prefix": ("recursive prefix checkpointing", "I + A", "O(1) memory, O(N²) compute"),
}


def block_units(p) -> tuple[float, float]:
    """(I, A) in bytes for the run that saved `p` (07_checkpoint's provenance): one block input B·T·d and one block's
    saved activations (formulas.activation_bytes / L), fp32, as notebook 07's model M(k) counts them."""
    cfg = formulas.get_config(p["model"], n_layers=int(p["n_blocks"]))
    block_in = formulas.residual_stream_bytes(int(p["batch"]), int(p["context"]), cfg.d_model)
    return block_in, formulas.activation_bytes(cfg, int(p["batch"]), int(p["context"]))["blocks"] / cfg.n_layers


@answers("gradient_checkpointing(a)")
def nested(q, saved):
    s, p = _checkpoint(saved)
    L = int(p["n_blocks"])
    inp, A = block_units(p)  # bytes of I and A
    strat = formulas.checkpoint_strategies(L, input_ratio=inp / A)
    used = [int(k) for k in s.index if 0 < k < L]  # one level, split: k = L recomputes every block at once
    best = min(used, key=lambda k: s.loc[k, "peak_MiB"])
    counted = {k: formulas.checkpoint_memory(L, k, inp, A) / MiB for k in [0, *used]}
    count_best = min(used, key=lambda k: (counted[k], k))

    def row(name, count_a, measured="not run here (one level only)", k=None):
        label, expr, asymptotics = STRATEGY_ROWS[name]
        return {
            "strategy": label if k is None else f"one level, k = {k}" + (" ≈ √N" if k == round(math.sqrt(L)) else ""),
            "peak activations": expr,
            f"counted, N = {L} here": f"{count_a:.2f} A = {fmt_mib(count_a * A / MiB)}",
            "measured peak": measured,
            "forward passes": round(strat[name]["forward_passes"], 2),
            "asymptotics": asymptotics if k is None or k == round(math.sqrt(L)) else "",
        }

    rows = (
        [row("none", L, fmt_mib(s.loc[0, "peak_MiB"]))]
        + [row("sqrt", counted[k] * MiB / A, fmt_mib(s.loc[k, "peak_MiB"]), k) for k in used]
        + [row(name, strat[name]["memory_blocks"]) for name in ("nested", "prefix")]
    )
    gap = [float(s.loc[k, "peak_MiB"]) - counted[k] for k in used]
    grads = formulas.param_bytes(formulas.get_config(p["model"], n_layers=L)) / MiB
    agree = (
        f"both least at k = {best}"
        if best == count_best
        else f"the measured peak least at k = {best}, the count at k = {count_best}"
    )
    held = (
        "less than the parameters' gradients a peak late in backward partly holds"
        if max(gap) <= grads
        else "more than even all the parameters' gradients: backward's temporaries too"
    )
    return Answer(
        "Ignoring compute, the least peak is recursive prefix checkpointing: keep only the model's input and, before "
        "each block's backward (last first), re-run the forward from it up to that block, so only the input and one "
        "block's activations are alive: O(1) peak, N(N+1)/2 block forwards, O(N²) compute. Sketch (each prefix "
        f"checkpointed inside the next): `{PREFIX_SKETCH}`, called as `prefix(blocks, x)`; the tests run it (same "
        "gradients, N(N+1)/2 block forwards, a peak flat in N). Unit of the table: A = the tensors one block saves "
        f"for backward, I = one kept block input; here ({p['model']}, batch {p['batch']} × {p['context']}, fp32) "
        f"A = {fmt_mib(A / MiB)}, I = {inp / A:.3f} A. Measured one level against the same count: {agree}; measured "
        f"− counted is {float(s.loc[0, 'peak_MiB']) - counted[0]:+.1f} MiB without checkpointing, {min(gap):+.1f} to "
        f"{max(gap):+.1f} MiB with it: the count is activations only, and the gap is {held} "
        f"({fmt_mib(grads)}).",
        table=tuple(rows),
    )


def checkpoint_ratio(row, provenance) -> Ratio:
    """A 07_checkpoint row's step time over no checkpointing's, with the pairs it was measured on (the run's steps)."""
    return Ratio(float(row["time / none"]), float(row["low"]), float(row["high"]), int(provenance.get("steps") or 0))


def checkpoint_noise(r: Ratio) -> str:
    """Why a checkpointing ratio names no difference: too few paired steps, or an interval that includes 1."""
    if not r.enough:
        return f"{r.pairs} paired steps, fewer than the {MIN_PAIRS} a comparison needs (`timing.MIN_PAIRS`)"
    return "the paired interval includes 1"


@answers("gradient_checkpointing(b)")
def best_block(q, saved):
    s, p = _checkpoint(saved)
    used = [k for k in s.index if k > 0]
    best = int(s.loc[used, "peak_MiB"].idxmin())
    near = [
        k
        for k in (max([k for k in used if k < best], default=None), min([k for k in used if k > best], default=None))
        if k is not None
    ]
    rows = tuple(
        {
            "segment size k": int(k),
            "peak": fmt_mib(s.loc[k, "peak_MiB"]),
            "median step": fmt_s(s.loc[k, "median_ms"] / 1e3),
            "step time / none [95% interval]": f"{s.loc[k, 'time / none']:.2f}x "
            f"[{s.loc[k, 'low']:.2f}-{s.loc[k, 'high']:.2f}]",
        }
        for k in [0, best] + near
    )
    r = checkpoint_ratio(s.loc[best], p)
    flops_say = 4 / 3  # one more forward on a step of three forwards' FLOPs
    against = "above" if r.low > flops_say else "below" if r.high < flops_say else "consistent with"
    xl = formulas.get_config("xl-2026", context_length=2048)
    block_input = formulas.residual_stream_bytes(4, 2048, xl.d_model)  # I
    block_saved = formulas.activation_bytes(xl, 4, 2048)["blocks"] / xl.n_layers  # A
    k_cont, k_int = formulas.best_segment(xl.n_layers, block_input, block_saved)
    return Answer(
        f"The 2026 handout's xl (Table 1: d {xl.d_model}, d_ff {xl.d_ff}, {xl.n_layers} layers, "
        f"{xl.n_heads} heads) at batch 4 × 2048, fp32, with the handout's block as the course's staff code "
        f"computes it (cs336-basics: SwiGLU with SiLU as x·sigmoid(x), RoPE, softmax as exp / sum keeping the exp "
        f"and its output; I = one block input, {fmt_mib(block_input / 2**20)}, A = its saved activations, "
        f"{fmt_mib(block_saved / 2**20)}, `formulas.block_saved_parts`): "
        f"k* = √(L·I/A) = {k_cont:.2f}, best integer k = {k_int}, since one block's "
        f"activations outweigh its input. Measured here ({p.get('model')}, {p.get('n_blocks')} blocks, batch "
        f"{p.get('batch')} × {p.get('context')}): the lowest peak is at k = {best} (the model's optimum there "
        f"{float(p['k_continuous']):.2f}). The price is one more forward, about a third of a step in FLOPs; "
        f"measured at k = {best} it is {s.loc[best, 'time / none']:.2f}x the step "
        f"[{s.loc[best, 'low']:.2f}-{s.loc[best, 'high']:.2f}], "
        + (
            f"{'measurably slower' if r.median > 1 else 'measurably faster'}, {against} the {flops_say:.2f}x the "
            "FLOPs predict"
            if r.beyond()
            else f"no measurable difference: {checkpoint_noise(r)}"
        )
        + ". k against its neighbours:",
        table=rows,
        status="partial",
        missing="the handout's xl measured at 4 × 2048 needs a GPU; here a CPU preset and the closed form",
    )
