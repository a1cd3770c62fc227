"""Notebook 01 per course edition (benchmarking.EDITIONS): each edition's model, sizes, batch, context and passes;
the full training step timed on a copy of the model; memory over the edition's contexts; and the answers page saying,
per edition, whether an answer ran that edition's own model."""

import math

import answers_data as D
import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from helpers import results  # noqa: E402
from helpers.budget import Budget  # noqa: E402
from helpers.course import answers as A  # noqa: E402
from helpers.course.answers.page import render  # noqa: E402
from helpers.experiments import benchmarking as XB  # noqa: E402
from helpers.experiments import benchmarking_sections as sections  # noqa: E402
from helpers.model import build_model, edition_arch, get_config, random_batch  # noqa: E402


def test_each_edition_runs_its_handouts_model_and_settings():
    for profile in ("cpu", "gpu"):
        for edition, plan in XB.EDITIONS.items():
            e = plan.for_profile(profile)
            arch = get_config(e["profile_size"]).arch
            assert arch == edition_arch(edition) == ("gpt" if edition == "2024" else "basics"), (edition, profile)
    assert XB.EDITIONS["2026"].for_profile("gpu") | {} == {
        "batch": 4,
        "context": 512,  # §2.1.2: "Use context length 512 unless otherwise specified"
        "profile_size": "large-2026",  # its xl (the 2.7B's shape) with AdamW would need ~75 GB unguarded
        "memory_size": "xl-2026",
        "memory_contexts": (128, 2048),  # memory_profiling: the xl at 128 and 2048
    }
    cpu = XB.EDITIONS["2026"].for_profile("cpu")
    assert (cpu["context"], cpu["memory_size"], cpu["memory_contexts"]) == (128, "xl-2026/cpu", (32, 512))
    assert XB.EDITIONS["2025"].for_profile("gpu")["memory_contexts"] == (128, 256, 512)  # the 2.7B at these
    assert "step" in XB.EDITIONS["2026"].kinds and "step" not in XB.EDITIONS["2024"].kinds
    with pytest.raises(ValueError, match="EDITION = '2023'"):
        sections.Setup.resolve("cpu", "none", "2023")


def test_the_full_step_is_timed_after_the_retained_graph_is_freed():
    lm = build_model("small-2026/cpu", n_layers=1)
    x, y = random_batch(lm.cfg, 2, 8)
    backward, step = XB.pass_fn(lm, x, y, "backward"), XB.pass_fn(lm, x, y, "step")
    step()  # AdamW updates the weights in place: the graph "backward" kept is no longer valid
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        backward()
    rows = XB.time_size("small-2026/cpu", 2, 8, warmup=1, steps=2, kinds=XB.PASSES + ("step",))
    assert [r["pass"] for r in rows] == ["forward", "backward", "both", "step"] and all(
        r["status"] == "ok" for r in rows
    )


def edition_setup(edition: str) -> sections.Setup:
    """A tiny Setup of an edition's smallest cpu preset (one layer less is not possible: the presets are built)."""
    plan = XB.EDITIONS[edition]
    return sections.Setup(
        profile="cpu",
        device=torch.device("cpu"),
        device_name="test cpu",
        budget=Budget(None, "01", None),
        sizes=[f"small{plan.suffix()}/cpu"],
        batch=2,
        context=8,
        warmup=1,
        steps=6,
        cold_steps=3,
        profile_size=f"small{plan.suffix()}/cpu",
        prof_steps=1,
        autocast=[torch.bfloat16],
        edition=edition,
        kinds=plan.kinds,
        memory_size=f"small{plan.suffix()}/cpu" if plan.memory_size else None,
        memory_contexts=(8, 16) if plan.memory_size else (),
    )


@pytest.fixture(scope="module")
def run_2026(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        folder = tmp_path_factory.mktemp("data")
        mp.setattr(results, "DATA_DIR", folder)
        S = edition_setup("2026")
        timed = sections.time_section(S)
        peaks = sections.peaks_section(S, timed.times, sections.profiled_model(S))
        yield S, timed, peaks, folder


def test_2026_times_the_full_step_and_says_which_model_ran(run_2026):
    S, timed, _, _ = run_2026
    saved = results.load_results(timed.saved)
    assert {r["pass"] for r in saved.rows} == {"forward", "backward", "both", "step"}
    assert saved.provenance["edition"] == "2026" and saved.provenance["arch"] == "basics"
    cold = [r for r in saved.rows if r["warm-up"] == 0]
    for r in cold:  # what 1 and 2 warm-up steps would have timed: the cold run's later steps
        assert r["after_2_s"] <= max(r["after_1_s"], r["mean_s"]) * 3 and not math.isnan(r["after_1_s"])
    assert "2026 model (basics)" in S.where


def test_2026_memory_runs_one_model_over_the_contexts(run_2026):
    S, _, peaks, _ = run_2026
    saved = results.load_results(peaks.saved)
    assert {int(r["context"]) for r in saved.rows} == {8, 16} and {r["size"] for r in saved.rows} == {S.memory_size}
    assert saved.provenance["memory_size"] == S.memory_size and "by context" in peaks.notes[0]


def test_an_answer_is_partial_for_the_editions_whose_model_did_not_run(run_2026):
    _, _, _, folder = run_2026
    local = next(p.parent for p in folder.rglob("01_timing.jsonl"))
    saved = A.Saved(local, "cpu")
    got = A.answer(A.BY_NUMBER["2.1.1(b)"], saved)
    assert got.model == "2026" and "full step" in got.text and "2026 edition's model" in got.text
    assert got.for_edition(2026) == (got.status, got.missing) and "model ran" not in got.missing  # its own
    status, why = got.for_edition(2024, "01")
    assert status == "partial" and why == "the 2026 edition's model ran"
    peaks = A.answer(A.BY_NUMBER["2.4.1(b)"], saved)
    assert "T = 8" in peaks.text and "T = 16" in peaks.text
    page = render("cpu", local)
    assert "ran on the 2026 edition's model" in page and "for 2024: partial" in page and "for 2026: measured" in page


def test_results_without_an_edition_keep_a_single_status(tmp_path):
    folder = D.write(tmp_path, D.notebook_01_rows())
    got = A.answer(A.BY_NUMBER["2.1.1(b)"], A.Saved(folder, "cpu"))
    assert got.model == "" and got.for_edition(2026, "01") == (got.status, got.missing)


def test_a_size_named_as_each_edition_names_it():
    from helpers.model import for_edition

    assert for_edition("xl/cpu", "2026") == "xl-2026/cpu" and for_edition("small", "2025") == "small-2025"
    assert for_edition("small-2026/cpu", "2024") == "small/cpu" and for_edition("xl-2025", "2026") == "xl-2026"
    assert get_config(for_edition("xl", "2026")).d_model == 2560  # the 2026 xl has the 2.7B's shape
    with pytest.raises(ValueError, match="no '2.7B'.*xl-2026"):
        for_edition("2.7B", "2026")


def test_notebook_05_names_its_models_by_edition_and_shrinks_only_what_a_shared_gpu_cannot_hold():
    from helpers.experiments.sharding_sections import config_for

    cpu = config_for("cpu", "2026")
    assert cpu["memory_models"] == ["small-2026/cpu", "xl-2026/cpu"] and cpu["cut"] == []
    assert config_for("gpu", "2026", shared=1, gpu_bytes=80e9)["speed_model"] == "xl-2026"  # a GPU per rank
    shared = config_for("gpu", "2026", shared=2, gpu_bytes=80e9)  # two ranks on one H100: 2 × ~55 GB of states
    assert shared["speed_model"] == "large-2026" and "xl-2026 -> large-2026" in shared["cut"][0]
    assert config_for("gpu", "2024", shared=2, gpu_bytes=80e9)["speed_model"] == "xl"  # 2 × ~24 GB fit


def test_notebook_04_names_its_sizes_by_edition():
    from helpers.experiments import ddp

    assert ddp.config_for("cpu", "2026")["sizes"] == ["small-2026/cpu", "medium-2026/cpu", "large-2026/cpu"]
    assert (
        ddp.config_for("gpu", "2024")["sweep_model"] == "small" and ddp.config_for("gpu")["sweep_model"] == "small-2026"
    )
    s = ddp.Setting("cpu", "gloo", "cpu", ddp.config_for("cpu", "2025"), Budget(None, "04", None), "here")
    assert s.edition == "2025"  # from the sizes it names: what save() records
    assert ddp.Setting("cpu", "gloo", "cpu", ddp.PROFILES["cpu"], None, "here").edition == "2024"


def test_a_profiled_size_the_budget_did_not_time_gives_a_partial_answer(tmp_path):
    rows = D.notebook_01_rows()
    rows["01_profile"] = (rows["01_profile"][0], dict(size="large/cpu", steps=2))  # section 1 timed small, medium
    got = A.answer(A.BY_NUMBER["2.1.2(a)"], A.Saved(D.write(tmp_path, rows), "cpu"))
    assert got.status == "partial" and "did not time large/cpu" in got.text and 'BUDGET = "none"' in got.missing


def test_notebook_01s_gpu_plan_follows_the_edition_and_marks_what_an_h100_cannot_hold():
    from helpers.experiments import gpu_plans as G

    rows = {r["run"]: r for r in G.plan_01(edition="2026")}
    assert rows["timing 10B-2026 (warm: two graphs)"]["oom_by_design"]  # 10B fp32: a guarded run, recorded as OOM
    assert (
        rows["memory peaks xl-2026 at T 2048"]["oom_by_design"]
        and not rows["memory peaks xl-2026 at T 128"]["oom_by_design"]
    )
    profiled = rows["profiled step large-2026"]  # not guarded: it must fit
    assert not profiled["oom_by_design"] and profiled["peak_per_gpu_GB"] < 80
    assert {r["run"] for r in G.plan_01(edition="2024")} >= {"timing 2.7B (warm: two graphs)", "profiled step xl"}


def test_sharding_speed_is_partial_unless_the_handouts_xl_ran():
    from helpers.course.answers.nb05 import speed_on_xl

    assert speed_on_xl("t.", "xl-2026/cpu") == "t." and speed_on_xl("t.", "xl") == "t."
    got = speed_on_xl("t.", "large-2026/cpu")
    assert got.status == "partial" and "Measured on large-2026/cpu" in got.text and "xl" in got.missing


@pytest.mark.parametrize("edition", sorted(XB.EDITIONS))
def test_notebook_01s_contexts_fit_the_models_it_builds_on_meta(edition, monkeypatch):
    """Issue 47 item 1: every context notebook 01's gpu profile runs (§1's timing and §2's profiled step at the
    edition's context, §5's memory at the handout's contexts) runs through the notebook's own functions on the meta
    device, one layer deep: 2026's xl at 2048 and 2025's 2.7B at 256 and 512 exceeded the 512 and 128 positions their
    Table 1 builds, and model.py's ValueError (not an OOM) stopped `make writeup PROFILE=gpu`."""
    from helpers.course.dry_run_meta import on_meta
    from helpers.experiments import benchmarking_memory
    from helpers.model import build_model as real_build
    from helpers.model import sizes_for

    def one_layer(name_or_cfg, device=None, dtype=None, **overrides):
        return real_build(name_or_cfg, device=device, dtype=dtype, **{**overrides, "n_layers": 1})

    monkeypatch.setattr(benchmarking_memory, "build_model", one_layer)
    e = XB.EDITIONS[edition].for_profile("gpu")
    B, T = e["batch"], e["context"]
    with on_meta():
        for size in sizes_for("gpu", edition) + [e["profile_size"]]:  # §1 and §2 at the edition's context
            lm = one_layer(size, device="meta")
            x, y = random_batch(lm.cfg, B, T, device="meta")
            XB.pass_fn(lm, x, y, "both")()
        memory = [(e["memory_size"], t) for t in e["memory_contexts"]] or [(s, T) for s in sizes_for("gpu", edition)]
        for size, t in memory:  # §5, as peaks_section runs it
            traces = XB.step_peaks(size, B, t, None, "meta")
            assert traces["full step"].peak_bytes > 0, (size, t)
