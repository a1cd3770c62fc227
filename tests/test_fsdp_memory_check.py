"""Notebook 07 §2's memory check (fsdp_sections.memory_formula_section over fsdp_measure.fsdp_memory_check), on
points made from the formulas themselves (no launch): within, it says where its largest deviation is; one point off
(after a step by 512 bytes, after init by 1, a peak by 20 %) raises, naming the rank, the point and the bytes, where
the H200's notebook run stopped at a bare `assert r2.values["within"]` that did not say which point."""

import pytest

from helpers import formulas as F
from helpers.experiments import fsdp as X
from helpers.experiments import fsdp_sections as S
from helpers.experiments import sharding as SH

MODEL, WORLD, BATCH, CONTEXT = "small-2026/cpu", 2, 4, 64


def exact_points(off: dict | None = None) -> list:
    """after init, then per step before (with its forward/backward peak) and after: bytes as the formulas say, plus
    `off` {(point label): bytes} (a peak's label: "fwd/bwd peak <step>")."""
    off = off or {}
    live = lambda point, step: sum(F.fsdp_live_bytes(MODEL, WORLD, BATCH, CONTEXT, point, step).values())  # noqa: E731
    peak_above_start = (
        sum(F.activation_bytes(MODEL, BATCH, CONTEXT).values())
        + F.loss_grad_bytes(MODEL, BATCH, CONTEXT)
        + F.fsdp_gathered_peak_bytes(MODEL, WORLD, modules=1)
    )
    points = [SH.MemoryPoint("after init", 0, live("after init", 0) + off.get("after init", 0), 0, None)]
    for step in (1, 2):
        start = live("after step", step - 1) if step > 1 else live("after init", 0)
        before = live("before step", step) + off.get(f"before step {step}", 0)
        peak = start + peak_above_start + off.get(f"fwd/bwd peak {step}", 0)
        points.append(SH.MemoryPoint("before step", step, before, peak, None, start, peak))
        points.append(
            SH.MemoryPoint("after step", step, live("after step", step) + off.get(f"after step {step}", 0), 0, None)
        )
    return points


def runs(off_rank1: dict | None = None) -> list:
    return [
        X.MeasureRun([X.FsdpMemory(MODEL, rank, WORLD, BATCH, CONTEXT, exact_points(off), 0)], [], None, {}, {})
        for rank, off in ((0, None), (1, off_rank1))
    ]


def test_points_within_pass_and_say_where_the_largest_deviation_is():
    peak = {p.label: p for p in exact_points()}["before step 2"].phase_peak
    r = S.memory_formula_section(runs({"fwd/bwd peak 2": int(0.05 * peak)}))  # 5 %: inside PEAK_TOL
    assert r.values["within"] and r.values["exact"] and r.values["largest_at"] == "fwd/bwd peak 2"
    assert abs(r.values["largest_deviation"] - 0.05) < 1e-6 and "5.0% (fwd/bwd peak 2; tolerance 10%)" in r.notes[0]
    assert (r.table["difference"] == 0).all()  # rank 0's table: on the formulas


@pytest.mark.parametrize(
    "point,off,shown",
    [("after step 1", 512, "512"), ("fwd/bwd peak 2", None, "fwd/bwd peak 2"), ("after init", -1, "-1")],
)
def test_a_point_off_its_formula_raises_naming_it(point, off, shown):
    if off is None:  # a peak 20 % over: outside PEAK_TOL
        off = int(0.2 * {p.label: p for p in exact_points()}["before step 2"].phase_peak)
    with pytest.raises(AssertionError, match="at 1 point") as raised:
        S.memory_formula_section(runs({point: off}))
    message = str(raised.value)
    first = message.split("every rank's points")[0]  # the rows outside, before the whole table
    rows = [line for line in first.splitlines() if line.rstrip().endswith("False")]
    assert len(rows) == 1 and point in rows[0] and shown in rows[0] and " 1 " in rows[0], first
