"""Notebook 07's questions (the 2026 edition's activation checkpointing, FSDP, ring all-reduce, the four calculators and
the leaderboard plan; the 2025 edition's communication accounting) and their answers from what notebook 07 saved."""
from __future__ import annotations

import math

from helpers import formulas
from helpers.course.answers.core import Question, Reference, answers, compare_text, fmt_mib, fmt_s, pct, register
from helpers.published import MARKS
from helpers.timing import Ratio

Q = Question
CALCS = {"data_parallel_calcs": "dp", "fsdp_calcs": "fsdp", "tp_calcs": "tp", "fsdp_tp_calcs": "fsdp_tp"}
QUESTIONS = [
    Q("communication_accounting(a)", "The FFN-only XXL model (d 16,384, d_ff 53,248, 126 blocks), fp32 states and "
      "bf16 activations: how much memory on one device, and how many 80 GB H100s for the states alone?",
      notebook="07", section="§7 The 2025 XXL accounting", reads=(), editions=(2025,), name="communication_accounting",
      gpu="A closed form (`formulas.xxl_memory`): the same on every machine."),
    Q("communication_accounting(b)", "With FSDP over N devices and half the activations sharded, what does each "
      "device hold, and what N fits 95 GB?",
      notebook="07", section="§7 The 2025 XXL accounting", reads=(), editions=(2025,), name="communication_accounting",
      gpu="A closed form (`formulas.xxl_min_fsdp`): the same on every machine."),
    Q("communication_accounting(c)", "With FSDP × TP on a TPU-v5p-like mesh, from what per-device batch is it "
      "compute-bound, and how could the batch be lowered while staying compute-bound?",
      notebook="07", section="§7 The 2025 XXL accounting", reads=(), editions=(2025,), name="communication_accounting",
      gpu="A closed form with the assumed C and W (`formulas.TPU_V5P_LIKE`); plug in another device's figures."),
    Q("gradient_checkpointing(a)", "With nesting allowed, which checkpointing strategy minimises peak activation "
      "memory for N identical blocks, and what are its memory and compute?",
      notebook="07", section="§5 Activation checkpointing", reads=("07_checkpoint",), editions=(2026,),
      name="gradient_checkpointing",
      gpu="The asymptotics carry over; the measured one-level sweep here is a CPU preset."),
    Q("gradient_checkpointing(b)", "One level of recomputation only: the best checkpoint block size, measured against "
      "the next smaller and larger (the handout: xl at batch 4 × 2048)?",
      notebook="07", section="§5 Activation checkpointing", reads=("07_checkpoint",), editions=(2026,),
      name="gradient_checkpointing",
      gpu="The gpu profile measures xl at batch 4 × 1024 (`make writeup PROFILE=gpu`); the answer's closed form covers "
          "the handout's 4 × 2048."),
    Q("fsdp", "A wrapper that shards every Linear and Embedding weight, gathers with bounded prefetch, reduce-scatters "
      "gradients, keeps fp32 master weights under a compute dtype: does it train like one process?",
      notebook="07", section="§1 Correctness", reads=("07_equivalence",), editions=(2026,), name="fsdp",
      gpu="Carries over: the bound is float arithmetic and covers any reduction order, NCCL's included."),
    Q("fsdp_accounting(a)", "What peak-memory saving does FSDP give, against DDP and ZeRO-1?",
      notebook="07", section="§2 Memory per rank", reads=("07_zero_check", "07_memory"), editions=(2026,),
      name="fsdp_accounting",
      gpu="The accounting carries over exactly; the sizes scale with the model."),
    Q("fsdp_accounting(b)", "Does each weight's all-gather finish in time for its forward (trace evidence)?",
      notebook="07", section="§3 Bytes and timeliness", reads=("07_gather_timeliness",), editions=(2026,),
      name="fsdp_accounting",
      gpu="Does not carry over: gloo on CPU shares cores with compute; xl on two GPUs with NCCL needs "
          "`make writeup PROFILE=gpu` on a two-GPU machine."),
    Q("alternate_ring_all_reduce", "An all-reduce that forwards each original chunk instead of a partial sum: its "
      "time in S, N, W, against the ring's 2(N−1)/N · S/W?",
      notebook="07", section="§6 Ring all-reduce by hand", reads=("07_ring",), editions=(2026,),
      name="alternate_ring_all_reduce",
      gpu="The formulas carry over; the fitted α and W here are gloo on one host's loopback."),
    *[Q(name, f"One gated FFN (x W1, x W2, f(x1) ∗ x2, z W3), fp16: backward FLOPs and communication time under "
        f"{kind.upper().replace('_', ' × ')}, and where it turns communication-bound?",
        notebook="07", section="§7 Calculators", reads=("07_ffn_calcs",), editions=(2026,), name=name,
        gpu="Closed forms with the stated C and W (H100-like); plug in a B200's for the 2026 handout.")
      for name, kind in CALCS.items()],
    Q("2026 leaderboard", "The fastest full AdamW step of the ~8B model (d 4096, d_ff 11,008, 34 layers, vocabulary "
      "151,936, batch 2 × 32,768) on two GPUs: which plan fits, and how fast can it be?",
      notebook="07", section="§8 The 2026 leaderboard as a plan", reads=(), editions=(2026,), name="leaderboard",
      gpu="A plan from closed forms at a stated MFU and link bandwidth; timing it needs two GPUs with a trainer of "
          "this model, which the companion does not ship.",
      references=(Reference.of(MARKS["leaderboard_2026_best"]), Reference.of(MARKS["leaderboard_2026_baseline"]))),
]
register(QUESTIONS)


@answers("communication_accounting(a)")
def xxl_memory(q, saved):
    m = formulas.xxl_memory(tokens=0)
    return (f"Ψ = 126 · 2 · d · d_ff = {m['params'] / 1e9:.1f} B parameters; fp32 weights, gradients and two AdamW "
            f"moments are 16Ψ = {m['states'] / 1e12:.2f} TB on one device, {math.ceil(m['states'] / 80e9)} H100s of "
            "80 GB for the states alone; the bf16 activations add 2(d + d_ff) bytes per token per block.")


@answers("communication_accounting(b)")
def xxl_fsdp(q, saved):
    tokens = 2048
    n = formulas.xxl_min_fsdp(tokens)
    m = formulas.xxl_memory(tokens, n)
    return (f"Per device M(N) = 16Ψ/N + A(1 + 1/N)/2, A = 126 · tokens · 2(d + d_ff) bytes. For {tokens} tokens "
            f"(A = {formulas.xxl_memory(tokens)['activations'] / 1e9:.0f} GB) it fits 95 GB from N = {n} "
            f"({m['total'] / 1e9:.1f} GB each).")


@answers("communication_accounting(c)")
def xxl_compute_bound(q, saved):
    t = formulas.TPU_V5P_LIKE
    per = formulas.xxl_compute_bound_tokens(n_tp=4)
    return (f"A block's forward does 4·b·d·d_ff/Y FLOPs per device while its weights' all-gather moves about "
            f"4·d·d_ff/Y bytes, so with C = {t['C']:.1e} FLOP/s and W = {t['W']:.1e} B/s it is compute-bound once "
            f"b ≥ C/W = {t['C'] / t['W']:.0f} tokens per FSDP replica, {per:.0f} per device with TP 4. To lower the "
            "batch and stay compute-bound: more TP (fewer bytes per device per token), gather in bf16 or lower, "
            "overlap the next layer's gather with this one's compute, or keep weights resident (pure TP/pipeline).")


def _checkpoint(saved):
    run = saved.run("07_checkpoint")
    return run.frame().set_index("segment"), run.provenance


@answers("gradient_checkpointing(a)")
def nested(q, saved):
    s, p = _checkpoint(saved)
    L = int(p["n_blocks"])
    strat = formulas.checkpoint_strategies(L)
    best = int(s.loc[s.index > 0, "peak_MiB"].idxmin())
    return (f"Nested halving: checkpoint the midpoint, recurse into each half, log₂N levels; peak activation memory "
            f"O(log N) blocks for O(N log N) compute (each level re-runs its forward once). One level with √N "
            f"segments gives O(√N) memory for one extra forward. For N = {L}: none keeps "
            f"{strat['none']['memory_blocks']} blocks' activations, √N segments {strat['sqrt']['memory_blocks']}, "
            f"nested {strat['nested']['memory_blocks']} ({strat['nested']['forward_passes']} forward passes). "
            f"Measured here, one level ({p.get('model')}, {L} blocks): {fmt_mib(s.loc[0, 'peak_MiB'])} without, "
            f"{fmt_mib(s.loc[best, 'peak_MiB'])} at the best segment size {best}.")


@answers("gradient_checkpointing(b)")
def best_block(q, saved):
    s, p = _checkpoint(saved)
    used = [k for k in s.index if k > 0]
    best = int(s.loc[used, "peak_MiB"].idxmin())
    near = [k for k in (max([k for k in used if k < best], default=None), min([k for k in used if k > best],
                                                                            default=None)) if k is not None]
    ratio = lambda k: Ratio(s.loc[k, "time / none"], s.loc[k, "low"], s.loc[k, "high"], int(p["steps"]))  # noqa
    parts = [f"k {k}: {fmt_mib(s.loc[k, 'peak_MiB'])} peak, {fmt_s(s.loc[k, 'median_ms'] / 1e3)} per step"
             for k in [best] + near]
    timing = "; ".join(compare_text(f"k {k}", "no checkpointing", ratio(k), "step time") for k in [best] + near)
    xl = formulas.get_config("xl")
    I = formulas.residual_stream_bytes(4, 2048, xl.d_model)
    A = formulas.activation_bytes(formulas.get_config("xl", context_length=2048), 4, 2048)["blocks"] / xl.n_layers
    k_cont, k_int = formulas.best_segment(xl.n_layers, I, A)
    return (f"{p.get('model')}, {p.get('n_blocks')} blocks, batch {p.get('batch')} × {p.get('context')}: the lowest "
            f"peak is at segment size {best} (the model's optimum √(L·I/A) = {float(p['k_continuous']):.2f}): "
            + "; ".join(parts) + f". {timing}. For the handout's xl at 4 × 2048 (fp32) the same model gives "
            f"k* = {k_cont:.2f}, best integer {k_int}.")


@answers("fsdp")
def fsdp_equivalence(q, saved):
    e = saved.frame("07_equivalence")
    ok = (e["max_diff/bound"] <= 1).all() and e["replicated_equal"].all()
    one = e[e["ranks"] == 1]["bitwise"].all()
    return (f"{'Yes' if ok else 'No'}: `helpers.fsdp.FSDP` over {', '.join(sorted(set(e['dtype'])))} on "
            f"{int(e['ranks'].max())} ranks stays within the derived rounding bound of one process (largest "
            f"diff/bound {e['max_diff/bound'].max():.2g}), the replicated gains end equal on every rank, and with one "
            f"rank it is {'bitwise' if one else 'not bitwise'} plain PyTorch. Forward gathers the next layer only once "
            "the one two before has finished (bounded prefetch); backward gathers again and reduce-scatters each "
            "gradient when it is ready; fp32 master weights with a stock AdamW on each shard.")


@answers("fsdp_accounting(a)")
def fsdp_saving(q, saved):
    z = saved.frame("07_zero_check").groupby("kind")[["measured_MiB", "zero_MiB"]].max()
    m = saved.frame("07_memory")
    peak = m.groupby("kind")["peak_MiB"].max()
    states = ", ".join(f"{k} {fmt_mib(r['measured_MiB'])} (ZeRO formula {fmt_mib(r['zero_MiB'])})"
                       for k, r in z.iterrows())
    peaks = ", ".join(f"{k} {fmt_mib(v)}" for k, v in peak.items())
    return (f"Model states per rank after the step: {states}. Expected with fp32 AdamW: 16Ψ (DDP) → 8Ψ + 8Ψ/N "
            f"(ZeRO-1) → 16Ψ/N (FSDP). Peak per rank: {peaks}; activations are not sharded, so the peak falls by the "
            "states saved, less up to two gathered layers.")


@answers("fsdp_accounting(b)")
def gather_in_time(q, saved):
    t = saved.frame("07_gather_timeliness")
    pre = t[t["prefetched"].astype(bool)]
    return (f"Of {len(pre)} prefetched forward all-gathers (all ranks), {pct(pre['in_time'].mean())} ended before "
            f"the previous module's forward did; the total stall was {fmt_s(pre['stall_us'].sum() / 1e6)} (notebook "
            "07 §3 draws the trace). That is gloo on CPU cores shared with compute; on two GPUs NCCL runs on its own "
            "stream.")


@answers("alternate_ring_all_reduce")
def alternate_ring(q, saved):
    run = saved.run("07_ring")
    r, p = run.frame(), run.provenance
    alt = r[r["method"] == "alternate ring"]
    big = alt.sort_values(["N", "S_bytes"]).groupby("N").tail(1)
    parts = ", ".join(f"N {int(x['N'])}, S {fmt_mib(x['S_bytes'] / 2**20)}: {x['median_us'] / 1e3:.3g} ms measured, "
                      f"{x['model_us'] / 1e3:.3g} ms modelled" for x in big.to_dict("records"))
    fit = (f"Fitted here (α = {float(p['alpha_s']) * 1e6:.0f} µs, W = {float(p['W_Bps']) / 1e9:.2f} GB/s): "
           if float(p["W_Bps"]) < 1e14 else
           f"The least-squares bandwidth term came out at or below zero here (per-call latency and the machine's load "
           f"dominate these message sizes), so the model is α = {float(p['alpha_s']) * 1e6:.0f} µs per step alone: ")
    return ("Each device forwards the original chunks it receives, so every device sends the whole S once per "
            "neighbour step: (N − 1) · S/W in bandwidth (plus (N − 1)α), against the reduce-scatter + all-gather "
            "ring's 2(N − 1)/N · S/W; the alternate ring moves N/2 times the bytes (equal at N = 2). " + fit
            + f"{parts}. Every result "
            f"was bitwise dist.all_reduce's: {'yes' if r['exact'].all() else 'no'}.")


def _ffn(q, saved):
    run = saved.run("07_ffn_calcs")
    t, p = run.frame().set_index("strategy"), run.provenance
    row = t.loc[CALCS[q.number]]
    limits = formulas.gated_ffn_thresholds(**{k: p[k] for k in ("d", "f", "n", "C", "W")})
    where = {"dp": f"communication-bound below (N−1)/N · C/W = {limits['dp_min_tokens']:.0f} tokens per device",
             "fsdp": f"the same bytes as DP (all-gather + reduce-scatter = all-reduce): bound below "
                     f"{limits['fsdp_min_tokens']:.0f} tokens per device",
             "tp": f"communication-bound above 1 + 3·f·W/C = {limits['tp_max_devices']:.1f} devices, at any batch",
             "fsdp_tp": f"the FSDP part on 1/{p['n_tp']} of the weights plus TP's activation all-reduce"
             }[CALCS[q.number]]
    return (f"Per device, tokens {p['tokens']}, d {p['d']}, f {p['f']}, N {p['n']}, C {p['C']:.3g} FLOP/s, W "
            f"{p['W']:.3g} B/s: backward {row['backward_flops'] / 1e12:.3g} TFLOP ({fmt_s(row['compute_s'])}), "
            f"{row['bytes_sent'] / 1e9:.3g} GB sent ({fmt_s(row['comm_s'])}): "
            f"{'communication' if row['comm_bound'] else 'compute'}-bound here; {where}.")


for _name in CALCS:
    answers(_name)(_ffn)


@answers("2026 leaderboard")
def leaderboard_2026(q, saved):
    plan = formulas.leaderboard_plan()
    best, base = MARKS["leaderboard_2026_best"], MARKS["leaderboard_2026_baseline"]
    lines = []
    for gpu in formulas.LEADERBOARD_GPUS:
        pick = formulas.fastest_plan(plan, gpu)
        if pick is None:
            lines.append(f"{gpu}: no plan fits")
            continue
        lines.append(f"{gpu}: {pick['strategy']} with {pick['checkpointing']} checkpointing, "
                     f"{pick['memory_GB']:.0f} GB per GPU, predicted {pick['step_s'][gpu]:.2f} s "
                     f"({best.value / 1e3 / pick['step_s'][gpu]:.0%} of the published best's speed)")
    f = plan[0]
    return (f"Plan from closed forms (`formulas.leaderboard_plan`): Ψ = {f['params'] / 1e9:.2f} B, "
            f"{f['flops'] / 1e15:.1f} PFLOP per step without recomputation, bf16 compute with fp32 master weights, "
            f"AdamW, 2 GPUs, compute at MFU {formulas.LEADERBOARD_MFU:.0%} plus the communication that cannot "
            "overlap. Fastest plan that fits: " + "; ".join(lines) + f". Published: best {best.value:g} ms on 2× "
            f"B200 ({best.source}, {best.year}); baseline about {base.value / 1e3:g} s.")
