"""The kernel tests again, in the interpreter of the newest Triton: make test installs it apart (build/newest-triton)
and names it here, and this one test runs them in a child pytest with that Triton first on the path, beside the
other worker's tests instead of after them all (conftest.py starts it first)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION = os.environ.get("HELPERS_NEWEST_TRITON")  # e.g. 3.9.0; make test sets it, with the folder and the files
FOLDER = os.environ.get("HELPERS_NEWEST_DIR", "build/newest-triton")
FILES = os.environ.get("HELPERS_KERNEL_TESTS", "").split()


@pytest.mark.skipif(not VERSION, reason="make test sets HELPERS_NEWEST_TRITON (make test-newest-triton: these alone)")
def test_the_kernel_tests_pass_in_the_newest_tritons_interpreter():
    assert FILES, "HELPERS_KERNEL_TESTS names no test file"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST") and k != "HELPERS_TEST_TIMES"}
    env.update(PYTHONPATH=str(ROOT / FOLDER), EXPECT_TRITON=VERSION)  # test_kernels checks the import names it
    env["HELPERS_KERNEL_ARCHS"] = "sm_90a"  # the course's H100 only; both are compiled under the course's Triton
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FILES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert run.returncode == 0, f"under Triton {VERSION}:\n{run.stdout[-6000:]}{run.stderr[-3000:]}"
    assert " passed" in run.stdout.splitlines()[-1], run.stdout[-2000:]
