"""The GPU smoke run (`make test` on a GPU, issue 47): every notebook at the cpu profile's sizes on the GPU and the
kernel tests compiled, estimated by the reference run's cost model against its 6-minute budget."""

import re
from pathlib import Path

from helpers.course import smoke_time as T

ROOT = Path(__file__).resolve().parents[1]


def test_the_smoke_run_fits_its_budget_by_the_cost_model():
    table = T.smoke_table()
    summary = T.smoke_summary(table)
    assert table.attrs["total_s"] <= T.SMOKE_BUDGET_S == 360, summary
    assert (table["estimate_s"] > 0).all() and table.attrs["conservative_s"] >= table.attrs["total_s"]
    assert f"about {table.attrs['total_s']:.0f} s of a 360 s budget" in summary


def test_the_calibration_comes_from_the_reference_runs_wall_times():
    k = T.calibration()
    assert k["batches"] >= 5  # the measured batches of data/reference/nvidia-h200/manifest.json
    assert 0 < k["fixed"] < 1 and 0 < k["compute"] < 1  # the cost model overestimated every measured batch
    assert max(k["fixed"], k["compute"]) <= k["envelope"] <= 1


def test_every_notebook_and_the_kernel_tests_are_counted():
    notebooks = sorted(p.name[:2] for p in (ROOT / "notebooks").glob("0*.ipynb"))
    assert list(T.SMOKE_COUNTS) == [*notebooks, "kernel tests"]
    assert set(T.cpu_scales()) <= set(notebooks)
    makefile = (ROOT / "Makefile").read_text()
    kernel_tests = re.search(r"^KERNEL_TESTS := (.*)$", makefile, re.M).group(1).split()
    assert {"tests/test_rmsnorm.py", "tests/test_attention.py", "tests/test_kernels.py"} <= set(kernel_tests)
    assert "SMOKE_TESTS := $(KERNEL_TESTS)" in makefile  # what `make test` runs on a GPU, with the notebooks
    assert "TESTS ?= $(if $(filter 1,$(HAS_CUDA)),$(SMOKE_TESTS),tests)" in makefile
    assert "$(TESTS) notebooks" in makefile
