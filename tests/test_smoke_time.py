"""The GPU smoke run (`make test` on a GPU, issue 47): every notebook at the cpu profile's sizes on the GPU and the
kernel tests compiled, estimated by the reference run's cost model against its 6-minute budget."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from helpers.course import smoke_time as T

ROOT = Path(__file__).resolve().parents[1]


def test_the_smoke_run_fits_its_budget_on_its_workers():
    table = T.smoke_table()
    summary = T.smoke_summary(table)
    assert table.attrs["parallel_s"] <= T.SMOKE_BUDGET_S == 360, summary
    assert table.attrs["serial_s"] > T.SMOKE_BUDGET_S  # one worker does not fit: what the H200 showed
    assert (table["estimate_s"] > 0).all() and table.attrs["conservative_s"] >= table.attrs["total_s"]
    assert f"about {table.attrs['parallel_s']:.0f} s of a 360 s budget on 4 workers" in summary


def test_the_estimate_is_not_below_what_the_device_measured():
    """Each part of the H200's smoke run against the estimate of what it covered: within 10%, never the 1.75x short
    the reference-fitted model alone was."""
    table, runs = T.smoke_table(), T.smoke_runs()
    measured = table.set_index("what")["measured_s"]
    assert len(runs) >= 2 and {w for r in runs for w in r["items"]} == set(T.SMOKE_COUNTS)
    for run in runs:
        covered = sum(w * measured[what] for what, w in run["items"].items())
        assert abs(covered / run["wall_s"] - 1) <= 0.10, (run["run"], covered, run["wall_s"])
        assert run["provenance"]["device"] and run["provenance"]["commit"] and run["workers"] == 1
    assert table.attrs["measured_factor"] > 1.5  # the fit to the reference batches alone was that far short


def test_parallel_time_deals_files_longest_first():
    assert T.parallel_s({"a": 10.0, "b": 6.0, "c": 4.0}, 2) == 10.0
    assert T.parallel_s({"a": 10.0, "b": 6.0, "c": 4.0}, 1) == 20.0
    assert T.parallel_s({"kernel tests": 40.0}, 4) == 40.0 / T.KERNEL_TEST_FILES * -(-T.KERNEL_TEST_FILES // 4)


def test_make_test_on_a_gpu_runs_the_smoke_workers_and_logs_each_tests_time():
    makefile = (ROOT / "Makefile").read_text()
    assert "TEST_WORKERS ?= $(if $(filter 1,$(HAS_CUDA)),$(GPU_WORKERS),2)" in makefile
    rule = re.search(r"^GPU_WORKERS = \$\(shell (.*)\)$", makefile, re.M).group(1).replace("$$", "$")
    for cores, workers in ((2, 1), (8, 2), (16, T.SMOKE_WORKERS), (64, T.SMOKE_WORKERS)):
        out = subprocess.run(["bash", "-c", rule.replace("$(nproc)", str(cores))], capture_output=True, text=True)
        assert out.stdout.strip() == str(workers), (cores, out)
    assert "HELPERS_TEST_TIMES=$(TEST_TIMES)" in makefile


def test_each_tests_time_is_logged_as_it_finishes(tmp_path, monkeypatch):
    """conftest.py's HELPERS_TEST_TIMES: a line per test, written when it ends (a run cut by a timeout keeps them),
    under pytest-xdist (a child pytest: its worker writes, its controller's replay of the report does not) and in a
    plain run (the hook called here as pytest calls it)."""
    (tmp_path / "test_two.py").write_text("def test_ok():\n    pass\n\ndef test_bad():\n    assert False\n")
    (tmp_path / "conftest.py").write_text((ROOT / "conftest.py").read_text())
    log = tmp_path / "times" / "t.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # this test's own worker's
    env["HELPERS_TEST_TIMES"] = str(log)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", "test_two.py"],
                   cwd=tmp_path, env=env, capture_output=True, timeout=120)  # fmt: skip
    want = [("test_two.py::test_bad", "failed"), ("test_two.py::test_ok", "passed")]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted((r["test"], r["outcome"]) for r in rows) == want
    assert all(r["seconds"] >= 0 and r["end"] > 0 for r in rows) and {r["worker"] for r in rows} == {"gw0"}

    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    log.unlink()
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("HELPERS_TEST_TIMES", str(log))

    def report(nodeid, outcome, when="call", duration=0.01, **more):
        return SimpleNamespace(nodeid=nodeid, when=when, outcome=outcome, passed=outcome == "passed",
                               duration=duration, **more)  # fmt: skip

    conftest.pytest_runtest_logreport(report("test_two.py::test_ok", "passed"))
    conftest.pytest_runtest_logreport(report("test_two.py::test_bad", "failed"))
    conftest.pytest_runtest_logreport(report("test_two.py::test_ok", "passed", when="setup"))  # quick: not logged
    conftest.pytest_runtest_logreport(report("test_two.py::test_ok", "passed", node="gw0"))  # a controller's replay
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted((r["test"], r["outcome"]) for r in rows) == want and {r["worker"] for r in rows} == {""}


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
    newest = re.search(r"^NEWEST_TESTS := (.*)$", makefile, re.M).group(1).split()
    assert {"tests/test_rmsnorm.py", "tests/test_attention.py", "tests/test_kernels.py"} <= set(newest)
    assert "tests/test_yours_triton.py" in newest  # the interpreter's semantics, under each Triton
    assert "KERNEL_TESTS := $(NEWEST_TESTS) tests/test_yours.py" in makefile
    assert "SMOKE_TESTS := $(KERNEL_TESTS)" in makefile  # what `make test` runs on a GPU, with the notebooks
    assert "TESTS ?= $(if $(filter 1,$(HAS_CUDA)),$(SMOKE_TESTS),tests)" in makefile
    assert "$(TESTS) notebooks" in makefile
