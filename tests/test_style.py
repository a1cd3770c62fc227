"""The house style (issue 33, pyproject.toml's [tool.ruff]): `ruff check` and `ruff format --check` pass on the
whole tree, so `make test` fails on a finding as it would on a failing test."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> list[str]:
    """ruff from this interpreter's environment (the dev extra pins it), else one on PATH."""
    try:
        import ruff  # noqa: F401  (only to learn whether the dev extra's ruff is installed here)

        return [sys.executable, "-m", "ruff"]
    except ImportError:
        if path := shutil.which("ruff"):
            return [path]
        pytest.fail("ruff is not installed: `pip install -e .[dev]` (or `make setup`) installs the pinned version")


@pytest.mark.parametrize("command", [["check", "--no-cache"], ["format", "--check", "--no-cache"]])
def test_ruff_passes(command):
    out = subprocess.run([*_ruff(), *command, "."], cwd=ROOT, capture_output=True, text=True, check=False)
    assert out.returncode == 0, f"`ruff {' '.join(command)} .` found:\n{out.stdout[-4000:]}{out.stderr[-2000:]}"
