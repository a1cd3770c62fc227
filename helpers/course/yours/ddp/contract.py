"""The checks within the handout's contract for DDP: each edition's own test (2024 test_ddp_*.py, 2025/2026
tests/test_ddp.py) replayed on the course's toy models (course_models) with the tolerance the tests assert, in a
launched rank (course_ddp_run) and judged in the parent (course_ddp_checks). The sharded optimizer's are in
helpers.course.yours.sharding.contract, FSDP's (2026) in helpers.course.yours.fsdp.contract."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

import helpers.course.yours.adapters as A
import helpers.course.yours.course_models as CM
import helpers.course.yours.student_calls as S
from helpers.course.yours.report import FAIL, PASS, Check
from helpers.experiments.common import rank_rows

WORLD = S.WORLD


# ---- DDP within the handout's contract: the course's test (2025/2026 tests/test_ddp.py; 2024 test_ddp_*.py) ----

COURSE_BUCKETS_MB = (0.0016, 0.0001, 0.01)  # the 2024 bucketed test's sizes: two buckets, one per tensor, one bucket
ALLCLOSE = dict(rtol=1e-5, atol=1e-8)  # the DDP tests compare with torch.allclose's defaults after every step


def course_ddp_run(fns, impl: str, model: str, bucket_mb) -> dict:
    """The course's DDP test on this rank: the model seeded by the rank, a deepcopy wrapped (the broadcast must give
    rank 0's parameters), 5 SGD steps (lr 0.1, MSE) on this rank's 10 of 20 rows with the adapters' hooks, each step
    compared (allclose, the test's tolerance) with rank 0's model trained in one process on all 20 rows."""
    rank, cls = dist.get_rank(), CM.MODELS[model]
    torch.manual_seed(rank)
    local = cls()
    torch.manual_seed(0)
    ref = cls()  # rank 0's model: the one-process reference on every rank
    shim = S.StudentDDP(fns, impl, copy.deepcopy(local), bucket_mb)
    mine = S.by_position(ref, shim.ddp)
    start_diff = [n for n, p in ref.named_parameters() if not torch.equal(mine[n].detach(), p.detach())]
    shim.optimizer = opt = torch.optim.SGD(shim.ddp.parameters(), lr=CM.DDP_LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=CM.DDP_LR)
    x, y = CM.ddp_data()
    rows, steps = rank_rows(x.shape[0], rank, WORLD), []
    for i in range(CM.DDP_STEPS):
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        g_ref = {n: p.grad.detach().clone() for n, p in ref.named_parameters() if p.grad is not None}
        ref_opt.step()
        shim.on_train_batch_start()  # before zero_grad(), as the 2024 and 2025 tests call them
        opt.zero_grad()
        nn.functional.mse_loss(shim(x[rows]), y[rows]).backward()
        shim.finish_gradient_synchronization()
        grads = {n: p.grad.detach().clone() for n, p in mine.items() if p.grad is not None}
        opt.step()
        ratios = {n: S.close_ratio(mine[n].detach(), p.detach(), **ALLCLOSE) for n, p in ref.named_parameters()}
        worst = max(ratios, key=lambda n: ratios[n][0])
        i_w = ratios[worst][1]
        steps.append(
            {
                "ratio": ratios[worst][0],
                "where": (
                    f"{worst}[{', '.join(map(str, i_w))}]: yours {float(mine[worst].detach()[i_w]):.6g}, one process "
                    f"{float(dict(ref.named_parameters())[worst].detach()[i_w]):.6g}"
                ),
                "finite": all(bool(torch.isfinite(g).all()) for g in grads.values()),
                "summed": bool(g_ref)
                and all(
                    n in grads
                    and torch.allclose(grads[n], WORLD * g, **ALLCLOSE)
                    and not torch.allclose(grads[n], g, **ALLCLOSE)
                    for n, g in g_ref.items()
                ),
                "zeros": sorted(
                    n for n, g in g_ref.items() if bool(g.any()) and (n not in grads or not grads[n].any())
                ),
                "grads": S.digest(grads),
            }
        )
        x, y = CM.shuffled(i, x, y)
    return {"start_diff": start_diff, "steps": steps}


def course_ddp_checks(impl: str, label: str, per_rank: list[dict]) -> list[Check]:
    """The course test's two assertions, on every rank: rank 0's parameters after construction; after each step the
    parameters allclose to one process's. A diagnosis only when its whole signature is there."""
    after = A.ADAPTERS["ddp"][impl][1]
    diff = sorted({n for r in per_rank for n in r["start_diff"]})
    ranks = [i for i, r in enumerate(per_rank) if r["start_diff"]]
    checks = [
        Check(
            "ddp",
            impl,
            f"{label}: rank 0's parameters after construction",
            FAIL if diff else PASS,
            f"rank(s) {ranks} still hold their own {', '.join(diff[:4])} after construction: not broadcast from rank 0"
            if diff
            else "every rank starts from rank 0's parameters",
        )
    ]
    bad = [(s, rank) for rank, r in enumerate(per_rank) for s, st in enumerate(r["steps"]) if not st["ratio"] <= 1]
    prop = f"{label}: {CM.DDP_STEPS} SGD steps vs one process (allclose)"
    if not bad:
        worst = max(st["ratio"] for r in per_rank for st in r["steps"])
        checks.append(
            Check("ddp", impl, prop, PASS, f"every step on every rank; worst |diff| / (atol + rtol |w|) {worst:.3g}")
        )
        return checks
    s, rank = min(bad)
    st = per_rank[rank]["steps"][s]
    digests = [r["steps"][s]["grads"] for r in per_rank]
    unsynced = sorted({n for d in digests[1:] for n in set(d) | set(digests[0]) if d.get(n) != digests[0].get(n)})
    why = ""
    if not st["finite"]:
        why = " - a gradient is not finite (NaN/inf) after " + after
    elif diff:
        why = " - the ranks did not start from rank 0's parameters (the check above)"
    elif all(r["steps"][s]["summed"] for r in per_rank):
        why = f" - every gradient is {WORLD}x one process's: summed over ranks, not averaged (divide by the world size)"
    elif unsynced:
        why = (
            f" - {', '.join(unsynced[:4])}'s gradient is not the same on every rank after {after}: not all-reduced "
            "before the optimizer step"
        )
    elif st["zeros"] and all(r["steps"][s]["zeros"] == st["zeros"] for r in per_rank):
        why = (
            f" - {', '.join(st['zeros'][:4])}'s gradient is all zeros after {after} on every rank, one process's is "
            "not: what was all-reduced and copied back was not this gradient (read before backward produced it?)"
        )
    checks.append(
        Check(
            "ddp",
            impl,
            prop,
            FAIL,
            f"step {s}, rank {rank}: {st['where']}; |diff| / (atol + rtol |w|) "
            f"{st['ratio']:.3g}, allclose's bound 1{why}",
        )
    )
    return checks


def course_ddp_configs(impl: str) -> list[tuple[str, float | None]]:
    """(model, bucket size) pairs the course's tests run a flavour on: both toy models, each bucket size for
    bucketed."""
    sizes = COURSE_BUCKETS_MB if impl == "bucketed" else (None,)
    return [(m, mb) for m in CM.MODELS for mb in sizes]
