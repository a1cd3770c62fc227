"""The checks within the handout's contract for the sharded optimizer (2025/2026 problem optimizer_state_sharding):
the course's test (tests/test_sharded_optimizer.py) replayed on the course's toy models with the tolerance it asserts,
in a launched rank (course_sharding_run, course_state_growth) and judged in the parent (course_sharding_checks,
partition_check)."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

import helpers.course.yours.course_models as CM
import helpers.course.yours.sharding.rules as R
import helpers.course.yours.student_calls as S
from helpers.course.yours.report import FAIL, PASS, Check


def course_sharding_run(make, model: str) -> dict:
    """The course's sharded-optimizer test (2025/2026 tests/test_sharded_optimizer.py) on this rank: one seed on every
    rank, the model deep-copied, AdamW (lr 0.1, weight decay 0.1) unsharded beside yours, 10 steps of a summed squared
    error on the same 32 rows on every rank; both models' final weights."""
    cls = CM.MODELS[model]
    torch.manual_seed(42)
    ref = cls()
    mine = copy.deepcopy(ref)
    ref_opt = torch.optim.AdamW(ref.parameters(), **CM.SHARDING_ADAMW)
    opt = make(mine.parameters(), torch.optim.AdamW, **CM.SHARDING_ADAMW)
    gen = torch.Generator().manual_seed(0)
    for _ in range(CM.SHARDING_STEPS):
        x, y = torch.rand(CM.SHARDING_ROWS, 10, generator=gen), torch.rand(CM.SHARDING_ROWS, 5, generator=gen)
        for net, o in ((ref, ref_opt), (mine, opt)):
            o.zero_grad()
            ((y - net(x)) ** 2).sum().backward()
            o.step()
    return {"ref": _cpu_params(ref), "mine": _cpu_params(mine)}


def _cpu_params(net: nn.Module) -> dict:
    return {n: p.detach().cpu().clone() for n, p in net.named_parameters()}


def course_state_growth(make) -> dict:
    """Bytes of optimizer state the first step creates on this rank (R.state_growth: read from the optimizers the
    wrapper holds), unsharded AdamW's and yours, on the course's ToyModel; and the smallest trainable tensor's state
    (2 moments, float32)."""
    out = {}
    for who, build in (
        ("unsharded", lambda ps: torch.optim.AdamW(ps, **CM.SHARDING_ADAMW)),
        ("yours", lambda ps: make(ps, torch.optim.AdamW, **CM.SHARDING_ADAMW)),
    ):
        torch.manual_seed(42)
        net = CM.ToyModel()
        opt = build(net.parameters())
        x = torch.rand(CM.SHARDING_ROWS, 10, generator=torch.Generator().manual_seed(0))
        net(x).pow(2).sum().backward()
        out[who] = R.state_growth(opt, dict(net.named_parameters()))
    out["smallest"] = 2 * 4 * min(p.numel() for p in CM.ToyModel().parameters() if p.requires_grad)
    return out


def course_sharding_checks(impl: str, model: str, per_rank: list[dict]) -> list[Check]:
    """Final weights vs unsharded AdamW's on every rank, with the test's numpy.testing.assert_allclose (rtol 1e-7)."""
    worst = None
    for rank, r in enumerate(per_rank):
        for n, ref in r["ref"].items():
            ratio, i = S.close_ratio(r["mine"][n], ref, rtol=1e-7, atol=0.0)
            if worst is None or ratio > worst[0]:
                worst = (ratio, rank, n, i, float(r["mine"][n][i]), float(ref[i]))
    ratio, rank, n, i, got, want = worst
    prop = f"{model}: {CM.SHARDING_STEPS} AdamW steps vs unsharded (allclose, rtol 1e-7)"
    detail = (
        f"worst rank {rank}, {n}[{', '.join(map(str, i))}]: yours {got:.8g}, unsharded {want:.8g}; |diff| / "
        f"(rtol |w|) {ratio:.3g}"
    )
    return [Check("sharding", impl, prop, PASS if ratio <= 1 else FAIL, detail)]


def partition_check(impl: str, per_rank: list[dict]) -> Check:
    """Each rank keeps state for only part of the parameters (the 2025/2026 handouts' sharded optimizer: each rank
    updates, and keeps the state of, the parameters it owns): the state the first step leaves on every rank is below
    unsharded AdamW's by at least the smallest tensor's two moments. The test itself checks only the weights."""
    full, least = per_rank[0]["unsharded"], per_rank[0]["smallest"]
    worst = max(range(len(per_rank)), key=lambda i: per_rank[i]["yours"])
    held = per_rank[worst]["yours"]
    ok = held <= full - least
    detail = (
        f"rank {worst} keeps {held} B of optimizer state after the first step, unsharded AdamW {full} B; "
        f"partitioned, no rank keeps the state of every parameter (bound {full} - {least} B, the smallest "
        "tensor's two moments)"
    )
    if not ok and held >= full:
        detail += " - every rank keeps the whole state: not partitioned (step only the parameters this rank owns)"
    return Check("sharding", impl, "ToyModel: optimizer state partitioned over ranks", PASS if ok else FAIL, detail)
