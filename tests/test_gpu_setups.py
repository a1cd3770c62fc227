"""Triton's device under the cpu profile with CUDA patched in (issue 47): `make test` on a GPU runs every notebook at
the cpu profile's sizes (HELPERS_PROFILE=cpu), and compiled Triton refuses host tensors. So the profile picks the
sizes and the device follows the machine. Each notebook's parameters and set-up cells run here, as nbval runs them,
with torch believing in one or two GPUs; the device they hand their kernels and ranks must be CUDA."""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import helpers  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before triton is imported)
from helpers import env

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CARD = "NVIDIA H100 80GB HBM3"


DEVICE_OF = {  # where each notebook's set-up cell leaves the device its kernels and ranks get (00: launch.device())
    "01": "S.device",
    "02": "device",
    "04": "s.device",
    "05": "s.device",
    "06": "ctx.device",
    "07": "setup.device",
    "08": "DEVICE",
}


def _setup_cells(notebook: Path) -> list[str]:
    """The parameters cell and the set-up cell after it (the first two code cells)."""
    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    assert "parameters" in cells[0].get("metadata", {}).get("tags", []), notebook.name
    return ["".join(c["source"]) for c in cells[:2]]


@pytest.fixture(params=[1, 2], ids=["1 gpu", "2 gpus"])
def cuda(request, monkeypatch):
    """torch believes in `param` H100s (and NCCL); HELPERS_PROFILE=cpu, as `make test` sets it."""
    gpus = request.param
    monkeypatch.setenv(env.AUTO_PROFILE_VAR, "cpu")
    for name, value in (
        ("is_available", lambda: True),
        ("device_count", lambda: gpus),
        ("current_device", lambda: 0),
        ("get_device_name", lambda *a: CARD),
        ("mem_get_info", lambda *a: (80 * 10**9, 80 * 10**9)),
    ):
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    return gpus


def test_the_device_follows_the_machine_and_the_profile_only_the_sizes(cuda):
    from helpers.experiments import attention, rmsnorm

    assert env.resolve_profile("auto") == "cpu" and env.device_type() == "cuda"
    ctx = attention.setup("auto")
    assert (ctx.profile, ctx.device, ctx.scale, ctx.device_name) == ("cpu", "cuda", attention.PROFILES["cpu"], CARD)
    assert ctx.triton_timed == (env.triton_mode() == "compiled")  # the interpreter here: no timing of it
    S = rmsnorm.setup("auto", "none")
    assert (S.profile, S.device, S.scale) == ("cpu", "cuda", rmsnorm.PROFILES["cpu"])


def test_every_notebook_is_checked_here():
    assert sorted(p.name[:2] for p in NOTEBOOKS.glob("0*.ipynb")) == sorted([*DEVICE_OF, "00", "03"])


@pytest.mark.parametrize("nb", list(DEVICE_OF))
def test_every_notebooks_setup_puts_its_tensors_on_cuda_under_the_cpu_profile(nb, cuda):
    """The parameters cell, then the set-up cell, as nbval runs them (BUDGET none: no time plan to make)."""
    params, setup = _setup_cells(next(NOTEBOOKS.glob(f"{nb}_*.ipynb")))
    ns: dict = {}
    exec(compile(params, f"{nb}: parameters", "exec"), ns)
    ns["BUDGET"] = "none" if "BUDGET" in ns else None
    exec(compile(setup, f"{nb}: set-up", "exec"), ns)
    device = torch.device(eval(DEVICE_OF[nb], ns))
    assert device.type == "cuda", f"notebook {nb} under the cpu profile with CUDA present: {device}"


def test_notebook_00s_ranks_and_device_follow_the_machine(cuda):
    from helpers import launch

    backend, device = launch.choose_backend(2)
    assert device == "cuda" and launch.device().type == "cuda"
    assert backend == ("nccl" if cuda >= 2 else "gloo")  # NCCL with a GPU per rank; gloo ranks share one GPU


def test_notebook_03s_cpu_grid_runs_cuda_collectives_where_there_is_a_gpu(cuda):
    from helpers.experiments import collectives

    combos = collectives.PROFILE_GRID[env.resolve_profile("auto")]["combos"]
    assert any(device == "cuda" for _, device in combos), combos


def test_no_notebook_derives_its_device_from_the_profile():
    """The mistake itself, wherever it could come back: a device chosen by `profile == "gpu"`."""
    for path in sorted(NOTEBOOKS.glob("0*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        assert 'if profile == "gpu" else "cpu"' not in text, path.name
