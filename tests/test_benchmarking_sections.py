"""Notebook 01's sections (helpers.experiments.benchmarking_sections): the calls the notebook makes, at a tiny size;
each returns a Result whose notes and asserts' values come from the run it saved."""

import dataclasses
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import formulas, results  # noqa: E402
from helpers.budget import Budget, Calibration  # noqa: E402
from helpers.experiments import benchmarking_sections as sections  # noqa: E402
from helpers.experiments.common import train_step  # noqa: E402


def tiny_setup() -> sections.Setup:
    """small/cpu at batch 2 × 8, no time budget, on a device with no datasheet peak."""
    return sections.Setup(
        profile="cpu",
        device=torch.device("cpu"),
        device_name="test cpu",
        budget=Budget(None, "01", None),
        sizes=["small/cpu"],
        batch=2,
        context=8,
        warmup=1,
        steps=6,  # timing.MIN_PAIRS: the paired ratios have an interval
        cold_steps=2,
        profile_size="small/cpu",
        prof_steps=1,
        autocast=[torch.bfloat16],
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The tiny Setup with results saved under a temporary folder, section 1's timing and the profiled model, shared
    by the tests below."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(results, "DATA_DIR", tmp_path_factory.mktemp("data"))
        S = tiny_setup()
        yield S, sections.time_section(S), sections.profiled_model(S)
    plt.close("all")


def saved_run(path):
    assert path is not None and path.exists(), path
    return results.load_results(path)


def test_time_section_saves_every_pass_and_states_forward_le_both(run):
    S, timed, _ = run
    saved = saved_run(timed.saved)
    assert len(saved.rows) == 2 * 3  # cold and warm, three passes each
    assert saved.provenance["batch"] == 2 and saved.provenance["context"] == 8 and saved.provenance["profile"] == "cpu"
    assert timed.notes[0].startswith("forward <= forward+backward for every size")
    assert timed.notes[1] == S.where and "every size timed" in timed.notes[2]
    assert not timed.values["forward_vs_both_low"] > 1 and not math.isnan(timed.values["forward_vs_both_low"])
    assert set(timed.times["warm-up"]) == {0, 1} and "mean ms" in timed.table.columns.get_level_values(0)


def test_profile_and_flame_sections_share_one_profile(run):
    S, _, M = run
    card = "xl's profiled step needs about 44 GB; this card has 40: small/cpu profiled in its place"  # as profiled_on
    prof = sections.profile_section(dataclasses.replace(S, left_out=[card]), M)
    assert prof.notes[0] == card  # what the card left out, first in the cell's notes
    assert set(prof.tables) == {"forward", "forward+backward", "full step"}
    assert prof.values["share_sum_error"] < 1e-9
    assert saved_run(prof.saved).provenance["size"] == "small/cpu" and saved_run(prof.saved).provenance["steps"] == 1
    assert any(n.startswith("Matrix multiplies take") for n in prof.notes)
    flame = sections.flame_section(S, prof, M)
    rms, softmax = flame.values["rmsnorm_share"], flame.values["softmax_share"]
    assert 0 < rms < 1 and 0 < softmax < 1 and flame.figure is not None
    n_norms = 2 * M.lm.cfg.n_layers + 1
    assert f"{n_norms} layers): {rms:.2%} of the step" in flame.notes[1]  # the note is the value, not typed
    assert f"{softmax:.2%} of the step" in flame.notes[2]
    assert {r["part"] for r in saved_run(flame.saved).rows} >= {"RMSNorm", "softmax", "forward", "backward"}


def test_precision_section_saves_both_runs_and_says_which_machine_it_is(run):
    S, timed, M = run
    amp = sections.precision_section(S, timed.times, M)
    assert {r["precision"] for r in saved_run(amp.saved).rows} == {"fp32", "autocast bfloat16"}
    ratios = saved_run(amp.saved.with_name("01_precision_ratios.jsonl"))
    assert ratios.rows and "bf16_slowdown" in ratios.provenance
    assert amp.notes[-1] == sections.bf16_line(S) and amp.notes[-1].startswith("this CPU's bf16 instructions")
    assert any(n.startswith("small/cpu: ") for n in amp.notes)  # the verdict with its interval
    assert len(amp.values["speedups"]) == 1 and amp.values["speedups"][0] > 0
    assert next(p for p in M.lm.parameters()).device.type == "cpu"  # offloaded and back


def test_dtype_and_norm_precision_sections(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "DATA_DIR", tmp_path)
    dtypes = sections.dtype_section(tiny_setup())
    norms = sections.norm_precision_section(tiny_setup())
    assert dtypes.values["fp32_parameters_and_grads"]
    assert dtypes.table.loc["fc1 output"].tolist() == ["torch.bfloat16", "torch.float16"]  # fp16: the handout's
    assert norms.values["bfloat16"] > 10 * norms.values["float32"]
    assert f"bfloat16 {norms.values['bfloat16']:.1e}" in norms.notes[0]


def test_memory_sections_agree_with_their_formulas(run):
    S, timed, _ = run
    S = dataclasses.replace(S, batch=8, context=32)  # activations dominate: the analytic peak holds (0.1% here)
    M = sections.profiled_model(S)
    train_step(M.lm, M.opt, M.x, M.y)  # AdamW's state, as section 2's profile leaves it
    tl = sections.timeline_section(S, M)
    assert tl.values["step_peak_MiB"] > tl.values["forward_peak_MiB"] and set(tl.traces) == {"forward", "full step"}
    assert f"the full step at {tl.values['step_peak_MiB']:.1f} MiB" in tl.notes[0]
    peaks = sections.peaks_section(S, timed.times, M)
    assert peaks.values["full_below_forward"] == 0
    assert {r["pass"] for r in saved_run(peaks.saved).rows} == {"forward", "full step"}
    res = sections.residual_section(S, M)
    assert res.values["measured_bytes"] == res.values["formula_bytes"] == 8 * 32 * M.lm.cfg.d_model * 4
    assert res.values["2.7B_MiB"] == sections.SEED_H100["residual stream 2.7B MiB"]
    largest = sections.largest_section(S, tl.traces["full step"], n=3)
    assert len(largest.values["MiB"]) == 3 and largest.values["MiB"] == sorted(largest.values["MiB"], reverse=True)
    breakdown = sections.breakdown_section(S, M, tl.traces["full step"])
    assert breakdown.values["error"] <= breakdown.values["tolerance"]
    assert f"error {breakdown.values['error']:.2%}" in breakdown.notes[1]


def test_flop_sections(run):
    S, timed, _ = run
    check = sections.flop_count_section(S)
    assert check.values["error"] <= check.values["tolerance"] == sections.FLOP_TOL
    flops = sections.flops_section(S, timed.times)
    assert math.isnan(flops.values["max_mfu"])  # no datasheet peak for "test cpu"
    assert "MFU is not defined here" in flops.notes[0]
    assert saved_run(flops.saved).rows[0]["device"] == "test cpu"


def test_attention_section_reads_its_values_from_one_run(run):
    S, _, M = run
    attn = sections.attention_section(S, M)
    heads, d = M.lm.cfg.n_heads, M.lm.cfg.d_model // M.lm.cfg.n_heads
    flops = sections.XB.attention_flops(S.batch, heads, S.context, d)
    assert attn.values["flop_ratio"] == flops["softmax"] / (flops["QKᵀ"] + flops["PV"])
    assert attn.values["time_ratio"] > 0 and f"takes {attn.values['time_ratio']:.2f}x their time" in attn.notes[0]
    assert list(attn.table.data.index) == ["QKᵀ", "softmax", "PV"] and attn.saved.name == "01_attention_parts.jsonl"


def test_budget_section_lists_what_was_left_out():
    cal = Calibration(fp32_flops=1e9, bf16_flops=1e9, allreduce_s=1e-3)
    budget = Budget(0.5, "01", cal)
    plan = budget.fit(["small/cpu", "xl/cpu"], lambda size: 1.0, what="section 1 timing at", keep_first=True)
    assert plan.dropped == ["xl/cpu"]
    S = dataclasses.replace(tiny_setup(), budget=budget)
    notes = sections.budget_section(S).notes
    assert notes[0] == budget.summary() and notes[1] == f"- {plan.note}" and "BUDGET=" in notes[1]
    assert sections.budget_section(tiny_setup()).notes == ["no time budget: every planned run is made"]


def test_the_bf16_line_on_a_gpu_reads_the_datasheet():
    """No GPU needed: the line only reads the device's type and name."""
    h100 = dataclasses.replace(tiny_setup(), device=torch.device("cuda"), device_name="NVIDIA H100 80GB HBM3")
    peaks = formulas.peak_flops(h100.device_name, "bf16") / formulas.peak_flops(h100.device_name, "fp32")
    assert sections.bf16_line(h100) == f"dense peak on NVIDIA H100 80GB HBM3: bf16 is {peaks:.0f}x the fp32 peak"
    unknown = dataclasses.replace(h100, device_name="Some GPU")
    assert sections.bf16_line(unknown) == "no datasheet peak known for Some GPU"
