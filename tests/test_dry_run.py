"""The dry run of every notebook's gpu profile on the meta device (helpers.course.dry_run): every run's largest
step fits an 80 GB card within gpu_plans' estimate; a planted shape error (notebook 07's checkpointed model built
at its default 128 positions and fed 1024, issue 31 item 3) and a planted memory overrun are caught."""

import pytest
import torch

from helpers.course import dry_run as D
from helpers.experiments import attention as XA
from helpers.experiments import fsdp as XF


@pytest.fixture(scope="module")
def table():
    return D.dry_run()


def test_every_notebooks_gpu_profile_runs_on_meta_and_fits_an_h100(table):
    assert set(table["notebook"]) == set(D.RUNS) == {"00", "01", "02", "03", "04", "05", "06", "07"}
    D.check(table)
    planned = table.dropna(subset=["plan_GB"])
    assert len(planned) >= 3 and (planned["peak_GB"] <= planned["plan_GB"] * (1 + 1e-9)).all(), planned  # upper bound
    assert torch.get_default_device() == torch.device("cpu")  # nothing of the dry run leaks out


def test_a_planted_shape_error_is_caught(monkeypatch):
    real = XF.build
    monkeypatch.setattr(
        XF, "build", lambda name, n_layers=None, seed=0, context_length=None: real(name, n_layers, seed)
    )
    with pytest.raises(IndexError, match="ids up to 1023 index an embedding of 128 rows"):
        D.dry_run(["07"])


def test_a_planted_memory_overrun_is_caught(monkeypatch):
    monkeypatch.setitem(XA.PROFILES, "gpu", {**XA.PROFILES["gpu"], "bench_shapes": [(1, 32, 16384, 64)]})
    table = D.dry_run(["06"])
    with pytest.raises(ValueError, match=r"naive attention fwd\+bwd \(1, 32, 16384, 64\) needs about"):
        D.check(table)
