"""The 2026 handout's calculators (notebook 07): the gated FFN's backward per strategy, and the DP, FSDP, TP and
FSDP × TP parts in the handout's variables, as expressions, inequalities and a worked example.

    tp_calc("forward", **CALC_EXAMPLE).inequality, calc_parts(**CALC_EXAMPLE), gated_ffn("tp", ...)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# the 2026 gated FFN (x W1, x W2, f(x1) * x2, z W3; d -> f -> d), 16-bit weights and activations, b tokens per
# data-parallel replica, N devices; C FLOP/s per device, W bytes/s of egress per device


def gated_ffn(
    strategy: str, *, tokens: int, d: int, f: int, n: int, C: float, W: float, n_tp: int = 1, bytes_per_element: int = 2
) -> dict[str, float]:
    """Per device: backward FLOPs and seconds, backward bytes sent and seconds, and whether it is communication-bound.
    dp: all-reduce 3df grads; fsdp: all-gather 3df weights + reduce-scatter 3df grads; tp (n-way): all-reduce of dx
    (b x d); fsdp_tp: n = n_fsdp x n_tp, both of these on 1/n_tp of the weights."""
    e, params = bytes_per_element, 3 * d * f
    ring = lambda k: (k - 1) / k  # noqa: E731
    if strategy in ("dp", "fsdp"):
        flops, sent = 12 * tokens * d * f, 2 * ring(n) * params * e  # all-reduce == all-gather + reduce-scatter
    elif strategy == "tp":
        flops, sent = 12 * tokens * d * f / n, 2 * ring(n) * tokens * d * e
    elif strategy == "fsdp_tp":
        n_f = n // n_tp
        flops = 12 * tokens * d * f / n_tp
        sent = 2 * ring(n_f) * params * e / n_tp + 2 * ring(n_tp) * tokens * d * e
    else:
        raise ValueError(f"unknown strategy {strategy!r}; expected dp, fsdp, tp or fsdp_tp")
    out = {"backward_flops": flops, "compute_s": flops / C, "bytes_sent": sent, "comm_s": sent / W}
    out["comm_bound"] = out["comm_s"] > out["compute_s"]
    return out


def gated_ffn_thresholds(*, d: int, f: int, n: int, C: float, W: float) -> dict[str, float]:
    """Where each strategy turns communication-bound: dp/fsdp below tokens (N-1)/N C/W per device; tp above
    N = 1 + 3 f W / C devices (any batch)."""
    return {
        "dp_min_tokens": (n - 1) / n * C / W,
        "fsdp_min_tokens": (n - 1) / n * C / W,
        "tp_max_devices": 1 + 3 * f * W / C,
    }


# The 2026 calculators in the handout's variables: B tokens in the global batch, D, D_FF, N devices (N_DP, N_FSDP,
# N_TP), C FLOP/s and W bytes/s of egress per device, 16-bit weights and activations. Each part returns its
# expression and its compute-bound inequality (LaTeX for notebooks, plain text for the answers page) and a worked
# example. Ring collectives: an all-reduce sends 2(N-1)/N of the buffer, an all-gather or reduce-scatter (N-1)/N.

CALC_EXAMPLE = dict(B=32_768, D=4096, D_FF=16_384, N=8, C=989e12, W=450e9)  # H100-like: bf16 dense, NVLink one way


@dataclass(frozen=True)
class CalcPart:
    """One part of a 2026 calculator: what it computes, as expressions and an inequality, and one worked example."""

    problem: str  # "tp_calcs"
    part: str  # "forward", "backward", "(a)" ...
    expressions: tuple[
        tuple[str, str], ...
    ]  # (quantity, plain-text expression), e.g. ("FLOPs per device", "6·B·D·D_FF/N")
    inequality: str  # plain text: when it stays compute-bound
    latex: tuple[str, ...]  # the same, as LaTeX for a notebook
    example: dict  # inputs and the values they give

    def _repr_markdown_(self) -> str:
        """In a notebook: the part's expressions, its inequality, the same as math, and the example's bound."""
        lines = [f"**{self.problem} · {self.part}**"] + [f"- {q}: `{e}`" for q, e in self.expressions]
        if self.inequality != "—":
            bound = self.example.get("max_devices")
            lines.append(
                f"- compute-bound while: `{self.inequality}`"
                + (f" (worked example: N ≤ {bound:.1f})" if bound not in (None, math.inf) else "")
            )
        return "\n".join(lines + [f"$${t}$$" for t in self.latex])


def _ring(n: float, collective: str) -> float:
    return (2 if collective == "all_reduce" else 1) * (n - 1) / n


def dp_calc(pass_: str, *, B: int, D: int, D_FF: int, N: int, C: float, W: float) -> CalcPart:
    """data_parallel_calcs: each of N_DP devices runs B/N_DP tokens through the whole FFN (3 D×D_FF matrices);
    forward has no communication, backward all-reduces the 3·D·D_FF 16-bit gradients."""
    k = 6 if pass_ == "forward" else 12
    flops = k * B * D * D_FF / N
    sent = 0.0 if pass_ == "forward" else _ring(N, "all_reduce") * 3 * D * D_FF * 2
    exprs = (
        ("FLOPs per device", f"{k}·B·D·D_FF/N_DP"),
        (
            "bytes sent per device",
            "0 (no communication in forward)"
            if pass_ == "forward"
            else "2·(N_DP−1)/N_DP · 3·D·D_FF · 2 = 12·D·D_FF·(N_DP−1)/N_DP",
        ),
        ("time", f"max({k}·B·D·D_FF/(N_DP·C), comm/W)" if pass_ == "backward" else f"{k}·B·D·D_FF/(N_DP·C)"),
    )
    ineq = (
        "always compute-bound"
        if pass_ == "forward"
        else "12·B·D·D_FF/(N_DP·C) ≥ 12·D·D_FF·(N_DP−1)/(N_DP·W)  ⇔  N_DP ≤ 1 + B·W/C"
    )
    latex = (
        (r"\frac{6BDD_{FF}}{N_{DP}}", r"\text{no communication}")
        if pass_ == "forward"
        else (r"\frac{12BDD_{FF}}{N_{DP}}", r"\frac{12DD_{FF}(N_{DP}-1)}{N_{DP}}", r"N_{DP} \le 1 + \frac{BW}{C}")
    )
    bound = math.inf if pass_ == "forward" else 1 + B * W / C
    return CalcPart(
        "data_parallel_calcs",
        pass_,
        exprs,
        ineq,
        latex,
        dict(
            B=B,
            D=D,
            D_FF=D_FF,
            N_DP=N,
            C=C,
            W=W,
            flops=flops,
            bytes_sent=sent,
            compute_s=flops / C,
            comm_s=sent / W,
            max_devices=bound,
            comm_bound=sent / W > flops / C,
        ),
    )


def fsdp_calc(pass_: str, *, B: int, D: int, D_FF: int, N: int, C: float, W: float) -> CalcPart:
    """fsdp_calcs: B/N tokens per device; forward all-gathers the 3·D·D_FF 16-bit weights, backward gathers them again
    and reduce-scatters the gradients (an all-reduce's bytes)."""
    k, gathers = (6, 1) if pass_ == "forward" else (12, 2)
    flops = k * B * D * D_FF / N
    sent = gathers * _ring(N, "all_gather") * 3 * D * D_FF * 2
    what = "all-gather of the weights" if pass_ == "forward" else "all-gather + reduce-scatter"
    exprs = (
        ("FLOPs per device", f"{k}·B·D·D_FF/N_FSDP"),
        ("bytes sent per device", f"{what}: {k}·D·D_FF·(N_FSDP−1)/N_FSDP"),
    )
    ineq = (
        f"{k}·B·D·D_FF/(N_FSDP·C) ≥ {k}·D·D_FF·(N_FSDP−1)/(N_FSDP·W)  ⇔  N_FSDP ≤ 1 + B·W/C"
        "  (per device: B/N_FSDP ≥ (N_FSDP−1)/N_FSDP · C/W)"
    )
    latex = (
        rf"\frac{{{k}BDD_{{FF}}}}{{N_{{FSDP}}}}",
        rf"\frac{{{k}DD_{{FF}}(N_{{FSDP}}-1)}}{{N_{{FSDP}}}}",
        r"N_{FSDP} \le 1 + \frac{BW}{C}",
    )
    return CalcPart(
        "fsdp_calcs",
        pass_,
        exprs,
        ineq,
        latex,
        dict(
            B=B,
            D=D,
            D_FF=D_FF,
            N_FSDP=N,
            C=C,
            W=W,
            flops=flops,
            bytes_sent=sent,
            compute_s=flops / C,
            comm_s=sent / W,
            max_devices=1 + B * W / C,
            comm_bound=sent / W > flops / C,
        ),
    )


TP_BACKWARD_EQUATIONS = (  # device i holds W1, W2 by columns (D × D_FF/N), W3 by rows (D_FF/N × D); x, dy replicated
    "forward: x1ᵢ = x·W1ᵢ, x2ᵢ = x·W2ᵢ, zᵢ = f(x1ᵢ) ∗ x2ᵢ, y = Σᵢ zᵢ·W3ᵢ (all-reduce)",
    "dW3ᵢ = zᵢᵀ·dy;  dzᵢ = dy·W3ᵢᵀ",
    "dx2ᵢ = dzᵢ ∗ f(x1ᵢ);  dx1ᵢ = dzᵢ ∗ x2ᵢ ∗ f′(x1ᵢ)",
    "dW1ᵢ = xᵀ·dx1ᵢ;  dW2ᵢ = xᵀ·dx2ᵢ",
    "dx = Σᵢ (dx1ᵢ·W1ᵢᵀ + dx2ᵢ·W2ᵢᵀ)  (all-reduce of B × D)",
)


def tp_calc(pass_: str, *, B: int, D: int, D_FF: int, N: int, C: float, W: float) -> CalcPart:
    """tp_calcs: every device sees all B tokens and 1/N_TP of each matrix; forward all-reduces y, backward dx (B × D,
    16-bit) once each."""
    k, ratio = (6, "1.5") if pass_ == "forward" else (12, "3")
    flops = k * B * D * D_FF / N
    sent = _ring(N, "all_reduce") * B * D * 2
    exprs = (
        ("FLOPs per device", f"{k}·B·D·D_FF/N_TP"),
        ("bytes sent per device", f"all-reduce of {'y' if pass_ == 'forward' else 'dx'}: 4·B·D·(N_TP−1)/N_TP"),
    )
    ineq = f"{k}·B·D·D_FF/(N_TP·C) ≥ 4·B·D·(N_TP−1)/(N_TP·W)  ⇔  N_TP ≤ 1 + {ratio}·D_FF·W/C (any batch)"
    latex = (
        rf"\frac{{{k}BDD_{{FF}}}}{{N_{{TP}}}}",
        r"\frac{4BD(N_{TP}-1)}{N_{TP}}",
        rf"N_{{TP}} \le 1 + {ratio}\,\frac{{D_{{FF}}W}}{{C}}",
    )
    bound = 1 + float(ratio) * D_FF * W / C
    return CalcPart(
        "tp_calcs",
        pass_,
        exprs,
        ineq,
        latex,
        dict(
            B=B,
            D=D,
            D_FF=D_FF,
            N_TP=N,
            C=C,
            W=W,
            flops=flops,
            bytes_sent=sent,
            compute_s=flops / C,
            comm_s=sent / W,
            max_devices=bound,
            comm_bound=sent / W > flops / C,
        ),
    )


def fsdp_tp_calc(part: str, *, B: int, D: int, D_FF: int, N_FSDP: int, N_TP: int, C: float, W: float) -> CalcPart:
    """fsdp_tp_calcs, forward pass, N = N_FSDP·N_TP: (a) FLOPs 6BD·D_FF/N; (b) communication: the FSDP all-gather of
    the device's 1/N_TP of the weights and TP's all-reduce of its B/N_FSDP tokens' output run on different axes, so
    the time is the larger; (c) with overlap, compute-bound while compute exceeds each, N ≤ 1.5·B·D_FF·W²/C² at
    N_FSDP = BW/C, N_TP = 1.5·D_FF·W/C; (d) without overlap, compute ≥ their sum, N ≤ 3·B·D_FF·W²/(8C²) at half of
    each (N_FSDP = BW/(2C), N_TP = 3·D_FF·W/(4C)). (c) and (d) take the rings' (N−1)/N as 1, as the Scaling Book
    does."""
    N = N_FSDP * N_TP
    flops = 6 * B * D * D_FF / N
    t_fsdp = _ring(N_FSDP, "all_gather") * 6 * D * D_FF / N_TP / W
    t_tp = _ring(N_TP, "all_reduce") * 2 * B / N_FSDP * D / W
    ex = dict(
        B=B,
        D=D,
        D_FF=D_FF,
        N_FSDP=N_FSDP,
        N_TP=N_TP,
        C=C,
        W=W,
        flops=flops,
        compute_s=flops / C,
        fsdp_comm_s=t_fsdp,
        tp_comm_s=t_tp,
    )
    if part == "(a)":
        return CalcPart(
            "fsdp_tp_calcs",
            part,
            (("forward FLOPs per device", "6·B·D·D_FF/(N_FSDP·N_TP)"),),
            "—",
            (r"\frac{6BDD_{FF}}{N_{FSDP}N_{TP}}",),
            ex,
        )
    if part == "(b)":
        return CalcPart(
            "fsdp_tp_calcs",
            part,
            (
                ("FSDP all-gather time", "6·D·D_FF·(N_FSDP−1)/(N_FSDP·N_TP·W)"),
                ("TP all-reduce time", "4·B·D·(N_TP−1)/(N_FSDP·N_TP·W)"),
                ("communication time", "max(FSDP term, TP term)"),
            ),
            "—",
            (r"\max\left(\frac{6DD_{FF}(N_{FSDP}-1)}{N_{FSDP}N_{TP}W}, \frac{4BD(N_{TP}-1)}{N_{FSDP}N_{TP}W}\right)",),
            {**ex, "comm_s": max(t_fsdp, t_tp)},
        )
    if part == "(c)":
        n_f, n_t = B * W / C, 1.5 * D_FF * W / C
        return CalcPart(
            "fsdp_tp_calcs",
            part,
            (
                ("FSDP side", "6·B·D·D_FF/(N·C) ≥ 6·D·D_FF/(N_TP·W) ⇔ N_FSDP ≤ B·W/C"),
                ("TP side", "6·B·D·D_FF/(N·C) ≥ 4·B·D/(N_FSDP·W) ⇔ N_TP ≤ 1.5·D_FF·W/C"),
            ),
            "N = N_FSDP·N_TP ≤ 1.5·B·D_FF·W²/C²",
            (r"N \le \frac{1.5\,B D_{FF} W^2}{C^2}",),
            {**ex, "N_FSDP_max": n_f, "N_TP_max": n_t, "max_devices": 1.5 * B * D_FF * W**2 / C**2},
        )
    if part == "(d)":
        n_f, n_t = B * W / (2 * C), 3 * D_FF * W / (4 * C)
        return CalcPart(
            "fsdp_tp_calcs",
            part,
            (
                (
                    "no overlap",
                    "6·B·D·D_FF/(N·C) ≥ 6·D·D_FF/(N_TP·W) + 4·B·D/(N_FSDP·W) ⇔ 6·D_FF·N_FSDP + 4·B·N_TP ≤ 6·B·D_FF·W/C",
                ),
                (
                    "largest N",
                    "the product is largest with each term half the budget: N_FSDP = B·W/(2C), N_TP = 3·D_FF·W/(4C)",
                ),
            ),
            "N = N_FSDP·N_TP ≤ 3·B·D_FF·W²/(8·C²)",
            (r"N \le \frac{3\,B D_{FF} W^2}{8\,C^2}",),
            {**ex, "N_FSDP_max": n_f, "N_TP_max": n_t, "max_devices": 3 * B * D_FF * W**2 / (8 * C**2)},
        )
    raise ValueError(f"fsdp_tp_calcs has parts (a) to (d); got {part!r}")


def calc_parts(*, B: int, D: int, D_FF: int, N: int, C: float, W: float, N_TP: int = 4) -> list[CalcPart]:
    """Every part of the four 2026 calculators at one example: DP, FSDP and TP forward and backward, FSDP × TP (a)-(d)
    forward with N_FSDP = N / N_TP."""
    ex = dict(B=B, D=D, D_FF=D_FF, N=N, C=C, W=W)
    return [fn(p, **ex) for fn in (dp_calc, fsdp_calc, tp_calc) for p in ("forward", "backward")] + [
        fsdp_tp_calc(part, B=B, D=D, D_FF=D_FF, N_FSDP=N // N_TP, N_TP=N_TP, C=C, W=W)
        for part in ("(a)", "(b)", "(c)", "(d)")
    ]
