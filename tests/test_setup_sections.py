"""Notebook 00's sections (helpers.experiments.setup): the model sizes' parameter counts two ways, and the warm-up
demo, whose sentence about the first step is made from the samples it saved."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from helpers import results  # noqa: E402
from helpers.experiments import setup  # noqa: E402
from helpers.model import MODEL_SIZES  # noqa: E402
from helpers.timing import Timing  # noqa: E402


def test_sizes_section_counts_every_size_both_ways():
    r = setup.sizes_section()
    assert r.values["mismatched"] == []
    assert r.notes == [f"The formula and the modules agree for all {len(MODEL_SIZES)} sizes."]
    frame = r.table.data
    assert (frame["params (formula)"] == frame["params (modules)"]).all() and list(frame.index) == list(MODEL_SIZES)


def test_sizes_section_names_the_sizes_a_wrong_formula_misses(monkeypatch):
    real = setup.count_parameters
    monkeypatch.setattr(setup, "count_parameters", lambda cfg: real(cfg) + (cfg.name == "small"))  # one off for small
    r = setup.sizes_section()
    assert r.values["mismatched"] == ["small"] and r.notes == ["The formula and the modules disagree for small."]


def planted(cold, warm):
    """A stand-in for timing.benchmark returning the planted samples (seconds): cold for warmup=0, else warm."""

    def benchmark(fn, warmup, steps, device=None, label=""):
        return Timing(cold if warmup == 0 else warm, warmup, "cpu", label)

    return benchmark


@pytest.mark.parametrize(
    ("cold", "verdict"),
    [
        ([0.05] + [0.01] * 9, "slower than every warm step"),
        ([0.0105] + [0.01] * 9, "within the warm steps' range"),
    ],
)
def test_warmup_section_says_what_its_samples_show(monkeypatch, tmp_path, cold, verdict):
    monkeypatch.setattr(results, "DATA_DIR", tmp_path)
    monkeypatch.setattr(setup.timing, "benchmark", planted(cold, [0.01] * 5 + [0.011] + [0.01] * 4))
    r = setup.warmup_section("cpu")
    assert verdict in r.notes[-1] and r.values["warm_max_ms"] == pytest.approx(11.0)
    assert r.values["first_over_warm_median"] == pytest.approx(cold[0] / 0.01)
    saved = results.load_results(r.saved)
    assert [row["warmup_kind"] for row in saved.rows] == ["none", "3 steps"]
    assert saved.provenance["model"] == "small/cpu" and saved.provenance["profile"] == "cpu"
    fig = setup.plot_warmup(r)
    assert [len(line.get_ydata()) for line in fig.axes[0].lines] == [10, 10]
    plt.close(fig)
