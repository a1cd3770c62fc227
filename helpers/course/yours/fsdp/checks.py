"""`yours` for FSDP, the checks beyond the handout read in the parent: SGD steps vs one process within a derived bound,
races over repeats, memory after init and the forward/backward peak vs the formulas, bytes per step vs the formula."""

from __future__ import annotations

import functools

import numpy as np
import torch

import helpers.course.yours.student_calls as S
from helpers import formulas as F
from helpers.course.yours.dist_common import WORLD
from helpers.course.yours.report import FAIL, PASS, SKIPPED, Check
from helpers.experiments import fsdp as XF
from helpers.experiments.common import make_batches, rank_rows
from helpers.formulas import MiB
from helpers.fsdp import bytes_sent, fsdp_bytes_per_step

FSDP_CHECK = dict(model="small/cpu", n_layers=None, steps=2, batch_size=4, context_length=16)
FSDP_DTYPES = ("fp32", "bf16")  # without and with a compute dtype
FSDP_BYTES_TOL = 0.02  # bytes per step vs the formula, relative: another padding or sharded norm gains move ~0.1 %
FSDP_MEMORY_TOL = 0.10  # after init and the forward/backward peak vs the formulas (XF.PEAK_TOL: the tracker's drift)


def _update_check(before: dict, after: dict, x, y, dtype: str) -> tuple[float, float, str]:
    """One SGD step from `before` vs one process's: max |w_after - (w - lr g_ref)| / bound, the same against N x g_ref
    (a sum, not a mean), and the worst element. Bound: lr x the gradient bound (XF.bound) + one rounding of each of
    w and lr g (float32)."""
    cfg, eps = FSDP_CHECK, torch.finfo(torch.float32).eps
    load = functools.partial(XF.loaded, cfg["model"], cfg["n_layers"], before)
    if dtype == "fp32":
        ref = XF.reference_grads(load(), x, y, dtype)
    else:
        shares = [(x[r], y[r]) for r in (rank_rows(x.shape[0], k, WORLD) for k in range(WORLD))]
        ref = XF.ranks_reference(load, shares, dtype)
    lim = {n: v.detach() for n, v in XF.bound(load(), x, y, dtype).items()}
    worst, summed, where = 0.0, 0.0, ""
    for n, w in before.items():
        g = ref[n].detach()
        round_ = 2 * eps * (w.abs() + XF.LR * g.abs())
        diff = (after[n] - (w - XF.LR * g)).abs()
        ratio = torch.nan_to_num(diff / (XF.LR * lim[n] + round_).clamp_min(1e-30), nan=float("inf"))
        s = (after[n] - (w - WORLD * XF.LR * g)).abs() / (WORLD * XF.LR * lim[n] + round_).clamp_min(1e-30)
        summed = max(summed, float(torch.nan_to_num(s, nan=float("inf")).max()))
        if float(ratio.max()) > worst or not where:
            i = tuple(int(k) for k in np.unravel_index(int(ratio.argmax()), tuple(w.shape)))
            worst = float(ratio.max())
            where = (
                "non-finite weights after the step (NaN/inf); " if not bool(torch.isfinite(after[n]).all()) else ""
            ) + (
                f"{n}[{', '.join(map(str, i))}]: yours {float(after[n][i]):.6g}, one process "
                f"{float(w[i] - XF.LR * g[i]):.6g} (|diff| {float(diff[i]):.3g}, bound "
                f"{float(XF.LR * lim[n][i] + round_[i]):.3g})"
            )
    return worst, summed, where


def fsdp_equivalence_checks(impl: str, per_rank: list[dict], repeat: int) -> list[Check]:
    cfg, checks = FSDP_CHECK, []
    names = [n for n, _ in XF.build(cfg["model"], cfg["n_layers"], seed=0).named_parameters()]
    first = per_rank[0]["repeats"][0]
    try:
        full = {d: [S.aligned(w, names) for w in ws] for d, ws in first.items()}
    except ValueError as exc:
        return [Check("fsdp", impl, "fsdp_gather_full_params returns the full weights", FAIL, str(exc))]
    start = {n: p.detach().cpu() for n, p in XF.build(cfg["model"], cfg["n_layers"], seed=0).named_parameters()}
    w0 = full["fp32"][0]
    bad = [n for n in names if w0[n].shape != start[n].shape or not torch.equal(w0[n], start[n])]
    checks.append(
        Check(
            "fsdp",
            impl,
            "fsdp_gather_full_params after construction is rank 0's model",
            FAIL if bad else PASS,
            f"{len(bad)} of {len(names)} parameters differ from rank 0's, e.g. {bad[0]} (shape "
            f"{tuple(w0[bad[0]].shape)} vs {tuple(start[bad[0]].shape)}): not broadcast from rank 0, or not "
            "the full weights"
            if bad
            else f"all {len(names)} parameters, full shapes, rank 0's values",
        )
    )
    batches = make_batches(cfg["model"], cfg["steps"], cfg["batch_size"], cfg["context_length"], 0)
    for dtype, ws in full.items():
        label = "fp32" if dtype == "fp32" else f"compute dtype {dtype}"
        results = [(s, *_update_check(ws[s], ws[s + 1], *batches[s], dtype)) for s in range(cfg["steps"])]
        fails = [r for r in results if not r[1] <= 1]
        if fails:
            s, ratio, summed, where = fails[0]
            why = f" - gradients exactly {WORLD}x one process's: summed over ranks, not averaged" if summed <= 1 else ""
            checks.append(
                Check(
                    "fsdp",
                    impl,
                    f"SGD steps vs one process ({label})",
                    FAIL,
                    f"step {s}: {where}; |diff| / bound {ratio:.3g}{why}",
                )
            )
        else:
            checks.append(
                Check(
                    "fsdp",
                    impl,
                    f"SGD steps vs one process ({label})",
                    PASS,
                    f"{cfg['steps']} steps, worst |diff| / bound {max(r[1] for r in results):.3g}",
                )
            )
    digests = {d: [S.digest(w) for w in ws] for d, ws in first.items()}
    split = [
        (d, s, k)
        for r in per_rank[1:]
        for d, ws in r["repeats"][0].items()
        for s, w in enumerate(ws)
        for k in w
        if w[k] != digests[d][s].get(k)
    ]
    checks.append(
        Check(
            "fsdp",
            impl,
            "every rank gathers the same weights",
            FAIL if split else PASS,
            f"{split[0][0]}, step {split[0][1]}: rank 1's {split[0][2]} differs from rank 0's"
            if split
            else "bitwise equal on every rank",
        )
    )
    races = [
        (i, d, s, k)
        for rank, r in enumerate(per_rank)
        for i, rep in enumerate(r["repeats"][1:], 1)
        for d, ws in rep.items()
        for s, w in enumerate(ws)
        for k in w
        if w[k] != (digests if rank == 0 else r["repeats"][0])[d][s].get(k)
    ]
    if repeat > 1:
        checks.append(
            Check(
                "fsdp",
                impl,
                f"{repeat} repeats bitwise equal (no races)",
                FAIL if races else PASS,
                f"repeat {races[0][0]} ({races[0][1]}, step {races[0][2]}) differs at {races[0][3]}: a race "
                "(a buffer read before its async collective finished?)"
                if races
                else f"all {repeat} repeats bitwise equal",
            )
        )
    return checks


GLOO_COPIES = ", and gloo's copy of each (the freeing checks found every gathered weight freed)"


def fsdp_memory_checks(impl: str, per_rank: list[dict], freed: bool = False) -> tuple[list[Check], list[dict]]:
    """Beyond the handout, on our TransformerLM: memory after init and the forward/backward peak vs the formulas.
    `freed`: the watched steps within the handout found every gathered weight freed (FR.FREEING passed), so an
    excess up to one more input of every reduce-scatter is gloo's: an async reduce-scatter on gloo keeps a copy of
    its input until it completes (measured: the corpus' hook FSDP peaks 6.1 MiB lower with the same reduce-scatters
    made blocking)."""
    cfg, checks, rows = FSDP_CHECK, [], []
    model, b, t = cfg["model"], cfg["batch_size"] // WORLD, cfg["context_length"]
    init_formula = sum(F.fsdp_live_bytes(model, WORLD, b, t, "after init").values())
    full_params = 4 * F.meta_numel(model) + F.buffer_bytes(model)
    rank, mem = max(enumerate(per_rank), key=lambda r: r[1]["memory"]["yours"].points[0].live)
    live = mem["memory"]["yours"].points[0].live
    ok = live <= (1 + FSDP_MEMORY_TOL) * init_formula
    detail = (
        f"rank {rank} holds {live / MiB:.3f} MiB after get_fsdp; formula (1/{WORLD} of the weights, padded, "
        f"norm gains whole) {init_formula / MiB:.3f} MiB, tolerance {FSDP_MEMORY_TOL:.0%}"
    )
    if not ok:
        detail += (
            " - the full weights are still live: not sharded at init (keep only this rank's shard)"
            if live >= 0.9 * full_params
            else " - more than a shard per rank"
        )
    checks.append(Check("fsdp", impl, "memory per rank after init vs formula", PASS if ok else FAIL, detail))
    acts = sum(F.activation_bytes(model, b, t).values()) + F.loss_grad_bytes(model, b, t)
    gathered_all = F.fsdp_shard_elements(model, WORLD)["sharded"] * WORLD * 4
    own = F.fsdp_shard_elements(model, WORLD)
    # + this rank's fp32 gradient shards and gains, made in this first backward, and the full-size fp32 inputs of the
    # reduce-scatters still in flight (an async reduce-scatter keeps its input until it is done: all of them, at most)
    formula = (
        acts
        + F.fsdp_gathered_peak_bytes(model, WORLD, modules=2)
        + 4 * (own["sharded"] + own["replicated"])
        + gathered_all * (2 if freed else 1)
    )
    worst = max(range(len(per_rank)), key=lambda i: _fb_peak(per_rank[i]["memory"]["yours"]))
    peak = _fb_peak(per_rank[worst]["memory"]["yours"])
    ok = peak <= (1 + FSDP_MEMORY_TOL) * formula
    detail = (
        f"rank {worst}: forward/backward peak {peak / MiB:.3f} MiB above the step's start; formula "
        f"(activations + loss gradients + 2 modules' gathered weights + gradient shards + reduce-scatter inputs "
        f"in flight{GLOO_COPIES if freed else ''}"
        f") {formula / MiB:.3f} MiB, tolerance {FSDP_MEMORY_TOL:.0%}"
    )
    if not ok and freed:
        detail += f" - {(peak - formula) / MiB:.3f} MiB more, held across backward (the gathered weights are freed)"
    elif not ok:
        detail += (
            f" - {(peak - formula) / MiB:.3f} MiB more, {(peak - formula) / gathered_all:.0%} of all gathered "
            f"weights ({gathered_all / MiB:.3f} MiB): gathered weights never freed (the peak grows by a "
            "layer's weights per layer)"
        )
    checks.append(
        Check("fsdp", impl, "forward/backward peak vs formula (gathered weights freed)", PASS if ok else FAIL, detail)
    )
    for who in ("yours", "ours"):
        rows.append(
            {
                "topic": "fsdp",
                "impl": impl,
                "measure": "live after init, worst rank",
                "who": who,
                "value": max(r["memory"][who].points[0].live for r in per_rank) / MiB,
                "unit": "MiB",
            }
        )
        rows.append(
            {
                "topic": "fsdp",
                "impl": impl,
                "measure": "forward/backward peak, worst rank",
                "who": who,
                "value": max(_fb_peak(r["memory"][who]) for r in per_rank) / MiB,
                "unit": "MiB",
            }
        )
    rows.append(
        {
            "topic": "fsdp",
            "impl": impl,
            "measure": "live after init, worst rank",
            "who": "formula",
            "value": init_formula / MiB,
            "unit": "MiB",
        }
    )
    for measure in ("live after init, worst rank", "forward/backward peak, worst rank"):
        rows.append(
            {
                "topic": "fsdp",
                "impl": impl,
                "measure": measure,
                "who": "pytorch",
                "value": float("nan"),
                "unit": "MiB",
                "note": "not measured: fully_shard's DTensor storages are opaque to helpers.memory's "
                "tracker on CPU (on a GPU the allocator's peak would do)",
            }
        )
    rows.append(
        {
            "topic": "fsdp",
            "impl": impl,
            "measure": "forward/backward peak, worst rank",
            "who": "formula",
            "value": formula / MiB,
            "unit": "MiB",
        }
    )
    return checks, rows


def _fb_peak(run) -> int:
    p = next(p for p in run.points if p.point == "before step")
    return p.phase_peak - p.phase_start


def fsdp_bytes_checks(impl: str, per_rank: list[dict]) -> tuple[list[Check], list[dict]]:
    e = F.fsdp_shard_elements(FSDP_CHECK["model"], WORLD)
    formula = fsdp_bytes_per_step(e["sharded"] * WORLD, WORLD, 4, 4, e["replicated"])
    sent = {who: bytes_sent(per_rank[0]["logs"][who], WORLD) for who in ("yours", "ours")}
    rows = [
        {
            "topic": "fsdp",
            "impl": impl,
            "measure": "bytes sent per step (rank 0)",
            "who": who,
            "value": v / MiB,
            "unit": "MiB",
        }
        for who, v in {**sent, "formula": formula}.items()
    ]
    if not sent["yours"]:
        return [
            Check(
                "fsdp",
                impl,
                "bytes per step vs formula",
                SKIPPED,
                "no collective seen: calls must go through torch.distributed's functions to be counted",
            )
        ], rows
    ok = abs(sent["yours"] - formula) <= FSDP_BYTES_TOL * formula
    ops = {}
    for op, nbytes in per_rank[0]["logs"]["yours"]:
        ops[op] = ops.get(op, 0) + nbytes
    detail = (
        f"{sent['yours'] / MiB:.3f} MiB sent per step by rank 0 vs formula 3(N-1)/N x Psi x 4 B + the norm gains' "
        f"all-reduce = {formula / MiB:.3f} MiB (tolerance {FSDP_BYTES_TOL:.0%}); by collective: "
        + ", ".join(f"{op} {b / MiB:.3f} MiB" for op, b in ops.items())
    )
    if not ok:
        detail += (
            " - more than the formula: gradients all-reduced instead of reduce-scattered, or weights gathered "
            "more than twice"
            if sent["yours"] > formula
            else " - less than the formula: weights not gathered again for backward (kept from forward?)"
        )
    return [Check("fsdp", impl, "bytes per step vs formula (fp32)", PASS if ok else FAIL, detail)], rows
