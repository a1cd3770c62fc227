"""A notebook whose kernel dies mid-cell fails within seconds, naming the signal and the kernel's last stderr lines,
under nbval (make test) and under the writeup's executor (make writeup) (issue 34)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from helpers import kernel_watch, writeup

ROOT = Path(__file__).resolve().parent.parent
DIES_MID_CELL = (
    "import os, signal, threading, time\n"
    "os.write(2, b'last words before the kill\\n')\n"
    "threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()\n"
    "time.sleep(600)\n"
)


def _notebook(folder: Path) -> Path:
    """A three-cell notebook whose second cell's kernel is killed by SIGKILL while it sleeps."""
    cells = [
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell(DIES_MID_CELL),
        nbformat.v4.new_code_cell("y = 2"),
    ]
    path = folder / "dies.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


def test_nbval_fails_the_cell_whose_kernel_was_killed(tmp_path):
    """make test's options (the cell timeout far above the 30 s allowed); the plugin comes from pyproject's addopts."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-c",
        str(ROOT / "pyproject.toml"),
        "--rootdir",
        str(ROOT),
        "-p",
        "no:cacheprovider",
        "--nbval-lax",
        "--nbval-current-env",
        "--nbval-cell-timeout=900",
        str(_notebook(tmp_path)),
    ]
    start = time.perf_counter()
    run = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    seconds = time.perf_counter() - start
    assert run.returncode == 1, run.stdout[-3000:]
    assert "1 passed" in run.stdout and "2 failed" in run.stdout, run.stdout[-3000:]
    assert "killed by SIGKILL" in run.stdout and "last words before the kill" in run.stdout, run.stdout[-3000:]
    assert seconds < 30, f"{seconds:.0f} s"


def test_writeup_reports_a_killed_kernel_without_waiting(tmp_path):
    start = time.perf_counter()
    nb, error = writeup.execute(_notebook(tmp_path), {}, timeout_s=60)
    seconds = time.perf_counter() - start
    assert error.startswith("cell 1 ") and "killed by SIGKILL" in error and "last words before the kill" in error
    assert seconds < 30, f"{seconds:.0f} s"


def test_exit_descriptions():
    assert kernel_watch.describe_exit(-9) == "was killed by SIGKILL"
    assert kernel_watch.describe_exit(-6) == "was killed by SIGABRT"
    assert kernel_watch.describe_exit(3) == "exited with code 3"


def test_make_test_and_bench_walltime_use_one_cell_timeout_below_900_s():
    from helpers.course import walltime

    makefile = (ROOT / "Makefile").read_text()
    seconds = int(makefile.split("CELL_TIMEOUT ?= ", 1)[1].split()[0])
    assert seconds < 900 and f"--nbval-cell-timeout={seconds}" in walltime.SUITE


def test_reading_a_notebook_builds_no_iri_grammar_and_still_validates():
    """The writeup (and pytest, with this plugin) import nbformat without jsonschema's RFC 3987 grammar: 1.2 s a
    process. A notebook still reads and validates, and a broken one is still refused."""
    code = (
        "import sys, helpers.writeup, nbformat\n"
        "nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('x = 1')])\n"
        "nbformat.validate(nbformat.reads(nbformat.writes(nb), as_version=4))\n"
        "nb.cells[0]['cell_type'] = 'nonsense'\n"
        "try:\n"
        "    nbformat.validate(nb)\n"
        "except nbformat.ValidationError:\n"
        "    print('refused')\n"
        "print(sys.modules.get('rfc3987_syntax', 'absent'))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["refused", "None"]
    assert "rfc3987_syntax" in sys.modules and sys.modules["rfc3987_syntax"] is None  # this worker: the plugin's doing
