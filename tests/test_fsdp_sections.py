"""Notebook 07's section functions (helpers.experiments.fsdp_sections), as the notebook calls them, on small shapes:
each returns a Result whose notes are made from its values, saves the tables the answers page reads (names and
provenance keys), and refuses to save a table that breaks its section's bound."""

import json

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch

from helpers.experiments import fsdp as X
from helpers.experiments import fsdp_sections as S
from helpers.model import build_model
from helpers.section import Result, source
from helpers.writeup import headline_figure

SMALL = {  # notebook 07's cpu profile as Setup.resolve makes it (the 2026 model), cut to a few quick steps
    **S.Setup.resolve("cpu").config,
    **dict(steps=2, warmup=1, ckpt_layers=4, segments=[0, 1, 4], ckpt_steps=1),
    **dict(ring_worlds=[2], ring_sizes=[8, 1000], ring_steps=1),
}


@pytest.fixture
def setup(tmp_path):
    return S.Setup("cpu", SMALL, directory=tmp_path)


def provenance(path) -> dict:
    return json.loads(path.read_text().splitlines()[0])["provenance"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    setup = S.Setup("cpu", SMALL, directory=tmp_path_factory.mktemp("measured"))
    return setup, S.measure_section(setup)


def test_equivalence_section_saves_its_table_and_says_its_values(setup):
    r = S.equivalence_section(setup)
    assert r.values["max_ratio"] <= 1 and r.values["replicated_equal"] and r.values["one_rank_bitwise"]
    assert f"{r.values['max_ratio']:.2g}" in r.notes[0] and "bitwise equal to plain PyTorch" in r.notes[0]
    saved = pd.read_json(r.saved, lines=True).dropna(subset=["ranks"])
    assert set(saved["ranks"]) == {1, 2} and set(saved["dtype"]) == {"fp32", "fp16"}
    assert r.saved.name == "07_equivalence.jsonl" and provenance(r.saved)["world_size"] == 2


def test_a_table_over_its_bound_is_refused_and_not_saved(setup, monkeypatch):
    rows = [dict(ranks=n, dtype="fp32", bitwise=n == 1, replicated_equal=True) for n in (2, 1)]
    table = pd.DataFrame(rows).assign(**{"max_diff/bound": [2.0, 0.0], "whole batch max_abs_diff": 0.0})
    monkeypatch.setattr(S, "launch", lambda *args, **kwargs: [])  # no ranks: the table below stands for theirs
    monkeypatch.setattr(X, "equivalence_table", lambda *args, **kwargs: table[table["ranks"] == 2])  # outside
    with pytest.raises(AssertionError, match="outside the derived bound"):
        S.equivalence_section(setup)
    assert not list(setup.directory.glob("*.jsonl"))


def test_the_measure_sections_read_one_launch(measured):
    setup, m = measured
    assert len(m.runs) == 2 and m.saved.name == "07_memory.jsonl"
    assert repr(m).startswith(m.notes[0]) and "MeasureRun" not in repr(m)  # displayed as a Result, runs left out
    assert set(m.values["peak"]) == {"ddp", "zero1", "fsdp"}
    f = S.memory_formula_section(m.runs)
    assert f.values["within"] and f.values["exact"] and set(f.table["rank"]) == {0}
    z = S.zero_section(setup, m.runs)
    assert z.values["largest_deviation"] < 0.01 and z.saved.name == "07_zero_check.jsonl"
    assert z.values["peak_fall"] > 0 and f"{z.values['states_saved']:.3f} MiB" in z.notes[1]
    share = z.values["peak_fall"] / z.values["states_saved"]
    inside = abs(z.values["peak_fall"] - z.values["states_saved"]) <= S.X.PEAK_TOL * z.values["peak"]["ddp"]
    assert ("no measurable difference" in z.notes[1]) == inside  # the peak check's tolerance, as on the answers page
    assert ("more than" in z.notes[1]) == (not inside and share > 1) and ("less than" in z.notes[1]) == (
        not inside and share < 1
    )
    b = S.bytes_section(setup, m.runs)
    assert b.values["equal"] and abs(b.values["ratio"] - 1.5) < 0.01 and f"{b.values['ratio']:.4f}" in b.notes[0]
    t = S.timeliness_section(setup, m.runs)
    lm = build_model(SMALL["model"])  # every sharded module (Linear, Embedding) but the first is prefetched, per rank
    sharded = sum(isinstance(mod, torch.nn.Linear | torch.nn.Embedding) for mod in lm.modules())
    assert t.values["prefetched"] == 2 * (sharded - 1) and provenance(t.saved)["model"] == "small-2026/cpu"
    assert provenance(t.saved)["edition"] == "2026"
    s = S.speed_section(setup, m.runs)
    kinds = ["ddp", "zero1", "torch_fsdp"]  # 2 steps: too few pairs for a verdict either way
    assert all(f"tell {k} from FSDP" in n for k, n in zip(kinds, s.notes, strict=False))
    assert len(s.notes) == 4 and all("too few paired samples" in n for n in s.notes[:-1])


def test_checkpoint_section_keeps_the_provenance_the_answers_read(setup):
    card = "xl-2026's step without checkpointing needs about 72 GB; this card has 40: small/cpu swept in its place"
    setup.config = {**setup.config, "left_out": [card]}  # as config_for says it
    r = S.checkpoint_section(setup)
    assert r.notes[-1] == card  # what the card left out, in the cell's notes
    assert r.values["measured_best"] == r.values["k_best"] == 1 and r.values["split_saves"]  # k = 1 < L = 4 saves
    p = provenance(r.saved)
    assert {"model", "n_blocks", "batch", "context", "k_continuous", "k_best", "steps"} <= set(p) and p["n_blocks"] == 4
    assert f"k = {r.values['measured_best']}" in r.notes[0]


def test_ring_section_is_exact_and_fits(setup):
    r = S.ring_section(setup)
    assert r.values["exact"] and r.values["bytes_exact"] and r.values["alpha_s"] > 0
    assert {"alpha_s", "W_Bps"} <= set(provenance(r.saved)) and f"{r.values['alpha_s'] * 1e6:.0f} µs" in r.notes[0]


def test_ring_section_says_when_the_fit_found_no_bandwidth_term(setup, monkeypatch):
    real = X.ring_fit
    monkeypatch.setattr(X, "ring_fit", lambda table: {**real(table), "W_Bps": 1e15})  # ring_fit's floor on 1/W
    r = S.ring_section(setup)
    assert "at or below zero" in r.notes[0] and "GB/s" not in r.notes[0]


def test_closed_form_sections(setup):
    ffn = S.ffn_section(setup)
    assert ffn.values["dp_bytes"] == ffn.values["fsdp_bytes"] and provenance(ffn.saved)["n_tp"] == 4
    assert f"{ffn.values['dp_min_tokens']:.0f} tokens" in ffn.notes[0]
    plans = S.leaderboard_section()
    try:
        assert plans.values["plans"] == len(plans.table) and plans.figure is not None
        assert any(n.endswith("no plan fits") for n in plans.notes) == (None in plans.values["best"].values())
    finally:
        plt.close(plans.figure)
    assert S.strategies_calculator().table(world_size=1)["total (GB)"].nunique() == 1
    assert S.memory_calculator().table(pp=1)["pipeline bubble"].eq(0).all()


def test_the_front_page_finds_a_result_figure_in_the_headline_cell():
    import nbformat

    fig, ax = plt.subplots()
    ax.plot([0, 1])
    html = Result(notes=["a note"], figure=fig)._repr_html_()
    cell = nbformat.v4.new_code_cell("r", metadata={"tags": ["headline"]})
    cell.outputs = [nbformat.v4.new_output("execute_result", data={"text/html": html, "text/plain": "r"})]
    png = headline_figure(nbformat.v4.new_notebook(cells=[cell]))
    assert png and png in html and png.startswith("iVBOR")  # the PNG's signature, base64


def test_the_code_the_notebook_shows_is_read_from_the_package():
    from helpers.fsdp_hooks import GatherHooks
    from helpers.fsdp_storage import ShardStore

    text = repr(source(ShardStore.free, GatherHooks.post_forward, X.CheckpointedLM))
    assert "untyped_storage().resize_(0)" in text and "shard.outside" in text and "use_reentrant=False" in text
