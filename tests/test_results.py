"""save_results/load_results: round trips, provenance, device folders, missing files, JSON conversion."""

import json
import math
import subprocess
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from helpers import results
from helpers.env import machine_facts
from helpers.results import Results, device_slug, find_results, load_results, provenance, save_results

ROWS = [{"size": 128, "dtype": "fp32", "median_s": 0.0123}, {"size": 256, "dtype": "bf16", "median_s": 0.05}]


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """A private data/ folder, so no test writes into the repo's."""
    monkeypatch.setattr(results, "DATA_DIR", tmp_path / "data")
    return tmp_path / "data"


def test_provenance_has_the_keys():
    p = provenance("cpu", note="x")
    assert {"device", "torch", "commit", "date", "profile", "cpu_count", "gpu_count", "triton"} <= set(p)
    assert "hostname" not in p
    assert p["profile"] == "cpu" and p["note"] == "x" and p["torch"] == torch.__version__
    assert datetime.fromisoformat(p["date"]).utcoffset().total_seconds() == 0
    assert json.loads(json.dumps(p)) == p


def test_provenance_never_carries_the_hostname(monkeypatch):
    monkeypatch.setattr(results, "machine_facts", lambda: {"device": "cpu-x", "hostname": "secret-box"})
    p = provenance()
    assert p["device"] == "cpu-x" and "hostname" not in p and "secret-box" not in json.dumps(p)


def test_commit_is_this_repos_head():
    head = subprocess.run(
        ["git", "-C", str(results.ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if head.returncode != 0:
        pytest.skip("the project is not a git checkout here")
    assert provenance()["commit"].removesuffix("-dirty") == head.stdout.strip()


def test_commit_is_none_outside_a_repo_and_dirty_after_edits(tmp_path):
    assert results.git_commit(tmp_path) is None  # not a repo (nor the top of one)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.txt").write_text("1")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    clean = results.git_commit(tmp_path)
    (tmp_path / "untracked.txt").write_text("ignored by -dirty")
    assert clean and results.git_commit(tmp_path) == clean
    (tmp_path / "a.txt").write_text("2")
    assert results.git_commit(tmp_path) == clean + "-dirty"


@pytest.mark.parametrize(
    "name, slug",
    [
        ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
        ("NVIDIA A100-SXM4-40GB", "nvidia-a100-sxm4-40gb"),
        ("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "intel-xeon-platinum-8375c-cpu-2-90ghz"),
        ("  Apple M2 / Pro  ", "apple-m2-pro"),
        ("", "unknown"),
    ],
)
def test_device_slug(name, slug):
    assert device_slug(name) == slug


def test_round_trip_of_rows(data_dir):
    path = save_results(ROWS, "sweep", profile="cpu", batch=8)
    assert path == data_dir / "local" / device_slug(machine_facts()["device"]) / "sweep.jsonl"
    first = json.loads(path.read_text().splitlines()[0])
    assert list(first) == ["provenance"]
    for loaded in (load_results("sweep"), load_results(path), load_results(str(path))):
        assert loaded.rows == ROWS and loaded.path == path
        assert loaded.provenance == first["provenance"]
        assert loaded.provenance["profile"] == "cpu" and loaded.provenance["batch"] == 8


def test_round_trip_of_a_dataframe(tmp_path):
    df = pd.DataFrame(ROWS)
    path = save_results(df, "sweep", profile="cpu", directory=tmp_path / "out")
    assert path == tmp_path / "out" / "sweep.jsonl"
    loaded = load_results(path)
    back = loaded.frame()
    pd.testing.assert_frame_equal(back, df)
    assert back.attrs["provenance"] == loaded.provenance and back.attrs["provenance"]["profile"] == "cpu"
    assert list(tmp_path.joinpath("out").iterdir()) == [path]  # the temp file is gone


def test_reference_runs_of_two_devices_are_found(data_dir):
    for device in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"):
        save_results(ROWS, "sweep", profile="gpu", kind="reference", device=device)
    save_results(ROWS, "other", kind="reference", device="NVIDIA H100 80GB HBM3")
    found = find_results("sweep")
    assert found == [
        data_dir / "reference" / d / "sweep.jsonl" for d in ("nvidia-a100-sxm4-40gb", "nvidia-h100-80gb-hbm3")
    ]
    assert find_results("sweep", kind="local") == []
    h100 = load_results("sweep", kind="reference", device="NVIDIA H100 80GB HBM3")
    assert h100.provenance["device"] == "NVIDIA H100 80GB HBM3"
    assert h100.label == f"NVIDIA H100 80GB HBM3 · gpu · {h100.provenance['date'][:10]}"


def test_reference_rows_of_another_edition_are_not_shown_beside_this_run(data_dir, capsys):
    """Issue 47 item 5: a 2026 run showed the 2024 H200 rows beside its own; a run saved before EDITION is 2024's."""
    save_results(ROWS, "timing", profile="gpu", kind="reference", device="NVIDIA H200")  # no edition: 2024's
    save_results(ROWS[:1], "timing", profile="gpu", kind="reference", device="NVIDIA H100", edition="2026")
    local = pd.DataFrame(ROWS)
    assert (
        list(results.beside_reference(local, "timing", ["size"], "cpu")["device"])[2:]
        == ["NVIDIA H100"] + ["NVIDIA H200"] * 2
    )  # no edition asked: every run
    by_edition = {e: results.beside_reference(local, "timing", ["size"], "cpu", edition=e) for e in ("2024", "2026")}
    assert set(by_edition["2024"]["device"][2:]) == {"NVIDIA H200"} and len(by_edition["2024"]) == 4
    assert set(by_edition["2026"]["device"][2:]) == {"NVIDIA H100"} and len(by_edition["2026"]) == 3
    assert results.beside_reference(local, "timing", ["size"], "cpu", edition="2025")["run"].eq("this machine").all()
    assert "no reference run of 'timing' on the 2025 edition's models saved yet" in capsys.readouterr().out


def test_missing_file_lists_what_is_available(data_dir):
    save_results(ROWS, "sweep", kind="reference", device="NVIDIA H100 80GB HBM3")
    save_results(ROWS, "matmul", kind="reference", device="NVIDIA H100 80GB HBM3")
    with pytest.raises(FileNotFoundError, match="nvidia-h100-80gb-hbm3/matmul, nvidia-h100-80gb-hbm3/sweep"):
        load_results("sweep", kind="reference", device="cpu-nobody-has")
    with pytest.raises(FileNotFoundError, match="available under .*: nothing"):
        load_results("sweep", kind="local")
    with pytest.raises(FileNotFoundError, match="matmul, sweep"):
        load_results(data_dir / "reference" / "nvidia-h100-80gb-hbm3" / "nope.jsonl")
    with pytest.raises(ValueError, match="kind"):
        load_results("sweep", kind="refrence")


def test_values_become_plain_json(tmp_path):
    rows = [
        {
            "nan": float("nan"),
            "inf": float("inf"),
            "np_f": np.float32(0.5),
            "np_i": np.int64(3),
            "np_b": np.bool_(True),
            "t": torch.tensor(2.5),
            "t_nan": torch.tensor(float("nan")),
            "vec": np.arange(3),
            "path": Path("/x/y"),
            "dtype": torch.bfloat16,
            "when": pd.Timestamp("2026-01-02"),
        }
    ]
    loaded = load_results(save_results(rows, "conv", directory=tmp_path)).rows[0]
    assert loaded == {
        "nan": None,
        "inf": None,
        "np_f": 0.5,
        "np_i": 3,
        "np_b": True,
        "t": 2.5,
        "t_nan": None,
        "vec": [0, 1, 2],
        "path": "/x/y",
        "dtype": "torch.bfloat16",
        "when": "2026-01-02T00:00:00",
    }
    assert type(loaded["np_i"]) is int


def test_nan_in_a_dataframe_comes_back_as_missing(tmp_path):
    df = pd.DataFrame({"size": [1, 2], "ms": [1.5, float("nan")]})
    back = load_results(save_results(df, "nan", directory=tmp_path)).frame()
    assert back["ms"].iloc[0] == 1.5 and math.isnan(back["ms"].iloc[1])


def test_unknown_objects_are_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(TypeError, match="obj"):
        save_results([{"obj": object()}], "bad", directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_label_without_provenance():
    assert Results(rows=[], provenance={}, path=Path("x/run.jsonl")).label == "run"
    assert (
        Results(rows=[], provenance={"device": "cpu-x", "date": "2026-11-23T01:02:03+00:00"}).label
        == "cpu-x · 2026-11-23"
    )
