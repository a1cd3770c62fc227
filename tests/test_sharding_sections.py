"""Notebook 05's section functions (helpers.experiments.sharding_sections): each returns one Result whose notes are
made from the same numbers as its table and claim only what the numbers show. Synthetic runs (no launch): the workers
are tested in test_sharding.py, the whole notebook under nbval."""

import numpy as np
import pandas as pd
import pytest
import torch

from helpers import results
from helpers.experiments import sharding as SR
from helpers.experiments import sharding_sections as S
from helpers.experiments.sharding_memory import memory_summary
from helpers.formulas import MiB

KINDS = ["unsharded", "naive_sharded", "sharded", "zero1"]
JITTER = 1 + 0.02 * np.random.default_rng(0).standard_normal(8)  # the same for every kind: exact ratios


def _kind_runs(changed: str | None = None) -> dict:
    """One rank's KindRuns: equal weights and gradients everywhere, except `changed` (one weight off by 1e-7)."""
    w = {"w": torch.ones(3)}
    runs = {}
    for k in KINDS:
        weights = {"w": w["w"] + (1e-7 if k == changed else 0.0)}
        runs[k] = SR.KindRun(k, 0, weights, 8 * MiB, [[("all_reduce", 4)]] * 3, [True] * 3)
    return runs


def test_correctness_note_claims_bitwise_equality_only_when_every_row_has_it():
    good = S.correctness_result([_kind_runs(), _kind_runs()], model="small/cpu", seconds=2.0, where="here")
    assert good.values["same"] and "bit for bit as the unsharded run" in good.notes[0]
    assert list(good.table.index) == KINDS and good.equal["same_weights"].all()
    assert repr(good).splitlines()[0] == good.notes[0]  # displayed as a Result (the notes first), not its fields
    bad = S.correctness_result([_kind_runs(), _kind_runs("zero1")], model="small/cpu", seconds=2.0, where="here")
    assert not bad.values["same"] and "NOT bitwise equal" in bad.notes[0]
    assert bad.table.loc["zero1", ("max_abs_diff", 1)] > 0


def _traffic(ok: bool = True) -> pd.DataFrame:
    rows = {
        "unsharded": {"per-rank traffic / Ψ": 1.0, "state / (Ψ_state/N)": 2.0, "matches formula": True},
        "sharded": {"per-rank traffic / Ψ": 1.5, "state / (Ψ_state/N)": 1.0312, "matches formula": ok},
        "zero1": {"per-rank traffic / Ψ": 1.0001, "state / (Ψ_state/N)": 1.0001, "matches formula": True},
    }
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("kind")


def test_collectives_notes_read_the_counted_table():
    r = S.collectives_result(_traffic(), model="small/cpu", world=2, where="here")
    first, traffic, state = r.notes
    assert "counted vs formula: equal ·" in first
    assert "ShardedOptimizer 1.500 Ψ (1.50x), ZeRO-1 1.000 Ψ (1.0001x: the padding only)" in traffic
    assert "ShardedOptimizer (whole tensors) 1.0312" in state
    bad = S.collectives_result(_traffic(ok=False), model="small/cpu", world=2, where="here")
    assert "NOT equal in every row" in bad.notes[0]


def _speed_run(medians: dict) -> SR.SpeedRun:
    samples = {
        k: [
            {"fwd_bwd": 0.8 * m * j, "grad_comm": 0.1 * m * j, "step": 0.2 * m * j, "step_comm": 0.05 * m * j}
            for j in JITTER
        ]
        for k, m in medians.items()
    }
    return SR.SpeedRun(samples, dict.fromkeys(medians, 0), dict.fromkeys(medians, True))


def test_ratios_section_pairs_kinds_of_one_launch_and_saves_them(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "DATA_DIR", tmp_path)
    run = _speed_run({"unsharded": 0.10, "naive_sharded": 0.13, "sharded": 0.12, "zero1": 0.10, "torch_zero": 0.11})
    raw = [[run, run]]
    sp = S.SpeedResult(raw=raw, speed=SR.speed_table(raw))
    setting = S.Setting("cpu", "gloo", "cpu", S.PROFILES["cpu"], None, "here")
    r = S.ratios_section(setting, sp)
    assert "ShardedOptimizer takes 1.20x unsharded's time per iteration" in r.notes[0]
    assert "no measurable difference between Zero1Optimizer and unsharded" in r.notes[-1]  # the very same samples
    assert r.table.loc[("unsharded", "sharded"), "ratio"] == pytest.approx(1.2)
    assert len(results.load_results(r.saved).frame()) == 5 * 4  # every ordered pair of the one launch


def test_memory_summary_says_more_when_sharding_holds_more():
    rows = [
        {
            "model": "small/cpu",
            "kind": k,
            "rank": 0,
            "step": s,
            "label": label,
            "live_bytes": live * MiB,
            "peak_bytes": peak * MiB,
        }
        | {"phase_peak_bytes": (live + 1) * MiB}
        for k, live, peak in (("unsharded", 10.0, 20.0), ("sharded", 8.0, 21.0), ("zero1", 8.0, 20.0))
        for s, label in ((1, "after step 1"), (2, "after step 2"))
    ]
    text = memory_summary(pd.DataFrame(rows))
    assert "8.0 MiB with ShardedOptimizer (20% less)" in text
    assert "21.0 MiB with ShardedOptimizer (5% more)" in text  # never 'falls' when it rose


def test_the_notebooks_source_cells_show_the_optimizers_from_helpers():
    """Every source() cell of notebook 05 shows code from helpers/, and together they show every optimizer it
    measures."""
    import json

    from helpers import comm, sharding
    from helpers.section import ROOT, source

    cells = json.loads((ROOT / "notebooks" / "05_optimizer_state_sharding.ipynb").read_text())["cells"]
    shown = [
        eval("".join(c["source"]), {"source": source, "sharding": sharding, "comm": comm})  # noqa: S307 (our own notebook)
        for c in cells
        if c["cell_type"] == "code" and "".join(c["source"]).startswith("source(")
    ]
    where = [w for s in shown for w, _ in s.blocks()]
    assert all(w.startswith("helpers/") for w in where), where
    for name in ("ShardedOptimizer", "NaiveShardedOptimizer", "Zero1Optimizer", "partition_by_bytes"):
        assert any(w.endswith(f" · {name}") for w in where), name
