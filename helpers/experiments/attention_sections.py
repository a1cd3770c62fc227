"""Notebook 06's sections 1-3 as one call each: what the profile measures, naive attention's times, its memory and
where it runs out, torch.compile against eager, and the checks of the algorithm and of each kernel. Every call runs,
checks, saves its rows with provenance (the answers page reads them) and returns one helpers.section.Result whose
notes are made from the same values as its table.

    ctx = attention.setup("auto")              # Setup: profile, device, ctx.scale (a PROFILES entry), ctx.where
    times = naive_times(ctx)                   # §1: median ms per (d, T) and pass; saved as 06_naive_attention
    memory = naive_memory(ctx, times)          # §1: bytes kept for backward = P + O, byte for byte; 06_naive_memory
    kernel_checks(ctx, "fwd")                  # §3: one Triton kernel against naive attention, fp32 and bf16
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pandas as pd
import torch

from helpers import attention as A
from helpers.env import card_bytes, device_type, machine_facts, resolve_profile, triton_mode
from helpers.experiments.attention_bench import check_physical_bounds, sweep
from helpers.experiments.attention_checks import (
    KERNELS,
    TOL,
    backward_from_lse,
    check_function,
    check_kernel,
    naive_grads,
    online_softmax,
)
from helpers.experiments.attention_impls import PASSES, inputs
from helpers.experiments.attention_leaderboard import compare_impls
from helpers.experiments.attention_memory import saved_bytes_formula, saved_memory
from helpers.experiments.gpu_plans_bytes import keep_fitting, models_side_by_side_bytes
from helpers.model import get_config
from helpers.results import save_results
from helpers.section import Result


@dataclass(frozen=True)
class Setup:
    """Where notebook 06 runs: the profile, the device and its name, and what the profile measures (`scale`)."""

    profile: str
    device: str
    device_name: str
    scale: dict = field(repr=False)

    @classmethod
    def resolve(cls, profile: str, profiles: dict) -> Setup:
        """`profile` ("auto" | "cpu" | "gpu") picks the sizes (`profiles`: attention.PROFILES); the device is the
        machine's (env.device_type: CUDA when present, so compiled Triton gets CUDA tensors on the cpu profile too)."""
        profile = resolve_profile(profile)
        scale = fit_card(profiles[profile], card_bytes())  # what this GPU holds (None without CUDA: all)
        return cls(profile, device_type(), machine_facts()["device"], scale)

    @property
    def triton_timed(self) -> bool:
        """Whether Triton is timed: where it is compiled (the interpreter's times say nothing about the kernels)."""
        return torch.device(self.device).type == "cuda" and triton_mode() == "compiled"

    @property
    def where(self) -> str:
        """The line every caption ends with: device, profile and Triton's mode."""
        return f"{self.device_name} · profile {self.profile} · Triton {triton_mode()}"


def fit_card(scale: dict, gpu_bytes: float | None) -> dict:
    """`scale` (a PROFILES entry) on a card of gpu_bytes: §6's model sizes whose models side by side the card cannot
    hold (gpu_plans_bytes.models_side_by_side_bytes: one per implementation, one stepping) left out, the smallest
    always, each named in scale["left_out"]; `scale` itself where the card holds them all or none is known."""
    n, B, autocast = len(scale["model_impls"]), scale["model_batch"], scale["model_dtype"] is not None
    need = {m: models_side_by_side_bytes(m, n, B, get_config(m).context_length, autocast) for m in scale["model_sizes"]}
    kept, notes = keep_fitting(
        need, gpu_bytes, lambda m: f"{m}'s {n} models side by side (batch {B})", instead="not stepped here"
    )
    return scale if len(kept) == len(need) else {**scale, "model_sizes": kept, "left_out": notes}


def _dtype(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _tol(dtype) -> str:
    return f"rtol {TOL[dtype]['rtol']:g}, atol {TOL[dtype]['atol']:g}"


# ---- §1 naive attention: time, memory, out of memory, torch.compile ----------------------------------------------


def naive_flops(shape) -> int:
    """Matmul FLOPs of one forward+backward of naive attention on (B, H, T, d), FlashAttention-2's count (the
    TFLOP/s yardstick; not causal)."""
    B, H, T, d = shape
    return sum(A.attention_flops(B * H, T, T, d, False, backward=bw) for bw in (False, True))


def naive_shapes(scale: dict) -> tuple[list, list]:
    """§1's grid, (batch, 1, T, d) for every head dim and length of the profile: (run, left out), where the
    profile's naive_max_flops (None: no cap) leaves out every shape whose forward+backward does more FLOPs."""
    grid = [(scale["batch"], 1, T, d) for d in scale["head_dims"] for T in scale["seq_lens"]]
    cap = scale["naive_max_flops"]
    run = [s for s in grid if cap is None or naive_flops(s) <= cap]
    return run, [s for s in grid if s not in run]


def _left_out_note(scale: dict, run, left_out) -> list[str]:
    """The shapes of the grid the FLOP cap left out, by length (none: no note)."""
    if not left_out:
        return []
    by_T = {T: sorted(d for _, _, t, d in left_out if t == T) for T in sorted({s[2] for s in left_out})}
    parts = [f"T={T}: d {', '.join(map(str, ds))}" for T, ds in by_T.items()]
    return [
        f"not timed here: {len(left_out)} of the grid's {len(run) + len(left_out)} shapes, over the profile's "
        f"{scale['naive_max_flops'] / 1e9:g} GFLOP per forward+backward ({'; '.join(parts)}); `make writeup "
        "PROFILE=gpu` times them all"
    ]


def naive_times(ctx: Setup) -> Result:
    """§1: naive attention timed per pass on the profile's grid (batch, one head, fp32, not causal) within its FLOP
    cap (naive_shapes); out-of-memory rows marked; saved as 06_naive_attention with the grid and the cap (and, on a
    GPU, its memory). values: `rows` (every row), `oom` (the rows that ran out), `left_out` (shapes not run)."""
    s = ctx.scale
    shapes, left_out = naive_shapes(s)
    timed = sweep(["naive"], shapes, [torch.float32], ctx.device, False, s["warmup"], s["steps"])
    cuda = torch.device(ctx.device).type == "cuda"
    rows = pd.DataFrame(timed)
    rows["ms"] = (rows["median_s"] * 1e3).round(3).astype(object).where(~rows.oom, "OOM")
    grid = dict(head_dims=list(s["head_dims"]), seq_lens=list(s["seq_lens"]), max_flops=s["naive_max_flops"])
    memory = {"device_bytes": torch.cuda.mem_get_info()[1]} if cuda else {}
    saved = save_results(
        rows, "06_naive_attention", profile=ctx.profile, grid=grid, warmup=s["warmup"], steps=s["steps"], **memory
    )  # saved first: a tripped bound below still leaves the run's rows
    check_physical_bounds(timed, ctx.device_name, order=cuda)  # TFLOP/s <= peak; fwd <= fwd+bwd on device time
    table = rows.pivot_table(index=["d", "T"], columns="pass", values="ms", aggfunc="first")
    note = (
        f"naive attention, batch {s['batch']}, 1 head, fp32, not causal: median ms of {s['steps']} steps · {ctx.where}"
    )
    oom = rows[rows.oom]
    return Result(
        table[list(PASSES)],
        notes=[note, *_left_out_note(s, shapes, left_out)],
        saved=saved,
        values={"rows": rows, "oom": oom, "left_out": left_out},
    )


def _growth_notes(saved_bytes: pd.Series) -> list[str]:
    """Per step of T: how many times the saved bytes grew, beside the T² share's growth."""
    return [
        f"T {t0} -> {t1} ({t1 / t0:.0f}x): saved memory grows {b1 / b0:.1f}x (the P share: {(t1 / t0) ** 2:.0f}x)"
        for (t0, b0), (t1, b1) in itertools.pairwise(saved_bytes.items())
    ]


def _oom_note(ctx: Setup, rows: pd.DataFrame, times_oom: pd.DataFrame) -> str:
    """Where naive attention ran out of memory (the first shape, what it keeps, the device's memory), or which shape
    kept the most when nothing did."""
    if times_oom.empty:
        big = rows.sort_values("saved_bytes").iloc[-1]
        return (
            f"nothing ran out of memory here; the largest, T={big['T']}, d={big['d']}, keeps "
            f"{big.saved_bytes / 2**30:.2f} GiB, {big.score_matrix_bytes / big.saved_bytes:.1%} of it P"
        )
    r = times_oom.sort_values(["T", "d"]).iloc[0]
    B, T, d = int(r["batch"]), int(r["T"]), int(r["d"])
    kept = saved_bytes_formula("naive", (B, 1, T, d))  # P + O
    p_bytes = A.score_matrix_bytes(B, T, T, torch.float32)
    of = f" of {torch.cuda.mem_get_info()[1] / 2**30:.0f} GiB on the device" if ctx.device == "cuda" else ""
    return (
        f"first OOM: T={T}, d={d}: the forward keeps {kept / 2**30:.1f} GiB (P + O); the backward adds dP and dS, "
        f"each as big as P: about {(kept + 2 * p_bytes) / 2**30:.1f} GiB{of}"
    )


def naive_memory(ctx: Setup, times: Result) -> Result:
    """§1: bytes one forward of naive attention leaves live for backward (beyond q, k, v), measured by the tracker
    beside P + O (asserted byte for byte); how it grows with T and where `times` ran out. Saved as 06_naive_memory.
    values: `rows`, `mismatched` (rows off the closed form: 0), `growth` [(T ratio, saved-bytes ratio)] per step."""
    s = ctx.scale
    shapes, _ = naive_shapes(s)
    rows = pd.DataFrame([saved_memory("naive", shape, torch.float32, ctx.device) for shape in shapes])
    ran = rows[~rows.oom]
    mismatched = int((ran.saved_bytes != ran.formula_bytes).sum())
    rows["saved MiB"] = rows.saved_bytes / 2**20
    saved = save_results(rows, "06_naive_memory", profile=ctx.profile)  # saved first, then asserted
    assert mismatched == 0, ran  # measured == P + O, byte-exact
    by_T = ran[ran.d == s["head_dims"][0]].set_index("T").saved_bytes
    growth = [(t1 / t0, b1 / b0) for (t0, b0), (t1, b1) in itertools.pairwise(by_T.items())]
    notes = [
        f"naive attention, memory live before backward beyond q, k, v (MiB; OOM: out of memory; not run: over the "
        f"profile's FLOP cap) · {ctx.where}",
        *_growth_notes(by_T),
        _oom_note(ctx, ran, times.values["oom"]),
    ]
    cells = rows["saved MiB"].round(2).astype(object).where(~rows.oom, "OOM")
    table = rows.assign(cell=cells).pivot(index="T", columns="d", values="cell")
    table = table.reindex(index=s["seq_lens"], columns=s["head_dims"])  # the whole grid, what did not run marked
    table = table.where(table.notna(), "not run")
    return Result(table, notes=notes, saved=saved, values=dict(rows=rows, mismatched=mismatched, growth=growth))


def compile_ratios(ctx: Setup) -> Result:
    """§1: torch.compile of naive attention against eager on one shape, fwd and fwd+bwd, interleaved (paired ratios
    with a bootstrap interval; a winner only outside the noise). Saved as 06_compile_ratios with the shape.
    values: `ratios` {pass: Ratio of compiled's time over eager's}."""
    s = ctx.scale
    shape = s["compile_shape"]
    tables, notes, ratios = {}, [], {}
    for pass_ in ("fwd", "fwd+bwd"):
        cmp = compare_impls(
            ["naive", "compiled"], shape, torch.float32, ctx.device, False, pass_, s["warmup"], s["steps"]
        )
        tables[pass_], ratios[pass_] = cmp.table(), cmp.ratio("compiled")
        notes.append(f"{pass_}, {shape} fp32: {cmp.verdict('compiled')}")
    notes.append(f"(B, H, T, d) = {shape} · {ctx.where}")
    table = pd.concat(tables, names=["pass"])
    rows = table.reset_index().assign(pairs=s["steps"])  # one pair per round
    saved = save_results(rows, "06_compile_ratios", profile=ctx.profile, shape=list(shape))
    return Result(table.round(5), notes=notes, saved=saved, values={"ratios": ratios})


# ---- §2 and §3 the algorithm and the kernels, checked against naive attention ------------------------------------


SOFTMAX_BLOCK = 16  # online_softmax_check's key block (06_checks names it)


def online_softmax_check(rows: int = 4, length: int = 100, block: int = SOFTMAX_BLOCK) -> Result:
    """§2: online_softmax over blocks against the whole row in float64, on scores wide enough (x30) that a naive
    exp would overflow in fp32: the running max is the row max, m + log l the logsumexp, exp(s - L) the softmax."""
    s = torch.randn(rows, length, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 30  # (rows, T)
    m, _, lse = online_softmax(s, block=block)
    torch.testing.assert_close(m, s.amax(-1), rtol=0, atol=0)  # the running max is the row max
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), **TOL[torch.float64])
    torch.testing.assert_close(torch.exp(s - lse[:, None]), torch.softmax(s, -1), **TOL[torch.float64])
    err = float((lse - torch.logsumexp(s, -1)).abs().max())
    note = (
        f"online softmax over blocks of {block} = logsumexp and softmax of the whole row "
        f"(float64, {_tol(torch.float64)}; largest logsumexp error {err:.1e})"
    )
    return Result(notes=[note], values={"largest_error": err})


def backward_check(shape=(2, 3, 70, 16)) -> Result:
    """§2: the tiled forward (flash_forward_torch) against naive O and attention_lse's L, and backward_from_lse against
    autograd through naive attention, causal and not, float64 (70: ragged against every tile size). values:
    `largest_error`."""
    q, k, v, do = inputs(shape, torch.float64)
    tol = TOL[torch.float64]
    rows = []
    for causal in (False, True):
        o, dq, dk, dv = naive_grads(q, k, v, do, causal)
        qd, kd, vd = (x.detach() for x in (q, k, v))
        o_t, lse_t = A.flash_forward_torch(
            *(x.flatten(0, 1) for x in (qd, kd, vd)), causal, A._launch_config(shape[-1], q.dtype, "cpu")
        )
        lse = lse_t.view(o.shape[:-1])  # (B, H, T)
        got = {
            "o": o_t.view_as(o),
            "L": lse,
            **dict(zip(("dq", "dk", "dv"), backward_from_lse(qd, kd, vd, o, lse, do, causal), strict=True)),
        }
        want = {"o": o, "L": A.attention_lse(qd, kd, causal), "dq": dq, "dk": dk, "dv": dv}
        for name, g in got.items():
            torch.testing.assert_close(g, want[name], **tol, msg=lambda m, n=f"{name}, causal={causal}": f"{n}: {m}")
            rows.append(dict(causal=causal, tensor=name, largest_error=float((g - want[name]).abs().max())))
    table = pd.DataFrame(rows).pivot_table(index="tensor", columns="causal", values="largest_error", sort=False)
    note = (
        "tiled forward = naive O and logsumexp L; backward from L (D = rowsum(dO * O)) = autograd; "
        f"causal and not, float64 ({_tol(torch.float64)}); largest error per tensor:"
    )
    return Result(table, notes=[note], values={"largest_error": max(r["largest_error"] for r in rows)})


def _checks_table(label: str, errors: list[dict]) -> Result:
    """One row per (dtype, causal): the largest error and the tolerance it was asserted within."""
    table = pd.DataFrame(errors).set_index(["dtype", "causal"])
    note = f"{label}: every output within its tolerance (asserted); the largest error of each run:"
    return Result(table, notes=[note], values={"largest_error": float(table["largest error"].max())})


def function_checks(fn, label: str, shape, dtypes, device="cpu") -> Result:
    """§2-§3: check_function (o, dq, dk, dv against autograd through naive attention) per dtype, causal and not."""
    errors = [
        {
            "dtype": _dtype(dt),
            "causal": c,
            "largest error": check_function(fn, shape, dt, device, c),
            "tolerance": _tol(dt),
        }
        for dt in dtypes
        for c in (False, True)
    ]
    return _checks_table(f"{label} on {tuple(shape)}: o, dq, dk, dv = naive", errors)


def kernel_checks(ctx: Setup, name: str) -> Result:
    """§3: one Triton kernel (fwd | dkdv | dq) launched alone on the profile's kernel shape, fp32 and bf16, causal
    and not, against naive attention (check_kernel)."""
    shape = ctx.scale["kernel_shape"]
    errors = [
        {
            "dtype": _dtype(dt),
            "causal": c,
            "largest error": check_kernel(name, shape, dt, ctx.device, c),
            "tolerance": _tol(dt),
        }
        for dt in (torch.float32, torch.bfloat16)
        for c in (False, True)
    ]
    return _checks_table(f"{KERNELS[name]} = spec on {tuple(shape)}", errors)


def checks_summary(ctx: Setup, pytorch_shape=(2, 3, 70, 24)) -> Result:
    """§2-§3: what the checks above asserted (they all passed to get here), saved as 06_checks for the answers page."""
    tol = {_dtype(k): _tol(k) for k in TOL}
    kernel = f"{ctx.scale['kernel_shape']}, float32 and bfloat16, causal and not, {tol['float32']} / {tol['bfloat16']}"
    checks = [
        {
            "check": "online softmax = logsumexp and softmax of the whole row",
            "detail": f"float64, blocks of {SOFTMAX_BLOCK}, {tol['float64']}",
        },
        {
            "check": "backward from L = autograd through naive attention",
            "detail": f"float64, causal and not, {tol['float64']}",
        },
        {
            "check": "FlashAttentionPyTorch = naive (o, dq, dk, dv)",
            "detail": f"{pytorch_shape}, float64 and float32, causal and not, {tol['float32']} in float32",
        },
        {"check": "Triton forward kernel = spec (O and L)", "detail": kernel},
        {"check": "Triton backward kernels = autograd (dK, dV; dQ)", "detail": kernel},
        {"check": "FlashAttentionTriton = naive (o, dq, dk, dv)", "detail": kernel},
    ]
    saved = save_results(checks, "06_checks", profile=ctx.profile, triton_mode=triton_mode())
    note = f"{len(checks)} checks passed (Triton {triton_mode()}), for the answers page"
    return Result(pd.DataFrame(checks).set_index("check"), notes=[note], saved=saved, values={"checks": len(checks)})
