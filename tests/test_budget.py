"""helpers.budget: the calibration, BUDGET's values, plans that fit and say what they left out; notebook 01's plans
and the writeup's --budget."""

import math

import pandas as pd
import pytest
import torch

from helpers import budget as B
from helpers import formulas, model, writeup
from helpers.experiments import benchmarking

SLOW_BF16 = B.Calibration(fp32_flops=200e9, bf16_flops=2.5e9, allreduce_s=1e-3)  # a 2-core EPYC told AVX2 only
FAST_BF16 = B.Calibration(fp32_flops=200e9, bf16_flops=400e9, allreduce_s=1e-3)  # the same with avx512_bf16


def test_calibration_measures_this_machine_in_about_a_second():
    cal = B.calibrate(refresh=True)
    assert cal.fp32_flops > 1e8 and cal.bf16_flops > 1e7 and 0 < cal.allreduce_s < 1
    assert cal.seconds < 10  # about a second on an idle 2-core machine; 10 leaves room for a loaded one
    assert B.calibrate() is cal  # once per process
    assert "GFLOP/s" in str(cal) and "all-reduce" in str(cal)


def test_bf16_sentence_says_how_many_times_slower_or_faster():
    assert SLOW_BF16.bf16_slowdown == 80 and not SLOW_BF16.fast_bf16
    assert SLOW_BF16.bf16_sentence().startswith("this CPU multiplies bf16 80x slower than fp32")
    assert (
        FAST_BF16.bf16_sentence().startswith("this CPU multiplies bf16 2.0x faster than fp32") and FAST_BF16.fast_bf16
    )
    assert "about as fast" in B.Calibration(200e9, 150e9, 1e-3).bf16_sentence()
    assert SLOW_BF16.matmul_s(2e9) == 0.01 and SLOW_BF16.matmul_s(2e9, bf16=True) == 0.8
    assert SLOW_BF16.allreduce_time(4 * 2**20, calls=2) == pytest.approx(8e-3)  # scaled by bytes
    assert SLOW_BF16.allreduce_time(1, calls=3) == pytest.approx(3e-3)  # never below the calibrated one


@pytest.mark.parametrize(
    "value, seconds", [("120", 120.0), (45, 45.0), ("none", None), ("off", None), (None, None), ("inf", None)]
)
def test_parse_budget(value, seconds):
    assert B.parse_budget(value) == seconds


@pytest.mark.parametrize("value", ["lots", "-5", "0", "nan"])
def test_parse_budget_refuses_bad_values_in_one_line(value):
    with pytest.raises(ValueError, match="BUDGET=") as err:
        B.parse_budget(value)
    assert "\n" not in str(err.value)


def test_resolve_auto_is_the_notebook_default_on_cpu_and_none_on_gpu(monkeypatch):
    monkeypatch.delenv("HELPERS_BUDGET_SCALE", raising=False)
    cpu = B.Budget.resolve("auto", "01", "cpu", SLOW_BF16)
    assert cpu.seconds == B.DEFAULT_SECONDS["01"] and cpu.label == "auto"
    monkeypatch.setenv("HELPERS_BUDGET_SCALE", "0.5")  # make test's: half of each notebook's auto budget
    assert B.Budget.resolve("auto", "01", "cpu", SLOW_BF16).seconds == B.DEFAULT_SECONDS["01"] / 2
    assert B.Budget.resolve("30", "01", "cpu", SLOW_BF16).seconds == 30  # a number asked for is not scaled
    for bad in ("0", "2", "half"):
        monkeypatch.setenv("HELPERS_BUDGET_SCALE", bad)
        with pytest.raises(ValueError, match="HELPERS_BUDGET_SCALE"):
            B.Budget.resolve("auto", "01", "cpu", SLOW_BF16)
    monkeypatch.delenv("HELPERS_BUDGET_SCALE")
    gpu = B.Budget.resolve("auto", "01", "gpu")
    assert gpu.seconds is None and gpu.calibration is None
    plan = gpu.fit(["a", "b"], cost=lambda item: 1 / 0, what="sizes")  # no budget: nothing estimated, all kept
    assert plan.kept == ["a", "b"] and plan.note == "" and "no time budget" in gpu.summary()
    assert B.Budget.resolve("90", "05", "gpu", SLOW_BF16).seconds == 90  # asked for explicitly: applies anywhere
    with pytest.raises(ValueError, match="no budget for notebook"):
        B.Budget.resolve("auto", "99", "cpu", SLOW_BF16)
    assert set(B.DEFAULT_SECONDS) == set(B.NOTEBOOKS)


def test_fit_keeps_the_longest_prefix_and_names_what_it_left_out():
    b = B.Budget(10.0, "01", SLOW_BF16)
    costs = {"s": 2.0, "m": 3.0, "l": 6.0, "xl": 1.0}
    first = b.fit(list(costs), costs.get, what="mixed precision at")
    assert first.kept == ["s", "m"] and first.dropped == ["l", "xl"]  # a prefix: xl would fit but comes after l
    assert first.seconds == 5.0 and first.needed == 12.0 and b.used == 5.0 and b.left == 5.0
    assert first.note.startswith("not timed here (budget): mixed precision at l, xl (about 7 s more")
    assert (
        "`make writeup BUDGET=20`" in first.note
        and "notebooks/01_benchmarking_and_profiling.ipynb --budget 20" in first.note
    )
    second = b.fit(["a", "b"], lambda item: 4.0, what="peaks at")  # what is left: 5 s
    assert second.kept == ["a"] and "BUDGET=20" in second.note  # 12 asked before + 8 asked, rounded up to tens
    assert "time budget 10 s" in b.summary() and "3 item(s) left out" in b.summary() and "BUDGET=20" in b.summary()
    forced = B.Budget(1.0, "02", SLOW_BF16).fit(["x", "y"], lambda item: 5.0, what="sizes", keep_first=True)
    assert forced.kept == ["x"] and forced.dropped == ["y"]
    everything = B.Budget(100.0, "02", SLOW_BF16).fit(["x", "y"], lambda item: 5.0, what="sizes")
    assert everything.dropped == [] and everything.note == ""


def test_notebook_01_plans_mixed_precision_from_the_calibration():
    sizes, (bt, ctx) = model.sizes_for("cpu"), (16, 32)
    fp32_s = {s: benchmarking.step_estimate(s, bt, ctx, SLOW_BF16) for s in sizes}
    slow = benchmarking.plan_precision(B.Budget(20.0, "01", SLOW_BF16), sizes, bt, ctx, 2, 6, fp32_s)
    fast = benchmarking.plan_precision(B.Budget(20.0, "01", FAST_BF16), sizes, bt, ctx, 2, 6, fp32_s)
    assert fast.kept == sizes and slow.kept and slow.dropped and slow.kept + slow.dropped == sizes
    mm = formulas.train_flops("small/cpu", bt, ctx) / SLOW_BF16.fp32_flops
    bf16 = benchmarking.step_estimate("small/cpu", bt, ctx, SLOW_BF16, bf16=True, fp32_s=0.05)
    assert bf16 == pytest.approx(0.05 - mm + formulas.train_flops("small/cpu", bt, ctx) / SLOW_BF16.bf16_flops)
    assert benchmarking.step_estimate("small/cpu", bt, ctx, SLOW_BF16, fp32_s=math.nan) == B.STEP_OVERHEAD * mm
    timing = benchmarking.plan_timing(B.Budget(0.001, "01", SLOW_BF16), sizes, bt, ctx, 2, 6, 3)
    assert timing.kept == sizes[:1]  # the smallest size always: the notebook's checks need one
    peaks = benchmarking.plan_peaks(B.Budget(0.001, "01", SLOW_BF16), sizes, bt, ctx, fp32_s, bf16=True)
    assert peaks.kept == sizes[:1] and "autocast memory peaks at medium/cpu" in peaks.note
    tight = benchmarking.plan_precision(B.Budget(0.001, "01", SLOW_BF16), sizes, bt, ctx, 2, 6, fp32_s)
    assert tight.kept == sizes[:1]  # the question is answered at one size at least


def test_sizes_left_out_get_no_verdict_only_the_budget_line():
    cfg = model.get_config("small/cpu", n_layers=1, d_model=48, d_ff=96, vocab_size=256)
    amp, comps = benchmarking.compare_precisions(
        [cfg], 2, 8, [torch.bfloat16], warmup=0, steps=2, device="cpu", skipped=["xl/cpu"]
    )
    skipped = amp[amp["size"] == "xl/cpu"]
    assert list(skipped["status"]) == [benchmarking.NOT_TIMED] * 2 and skipped["median_s"].isna().all()
    assert list(comps) == [cfg]
    lines = benchmarking.speedup_lines(comps, skipped=["xl/cpu"]).splitlines()
    assert lines[-1] == "xl/cpu: not timed here (budget)"
    assert "too few paired samples" in lines[0]  # 2 pairs: no verdict from fewer than timing.MIN_PAIRS
    table = benchmarking.speedup_table(amp, [cfg, "xl/cpu"])
    assert table.loc["xl/cpu"].isna().all() and not table.loc[cfg].isna().any()


def test_writeup_refuses_a_bad_budget_before_running_anything(tmp_path):
    with pytest.raises(ValueError, match="BUDGET='soon'"):
        writeup.main(["--budget", "soon", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())


def test_writeup_kernels_talk_over_ipc_not_tcp():
    km = writeup._this_python_kernel_manager()()
    assert km.transport == "ipc" and km.ip.startswith(str(writeup._ipc_folder()))


def test_peak_rows_can_leave_fp32_out():
    cfg = model.get_config("small/cpu", n_layers=1, d_model=48, d_ff=96, vocab_size=256)
    rows = benchmarking.peak_rows([cfg], 2, 8, [torch.bfloat16], fp32=False)
    assert set(rows["precision"]) == {"autocast bfloat16"} and (rows["status"] == "ok").all()
    assert isinstance(rows, pd.DataFrame) and len(rows) == 2


def test_notebook_02_plans_the_whole_model_sizes():
    from helpers.experiments import rmsnorm as XR

    sizes, norms = model.sizes_for("cpu"), ["layernorm", "rmsnorm", "rmsnorm_torchfn"]
    roomy = XR.plan_model_norms(B.Budget(1e6, "02", SLOW_BF16), sizes, norms, 4, 2, 6)
    tight = XR.plan_model_norms(B.Budget(1e-3, "02", SLOW_BF16), sizes, norms, 4, 2, 6)
    assert roomy.kept == sizes and tight.kept == sizes[:1]  # the smallest always: section 2's checks need one
    cfg = model.get_config("small/cpu")
    t = SLOW_BF16.step_s(formulas.train_flops(cfg, 4, cfg.context_length))
    assert tight.needed == pytest.approx(
        sum(
            (2 + 6) * 3 * (4 / 3) * SLOW_BF16.step_s(formulas.train_flops(model.get_config(s), 4, cfg.context_length))
            for s in sizes
        )
    )
    assert tight.seconds == pytest.approx(8 * 3 * t * 4 / 3) and "whole model's norms at medium/cpu" in tight.note


def test_ranks_beyond_the_cores_share_a_threads_rate():
    """Two launched ranks on one core (make test's pinned worker) each run at half a thread's rate; on two cores (or
    more) each has one thread's."""
    cal = B.Calibration(fp32_flops=200e9, bf16_flops=2.5e9, allreduce_s=1e-3, threads=2)
    assert cal.per_rank(2, cores=2).fp32_flops == cal.per_thread().fp32_flops == 100e9
    assert cal.per_rank(2, cores=8).bf16_flops == 1.25e9
    half = cal.per_rank(2, cores=1)
    assert (half.fp32_flops, half.bf16_flops, half.threads) == (50e9, 0.625e9, 1)
    assert cal.per_rank(4, cores=1).step_s(1e9) == pytest.approx(4 * cal.per_thread().step_s(1e9))


def test_notebook_05_plans_its_timed_steps_never_below_min_pairs():
    from helpers.experiments import sharding as XS
    from helpers.timing import MIN_PAIRS

    kinds = ["unsharded", "sharded"]
    assert XS.plan_speed_steps(B.Budget(1e6, "05", SLOW_BF16), "xl/cpu", kinds, 3, 10, 8, 64) == 10
    tight = B.Budget(1e-3, "05", SLOW_BF16)
    assert XS.plan_speed_steps(tight, "xl/cpu", kinds, 3, 10, 8, 64) == MIN_PAIRS
    assert "xl/cpu's timed step 7, step 8, step 9, step 10" in tight.plans[-1].note
    assert XS.plan_speed_steps(B.Budget.resolve("auto", "05", "gpu"), "xl/cpu", kinds, 3, 10, 8, 64) == 10


def test_walltime_reads_each_cells_seconds_from_nbclients_timestamps():
    import nbformat

    from helpers.course import walltime

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("a"), nbformat.v4.new_code_cell("b"), nbformat.v4.new_markdown_cell("c")]
    for cell, end in zip(nb.cells[:2], ("00:00:02.5", "00:00:10"), strict=True):
        cell.id = f"cell{end[-1]}"
        cell.metadata["execution"] = {
            "iopub.execute_input": "2026-11-25T00:00:00.000000Z",
            "shell.execute_reply": f"2026-11-25T{end}Z",
        }
    assert walltime.cell_seconds(nb) == [(10.0, "cell0"), (2.5, "cell5")]
    assert walltime.children_cpu_s() >= 0


def test_a_plan_that_runs_stops_once_the_measured_pace_would_overrun(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(B.time, "perf_counter", lambda: clock[0])

    def run(item):  # each run takes 5x its estimate of 1 s: a busy machine
        clock[0] += 5.0
        return item * 10

    b = B.Budget(12.0, "01", SLOW_BF16)
    plan = b.fit([1, 2, 3, 4], lambda item: 1.0, what="sizes", run=run)
    assert plan.kept == [1, 2] and plan.results == [10, 20] and plan.dropped == [3, 4]  # 10 s taken; a third: 15 > 12
    assert plan.pace == 5.0 and plan.seconds == 10.0 and b.used == 10.0 and plan.needed == 20.0
    assert "took 5.0x their estimate" in plan.note and "BUDGET=20" in plan.note
    assert "BUDGET=30" in b.fit([5], lambda item: 10.0, what="later").note  # 20 for the first plan, 10 for this
    late = b.fit([7, 8], lambda item: 1.0, what="more", keep_first=True, run=run)  # 2 s left: the first runs anyway
    assert late.kept == [7] and late.dropped == [8]
    free = B.Budget(None).fit([1, 2], lambda item: 1 / 0, what="sizes", run=run)
    assert free.results == [10, 20] and free.dropped == []


def test_notebook_04_plans_the_extra_bucket_sizes_then_more_timed_steps():
    from helpers.experiments import ddp as XD
    from helpers.timing import MIN_PAIRS

    args = (["small/cpu", "large/cpu"], "large/cpu", [0.125, 0.25, 0.5], [1, 25], 3, 10, 8, 32)
    assert XD.plan_speed(B.Budget(1e6, "04", SLOW_BF16), *args) == (10, [0.125, 0.25, 0.5])
    tight = B.Budget(1e-3, "04", SLOW_BF16)
    assert XD.plan_speed(tight, *args) == (MIN_PAIRS, [])  # the table at MIN_PAIRS steps runs whatever it costs
    assert "large/cpu's bucket sweep at (MB) 0.5, 0.25, 0.125 (about" in tight.plans[0].note
    assert "the speed table's timed step 7, step 8, step 9, step 10" in tight.plans[1].note
    assert XD.plan_speed(B.Budget.resolve("auto", "04", "gpu"), *args) == (10, [0.125, 0.25, 0.5])
