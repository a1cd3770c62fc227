"""Notebook 04's section functions (helpers.experiments.ddp_sections): each returns one Result whose notes are made
from the same numbers as its table, and says what it measured only as far as the numbers allow. Synthetic runs (no
launch): the workers themselves are tested in test_ddp.py, the whole notebook under nbval."""

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from helpers import results  # noqa: E402
from helpers.experiments import ddp as R  # noqa: E402
from helpers.experiments import ddp_sections as S  # noqa: E402
from helpers.experiments.ddp_speed import StepIntervals  # noqa: E402

MODEL = "small/cpu"
JITTER = 1 + 0.02 * np.random.default_rng(0).standard_normal(10)  # the same for every variant: exact ratios


def _run(step: float, backward: float, buckets=None, overlap: float = 0.0) -> R.SpeedRun:
    """10 steps around `step` s; one recorded step whose all-reduce has `overlap` of its time inside backward."""
    noise = lambda m: list(m * JITTER)  # noqa: E731
    span = StepIntervals((0.0, 1.0), [[1.0 - overlap, 2.0 - overlap]])
    return R.SpeedRun(noise(step), noise(step / 10), noise(backward), [span], buckets, [span])


def _speed(runs: dict) -> R.SpeedResult:
    """A SpeedResult for MODEL from one rank's runs by label, both ranks alike (as speed_table builds it)."""
    raw = {MODEL: [runs, runs]}
    speed = pd.DataFrame([{"model": MODEL, "grad_MB": 1.0, **r} for r in R.summarize_speed(raw[MODEL])])
    return R.SpeedResult(
        R.speed_pivot(speed), notes=["timed"], raw=raw, speed=speed, buckets_mb=[0.5, 1, 25], sweep_model=MODEL
    )


@pytest.fixture
def speed():
    runs = {
        "local": _run(0.010, 0.006),
        "naive": _run(0.040, 0.006),
        "flat": _run(0.020, 0.006),
        "per_parameter": _run(0.018, 0.009, buckets=20, overlap=0.6),
        "bucketed 0.5 MB": _run(0.015, 0.008, buckets=3, overlap=0.5),
        "bucketed 1 MB": _run(0.015, 0.008, buckets=1, overlap=0.1),
        "bucketed 25 MB": _run(0.015, 0.008, buckets=1, overlap=0.1),
        "torch_ddp 25 MB": _run(0.030, 0.007, buckets=1),
    }
    return _speed(runs)


def _setting(tmp_path, monkeypatch) -> R.Setting:
    monkeypatch.setattr(results, "DATA_DIR", tmp_path)  # saved rows go to the test's folder
    return R.Setting("cpu", "gloo", "cpu", R.PROFILES["cpu"], None, "here", tmp_path / "local" / "x" / "04_traces")


def _checks(grad_ratio: float) -> pd.DataFrame:
    """The toy's bucketed rows in bound, and one small/cpu row (AdamW: weights not compared) at `grad_ratio`."""
    same = {"start_equal": True, "ranks_equal": True}
    toy = [
        {"model": "toy", "variant": f"bucketed x{n}", "buckets": n, "grad_ratio": 0.1, "weight_ratio": 0.2}
        for n in (1, 2, 3)
    ]
    lm = {"model": MODEL, "variant": "naive", "buckets": None, "grad_ratio": grad_ratio, "weight_ratio": np.nan}
    return pd.DataFrame([{**row, **same} for row in [*toy, lm]])


def test_correctness_note_claims_equivalence_only_when_every_row_is_within_bound():
    good = S.correctness_result(_checks(0.5), seconds=3.0, where="here")
    assert "compute one process's gradients" in good.notes[0] and good.values["grad_ratio"] == 0.5
    assert good.values["toy_buckets"] == {"bucketed x1": 1, "bucketed x2": 2, "bucketed x3": 3}
    bad = S.correctness_result(_checks(1.5), seconds=3.0, where="here")
    assert "NOT all within bound" in bad.notes[0] and "1.5 (gradients)" in bad.notes[0]


def test_the_speed_section_says_which_sizes_the_card_left_out(speed, tmp_path, monkeypatch):
    """Issue 47 item 4: where the ranks share a card too small for a size's launch, config_for leaves it out and the
    cell's notes say so (the launch stood in by the synthetic runs)."""
    from helpers.budget import Budget

    card = "medium-2026's speed launch needs about 53 GB (2 ranks share the card); this card has 40: not timed here"
    s = _setting(tmp_path, monkeypatch)
    s.config, s.budget = {**s.config, "sizes": [MODEL], "sweep_model": MODEL, "left_out": [card]}, Budget(None)
    monkeypatch.setattr(S, "speed_table", lambda *a, **k: (speed.raw, speed.speed))
    r = S.speed_section(s)
    assert r.notes[-1] == card and r.sweep_model == MODEL


def test_ratios_name_a_winner_from_the_same_samples_as_the_table(speed, tmp_path, monkeypatch):
    r = R.ratios_section(_setting(tmp_path, monkeypatch), speed)
    [line] = r.notes
    assert "flat takes 0.50x naive's time" in line  # planted: 20 ms against 40 ms, 2% noise
    assert "bucketed 25 MB takes 0.50x torch_ddp 25 MB's time" in line
    flat = r.table.loc[(MODEL, "naive", "flat")]
    assert flat["ratio"] == pytest.approx(0.5, rel=0.05) and flat["ratio_high"] < 1  # the note's interval
    assert (
        r.saved == tmp_path / "local" / results.device_slug(results.machine_facts()["device"]) / "04_ddp_ratios.jsonl"
    )
    saved = results.load_results(r.saved).frame()
    assert set(saved["field"]) == {"step", "backward", "comm"}  # the answers page reads all three


def test_backward_says_no_difference_inside_the_noise(speed):
    same = dict(speed.raw[MODEL][0])
    same["per_parameter"] = same["local"]  # the very samples compute alone took
    r = R.backward_section(_speed(same))
    assert "no measurable difference between per-parameter and compute alone" in r.notes[0]
    assert "per-parameter takes 1.50x compute alone's backward time" in R.backward_section(speed).notes[0]
    assert r.table.loc["naive", MODEL] == pytest.approx(6.0, rel=0.05)  # ms, the median backward


def test_overlap_section_tables_and_draws_the_shown_variants(speed, tmp_path, monkeypatch):
    r = R.overlap_section(_setting(tmp_path, monkeypatch), speed)
    o = r.values["overlap"]
    assert list(o.index) == ["naive", "per_parameter", "bucketed 0.5 MB", "bucketed 25 MB", "torch_ddp 25 MB"]
    assert o.loc["per_parameter", "trace overlap"] == pytest.approx(0.6)
    assert o.loc["naive", "launch→done max"] == 0.0 and np.isnan(o.loc["torch_ddp 25 MB", "launch→done overlap"])
    assert r.figure is not None and "Chrome traces" in r.notes[1]
    assert "04_ddp_overlap.jsonl" in r._repr_html_()


def test_bucket_section_notes_come_from_the_sweep(speed, tmp_path, monkeypatch):
    r = R.bucket_section(_setting(tmp_path, monkeypatch), speed, _AB(alpha_s=1e-4, beta_Bps=1e9))
    assert list(r.sweep["bucket_MB"]) == [0.5, 1.0, 25.0] and r.sweep["predicted_s"].gt(r.fit.local_step_s).all()
    assert r.notes[0].startswith(f"{MODEL}: S = ") and f"n* = {r.fit.n_star:.1f} buckets" in r.notes[0]
    spread = r.sweep["step_s"].max() / r.sweep["step_s"].min() - 1
    assert any(f"({spread:.0%})" in n for n in r.notes)
    assert any("2 sizes that all build one bucket" in n for n in r.notes)  # 1 and 25 MB planted as one bucket
    assert r.plot().axes[0].get_xscale() == "log"
    assert repr(r).splitlines()[0] == r.notes[0] and repr(speed).splitlines()[0] == speed.notes[0]  # not their fields
    saved = results.load_results(r.saved)
    assert saved.provenance["n_star"] == pytest.approx(r.fit.n_star) and saved.provenance["model"] == MODEL


class _AB:
    def __init__(self, alpha_s, beta_Bps):
        self.alpha_s, self.beta_Bps = alpha_s, beta_Bps


def test_the_notebooks_source_cells_show_the_wrappers_from_helpers():
    """Every source() cell of notebook 04 shows code from helpers/ (not a decorator's file), and together they show
    every wrapper the notebook measures."""
    import json

    from helpers import comm, ddp
    from helpers.section import ROOT, source

    cells = json.loads((ROOT / "notebooks" / "04_ddp.ipynb").read_text())["cells"]
    shown = [
        eval("".join(c["source"]), {"source": source, "ddp": ddp, "comm": comm})  # noqa: S307 (our own notebook)
        for c in cells
        if c["cell_type"] == "code" and "".join(c["source"]).startswith("source(")
    ]
    where = [w for s in shown for w, _ in s.blocks()]
    assert all(w.startswith("helpers/") for w in where), where
    for name in ("NaiveDDP", "FlatDDP", "DDPIndividualParameters", "DDPBucketed", "TorchDDP", "InFlight"):
        assert any(w.endswith(f" · {name}") for w in where), name


def test_shown_labels_pick_the_largest_bucket_size_that_still_splits():
    counts = {"local": None, "naive": None, "per_parameter": None, "bucketed 0.5 MB": 9, "bucketed 5 MB": 3}
    counts |= {"bucketed 25 MB": 2, "bucketed 50 MB": 1, "bucketed 500 MB": 1, "torch_ddp 25 MB": None}
    assert R.shown_labels(counts) == ["naive", "per_parameter", "bucketed 25 MB", "torch_ddp 25 MB"]
    counts["bucketed 25 MB"] = 1  # the model fits one 25 MB bucket: 5 MB is the largest that splits it
    assert R.shown_labels(counts) == ["naive", "per_parameter", "bucketed 5 MB", "bucketed 25 MB", "torch_ddp 25 MB"]
