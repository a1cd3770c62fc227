"""helpers.course.live without a browser: the panel's Run, its error path, and its one line for exported pages."""

import pandas as pd
import pytest

from helpers import writeup
from helpers.course import live
from helpers.experiments import fsdp as XF

SMALL = {**XF.PROFILES["cpu"], "ckpt_layers": 2, "ckpt_batch": 1, "ckpt_context": 8, "segments": [0, 1, 2]}


def test_run_shows_the_measured_table_and_a_failure_in_place():
    calls = []

    def measure(k):
        calls.append(k)
        if k < 0:
            raise ValueError("k must be >= 0")
        return pd.DataFrame({"k": [k]}), None

    import ipywidgets as W

    panel = live.Panel("t", {"k": W.IntText(value=3)}, measure, "edit K")
    assert panel.run()["k"].tolist() == [3] and panel.progress.value == 3 and "done" in panel.status.value
    panel.controls["k"].value = -1
    panel.run()  # not raised: shown in the panel, the button usable again
    assert "failed: ValueError: k must be >= 0" in panel.status.value and not panel.button.disabled
    assert calls == [3, -1]


def test_exported_pages_keep_one_line_naming_the_variable():
    bundle = live.checkpoint_panel("cpu", config=SMALL)._repr_mimebundle_()
    assert writeup.WIDGET_VIEW in bundle and "<code>SEGMENT</code>" in bundle["text/html"]
    assert "07_fsdp.ipynb" in bundle["text/html"]


def test_checkpoint_measure_is_against_no_checkpointing_with_an_interval():
    table, fig = live.checkpoint_measure(1, SMALL)
    assert table.index.tolist() == [0, 1] and table.loc[0, "ratio"] == 1.0
    assert (table["low"] <= table["ratio"]).all() and (table["ratio"] <= table["high"]).all()
    assert fig is not None
    with pytest.raises(ValueError, match="segment must be a positive"):
        live.checkpoint_measure(0, SMALL)


def test_the_gpu_checkpoint_panel_names_the_models_own_depth():
    """Issue 39 item 11: the gpu profile checkpoints xl at its own depth (ckpt_layers None): the title said "(None
    blocks)"."""
    panel = live.checkpoint_panel("gpu")
    assert "(48 blocks)" in panel.title and "None" not in panel.title


def test_without_ipywidgets_a_panel_is_one_line_and_still_measures(monkeypatch):
    """A Python without ipywidgets (a GPU image's, say): every notebook's live cell shows one line naming what is
    missing and how to get it, never an ImportError, and show(run=True) still measures the cell's values."""
    import sys

    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets -> ImportError
    for make in (
        lambda: live.checkpoint_panel("cpu", config=SMALL),
        lambda: live.bucket_panel("cpu", backend="gloo", device="cpu"),
        lambda: live.collectives_panel("cpu"),
    ):
        bundle = make()._repr_mimebundle_()
        assert "needs ipywidgets" in bundle["text/plain"] and "pip install ipywidgets" in bundle["text/html"]
    measured = []

    def measure(k):
        measured.append(k)
        return pd.DataFrame({"k": [k]}), None

    panel = live.Panel("t", {"k": live._widgets().IntText(value=3)}, measure, "x")
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: None)
    panel.show(run=True)
    assert measured == [3] and panel.table["k"].tolist() == [3]
