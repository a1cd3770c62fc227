"""The launcher: results in rank order, and every fault ends fast, named, with no process left behind."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.optim  # noqa: F401  (imported here, as notebook 05 does: the ranks fork with it)

from helpers import launch as L
from helpers.env import usable_cores
from helpers.launch import RankError, all_reduce_rank_ids, launch
from helpers.launch.core import preload

ROOT = Path(__file__).resolve().parent.parent


# ---- workers (module level, so spawn can import them by reference) ----


def tensor_worker(scale):
    """Return a tensor that depends on the rank and an argument."""
    return torch.arange(3) * dist.get_rank() * scale


def pid_then(pid_dir, mode):
    """Record this rank's pid, then behave badly on rank 1 while rank 0 waits in an all-reduce."""
    Path(pid_dir, f"{dist.get_rank()}.pid").write_text(str(os.getpid()))
    dist.barrier()  # both pids are on disk before anything goes wrong
    if dist.get_rank() == 1:
        if mode == "raise":
            raise KeyError("boom on rank 1")
        if mode == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "hang":
            time.sleep(3600)
    dist.all_reduce(torch.ones(1))
    return dist.get_rank()


def _pids(pid_dir):
    return [int(p.read_text()) for p in Path(pid_dir).glob("*.pid")]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---- results ----


def test_results_in_rank_order_and_threads():
    results = launch(L.all_reduce_rank_ids, 2)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["sum"] == 1.0 and r["backend"] == "gloo" and r["device"] == "cpu" for r in results)
    assert len({r["pid"] for r in results}) == 2 and os.getpid() not in {r["pid"] for r in results}
    assert sum(r["torch_threads"] for r in results) <= max(2, usable_cores())


def test_arguments_and_tensor_results():
    out = launch(tensor_worker, 2, 10)
    torch.testing.assert_close(out[0], torch.zeros(3, dtype=torch.long))
    torch.testing.assert_close(out[1], torch.tensor([0, 10, 20]))


def test_single_rank():
    assert launch(L.all_reduce_rank_ids, 1)[0]["sum"] == 0.0


# ---- faults ----


@pytest.mark.parametrize("mode, expect", [("raise", "KeyError"), ("sigkill", "SIGKILL")])
def test_failing_rank_is_named_fast_and_nothing_survives(tmp_path, mode, expect):
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(pid_then, 2, str(tmp_path), mode, timeout_s=120)
    elapsed = time.monotonic() - start
    assert info.value.rank == 1
    assert "rank 1 of 2" in str(info.value) and expect in str(info.value)
    if mode == "raise":
        assert "boom on rank 1" in info.value.remote_traceback and "Traceback" in str(info.value)
    assert elapsed < 30, f"took {elapsed:.1f} s to report a dead rank"
    pids = _pids(tmp_path)
    assert len(pids) == 2 and not any(_alive(p) for p in pids)


def test_hung_collective_times_out(tmp_path):
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="timeout_s=2 s"):  # counted from both ranks' start (a slow start is not in
        launch(pid_then, 2, str(tmp_path), "hang", timeout_s=2)  # it); the pids and barrier before the hang take ms
    assert 2 <= time.monotonic() - start < 32
    pids = _pids(tmp_path)
    assert len(pids) == 2 and not any(_alive(p) for p in pids)


def test_unpicklable_worker_fails_at_once():
    lock = threading.Lock()

    def holds_a_lock():
        return lock.locked()

    start = time.monotonic()
    with pytest.raises(TypeError, match="importable module"):
        launch(holds_a_lock, 2)
    assert time.monotonic() - start < 5


def test_bad_arguments():
    with pytest.raises(ValueError, match="world_size"):
        launch(L.all_reduce_rank_ids, 0)
    with pytest.raises(TypeError):
        launch("not a function", 2)
    with pytest.raises(ValueError, match="backend"):
        launch(L.all_reduce_rank_ids, 2, backend="carrier-pigeon")


def test_backend_choice_with_fewer_gpus_than_ranks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert L.choose_backend(2) == ("gloo", "cuda")  # ranks share cuda:0
    assert L.choose_backend(1) == ("nccl", "cuda")
    assert L.choose_backend(2, device_type="cpu") == ("gloo", "cpu")
    with pytest.raises(ValueError, match="one GPU per rank"):
        L.choose_backend(2, "nccl")


def test_nccl_or_cuda_refused_without_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="gloo"):
        L.choose_backend(2, "nccl")
    with pytest.raises(ValueError, match="no GPU"):
        L.choose_backend(2, device_type="cuda")


# ---- functions from a notebook or a script ----


def _run_python(code: str, cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_function_defined_in_main_launches_from_a_long_temporary_folder(tmp_path):
    """A worker defined in __main__ (a notebook cell, `python -c`) is pickled by value; and multiprocessing's
    forkserver, which binds a socket under TMPDIR, still starts where TMPDIR is longer than a socket path's 107 bytes
    (pytest's per-worker folders, macOS's: "AF_UNIX path too long", the CI failure of 2026-11-26). One script for
    both: a fresh Python and its forkserver cost 5 s apiece on a 2-core CPU."""
    deep = tmp_path / ("a-long-temporary-folder-" * 4)
    deep.mkdir()
    code = textwrap.dedent("""
        import torch.distributed as dist
        from helpers.launch import launch
        def cell_worker(base):          # defined in __main__, like a notebook cell
            return base + dist.get_rank()
        print(launch(cell_worker, 2, 100))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(deep), "LAUNCH_START_METHOD": "forkserver"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[100, 101]"


def test_script_without_main_guard_gets_a_hint(tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text("from helpers.launch import launch, all_reduce_rank_ids\nlaunch(all_reduce_rank_ids, 2)\n")
    proc = _run_python([str(script)], tmp_path)
    assert proc.returncode != 0
    assert 'if __name__ == "__main__"' in proc.stderr


# ---- torchrun ----


def test_torchrun_entry_point(tmp_path):
    proc = _run_python(
        ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "helpers", "demo"],
        tmp_path,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK: expected 1" in proc.stdout
    assert proc.stdout.count("sum = 1") == 2  # rank 0 reports both ranks, rank 1 stays quiet


def test_torchrun_world_size_cannot_be_changed(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="WORLD_SIZE=3"):
        launch(L.all_reduce_rank_ids, 2)


def test_both_start_methods_run_a_launch_and_a_bad_one_is_named(monkeypatch):
    from helpers.launch import start_method

    assert start_method() == ("spawn" if torch.cuda.is_available() else "forkserver")
    for method in ("spawn", "forkserver"):
        monkeypatch.setenv("LAUNCH_START_METHOD", method)
        assert [r["sum"] for r in launch(all_reduce_rank_ids, 2, backend="gloo", device="cpu")] == [1.0, 1.0]
    monkeypatch.setenv("LAUNCH_START_METHOD", "fork")
    with pytest.raises(ValueError, match="spawn or forkserver"):
        start_method()


def env_value(key: str) -> str | None:
    return os.environ.get(key)


def test_a_rank_sees_the_launchers_environment_now(monkeypatch):
    """The forkserver started earlier; a variable set since must still reach the ranks, as with spawn."""
    launch(all_reduce_rank_ids, 1, backend="gloo", device="cpu")  # the server is running
    monkeypatch.setenv("LAUNCH_TEST_VALUE", "42")
    assert launch(env_value, 1, "LAUNCH_TEST_VALUE", backend="gloo", device="cpu") == ["42"]


class _SlowToStart:
    """Unpickled in each rank before its rendezvous as time.sleep(seconds): a rank slow to start, as a spawned GPU
    rank is (torch, the CUDA context: 10-20 s)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __reduce__(self):
        return time.sleep, (self.seconds,)


def _returns_rank(_ignored) -> int:
    return dist.get_rank()


def test_timeout_counts_from_every_ranks_start_not_from_the_spawn():
    """Issue 31: notebook 00's hang demo (then timeout_s=5) timed out while GPU ranks were still starting."""
    assert launch(_returns_rank, 2, _SlowToStart(3.0), backend="gloo", device="cpu", timeout_s=2) == [0, 1]


def test_a_slow_module_the_launcher_imported_is_imported_once_for_every_rank(monkeypatch):
    """torch.distributed.optim (TorchScript at import, 1 s a rank on a 2-core CPU) is preloaded by the forkserver
    where the launcher has imported it (this module has): the ranks find it imported at their start."""
    in_rank = "'torch.distributed.optim' in __import__('sys').modules"
    if L.start_method() == "forkserver":
        assert launch(eval, 2, in_rank, backend="gloo", device="cpu") == [True, True]
    monkeypatch.delitem(sys.modules, "torch.distributed.optim")
    assert "torch.distributed.optim" not in preload()  # a launcher that did not import it: not loaded for its ranks
