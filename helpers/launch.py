"""Run a function on N ranks with torch.distributed set up; get every rank's return value.

Runbook:

    from helpers.launch import launch, device
    results = launch(worker, 2, arg)        # 2 local ranks: gloo on CPU, NCCL with >= 2 GPUs
    results = launch(worker, 2, backend="gloo", device="cpu")   # force gloo on CPU tensors

    # the same worker code, ranks started by torchrun (one node, then two):
    torchrun --nproc-per-node 8 -m helpers demo
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 \
             --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m helpers demo

`launch` starts fresh Python processes (torch.multiprocessing: "forkserver" on a
machine without CUDA, whose server imports torch once; "spawn" with a GPU), so the
worker and its arguments are pickled; functions defined in a notebook cell are
pickled by value (cloudpickle). The parent holds the rendezvous store on a port
the OS picks, so two runs never collide on a port. Ranks do not print: they
return values, and the parent prints and plots.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path

import cloudpickle
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers.env import usable_cores
from helpers.kernel_watch import describe_exit

_DEVICE: torch.device | None = None  # this rank's device, set inside a launched worker
_SPAWNED = False  # True inside a worker process that launch() started
STARTUP_S = 120  # how long ranks may take to start (spawn, import torch, the CUDA context, the rendezvous)


class RankError(RuntimeError):
    """A rank raised or died; carries the rank and, where there was one, its traceback."""

    def __init__(self, message: str, rank: int, remote_traceback: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback


def device() -> torch.device:
    """The device this rank should use (outside a launched worker: cuda:0 if present, else cpu)."""
    if _DEVICE is not None:
        return _DEVICE
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    return torch.device("cpu")


@contextlib.contextmanager
def using_device(dev: torch.device):
    """device() returns `dev` inside (as in a launched worker): e.g. the meta device for a dry run of a gpu profile."""
    global _DEVICE
    saved, _DEVICE = _DEVICE, torch.device(dev)
    try:
        yield
    finally:
        _DEVICE = saved


def choose_backend(world_size: int, backend: str = "auto", device_type: str = "auto") -> tuple[str, str]:
    """Pick (backend, device_type) for `world_size` local ranks; refuse combinations that cannot run."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device_type == "auto":
        device_type = "cuda" if gpus else "cpu"
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device={device_type!r}: use 'auto', 'cpu' or 'cuda'")
    if device_type == "cuda" and not gpus:
        raise ValueError("device='cuda' but torch sees no GPU here; use device='cpu' (gloo)")
    if backend == "auto":
        backend = "nccl" if device_type == "cuda" and gpus >= world_size and dist.is_nccl_available() else "gloo"
    if backend == "nccl":
        if device_type != "cuda":
            raise ValueError("NCCL only moves CUDA tensors; use backend='gloo' for device='cpu'")
        if gpus < world_size:
            raise ValueError(
                f"NCCL needs one GPU per rank: asked for {world_size} ranks but this machine has {gpus} GPU(s). "
                f"Use backend='gloo' (ranks then share the GPUs) or at most {gpus} rank(s)."
            )
    elif backend not in ("gloo", "mpi"):
        raise ValueError(f"unknown backend {backend!r}; use 'auto', 'gloo' or 'nccl'")
    return backend, device_type


def _rank_device(rank: int, device_type: str) -> torch.device:
    """cuda:rank (shared round-robin when GPUs are fewer than ranks), or cpu."""
    if device_type == "cuda":
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def start_method() -> str:
    """How launch starts ranks. Without CUDA: forked from a server that imported torch and helpers once (about 0.05 s
    a launch instead of 1.5 s; nothing of CUDA's to fork). With a GPU: a fresh interpreter per rank ("spawn").
    LAUNCH_START_METHOD=spawn|forkserver overrides."""
    chosen = os.environ.get("LAUNCH_START_METHOD") or ("spawn" if torch.cuda.is_available() else "forkserver")
    if chosen not in ("spawn", "forkserver"):
        raise ValueError(f"LAUNCH_START_METHOD must be spawn or forkserver, got {chosen!r}")
    return chosen


def _exit_if_orphaned(parent_pid: int) -> None:
    """Watchdog thread body: end this worker once its parent (the launcher, or the forkserver, which ends with the
    launcher) is gone and it has been re-parented."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(3)


def _worker(rank, world_size, backend, device_type, port, payload, workdir, threads, env):
    """Body of one launched rank: set up, run fn, write its return value or its traceback to `workdir`."""
    global _DEVICE, _SPAWNED
    _SPAWNED = True
    os.environ.clear()
    os.environ.update(env)  # the launcher's environment now, not the forkserver's when it started
    threading.Thread(target=_exit_if_orphaned, args=(os.getppid(),), daemon=True).start()
    workdir = Path(workdir)
    try:
        fn, args = cloudpickle.loads(payload)  # before the rendezvous: an import error here fails fast
        torch.set_num_threads(threads)
        _DEVICE = _rank_device(rank, device_type)
        if _DEVICE.type == "cuda":
            torch.cuda.set_device(_DEVICE)
        if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ and os.path.exists("/sys/class/net/lo"):
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # all ranks are on this machine: stay on loopback
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timedelta(seconds=60))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
        (workdir / f"rank{rank}.started").touch()  # launch's timeout_s counts from every rank's start
        result = fn(*args)
        torch.save(result, workdir / f"rank{rank}.tmp")
        os.replace(workdir / f"rank{rank}.tmp", workdir / f"rank{rank}.pt")  # whole or absent: the parent reads it
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        error = {
            "time": time.time(),
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": traceback.format_exc(),
        }
        (workdir / f"rank{rank}.err").write_text(json.dumps(error))
        os._exit(1)  # skip interpreter teardown: peers may be gone and gloo/NCCL could block in it
    finish()


def finish(code: int = 0) -> None:
    """End this process now, skipping the interpreter's teardown: destroy the process group, flush, os._exit(code).

    The one-line remedy for a spawned training script (the last line of its worker) when its collectives were
    launched from autograd hooks by code that does not guard them (torch's DistributedDataParallel, your own hooks):
    a backend thread may release such a collective while the interpreter finalizes, and the process then dies by
    SIGABRT ("terminate called without an active exception"; see helpers.comm.no_python_refs). With no teardown
    there is no finalization to race. Atexit handlers do not run: call it after everything you want saved is saved.
    launch()'s workers end this way."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    compile_workers = sys.modules.get("torch._inductor.async_compile")
    if compile_workers is not None:  # torch.compile's worker pool
        compile_workers.shutdown_compile_workers()
    from multiprocessing import util

    util._run_finalizers(0)  # what exit would release: semaphores (tqdm's lock) the parent's tracker would call leaked
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream has nothing left to flush
            stream.flush()
    os._exit(code)


def _failed(procs, workdir: Path) -> list[int]:
    """Ranks that ended badly without returning: a rank whose result is saved has done its work, whatever its exit."""
    return [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and not (workdir / f"rank{r}.pt").exists()]


def _warn_late_deaths(procs, workdir: Path) -> None:
    """Say so (without failing) when a rank died after returning its result, e.g. in native teardown code."""
    late = [f"rank {r} {describe_exit(p.exitcode)}" for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
    if late:
        warnings.warn(f"launch: {'; '.join(late)} after returning its result; the results are complete", stacklevel=3)


def _failure(procs, first_dead: list[int], workdir: Path, world_size: int) -> RankError:
    """Build the error for the rank that failed first, naming the others' state.

    `first_dead` are the ranks already dead when the parent first saw a failure. Among them a rank
    that left no traceback (killed by a signal) is the cause, since its peers' errors follow from it;
    otherwise the earliest traceback by the ranks' own clocks.
    """
    errors = {}
    for rank in range(world_size):
        f = workdir / f"rank{rank}.err"
        if f.exists():
            errors[rank] = json.loads(f.read_text())
    silent = [r for r in first_dead if r not in errors]
    first = silent[0] if silent else min((r for r in errors), key=lambda r: errors[r]["time"])
    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
    others = [f"rank {r} {'also failed' if r in dead else 'was terminated'}" for r in range(world_size) if r != first]
    tb = None
    if first in errors:
        e, tb = errors[first], errors[first]["traceback"]
        msg = (
            f"rank {first} of {world_size} raised {e['type']}: {e['message']}\n\n"
            f"--- traceback from rank {first} ---\n{tb}"
        )
    else:
        msg = (
            f"rank {first} of {world_size} {describe_exit(procs[first].exitcode)} before or outside the worker's "
            "Python code (out of memory, a crash in native code, os._exit; its stderr may say more). "
            'In a script, call launch() under `if __name__ == "__main__":` since spawned ranks re-import it.'
        )
    if others:
        msg += "\n(" + "; ".join(others) + ")"
    return RankError(msg, rank=first, remote_traceback=tb)


def _stop(procs) -> None:
    """Terminate, then kill, every worker still alive, and reap them all."""
    procs = [p for p in procs if p.pid is not None]  # skip any never started
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 3.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _under_torchrun() -> bool:
    """True in a process started by torchrun (it sets RANK and WORLD_SIZE), not in our own workers."""
    return not _SPAWNED and "RANK" in os.environ and "WORLD_SIZE" in os.environ


def torchrun_topology() -> dict:
    """Under torchrun, inside the process group: nodes (agents), distinct hosts, and whether the nodes were simulated
    on fewer hosts (several agents on one machine, e.g. a multi-node rehearsal on a laptop). Every rank calls it."""
    world = dist.get_world_size()
    names = [None] * world
    dist.all_gather_object(names, socket.gethostname())
    nodes = world // int(os.environ.get("LOCAL_WORLD_SIZE", world))
    hosts = len(set(names))
    return {
        "nodes": nodes,
        "hosts": hosts,
        "simulated": nodes > hosts,
        "topology": f"{nodes} node(s)" + (f" simulated on {hosts} host(s)" if nodes > hosts else ""),
    }


def _launch_torchrun(fn, world_size, args, backend, device_type, timeout_s):
    """Run fn in this torchrun-started process and all-gather every rank's return value."""
    global _DEVICE
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size != env_world:
        raise ValueError(
            f"running under torchrun with WORLD_SIZE={env_world}; launch(..., world_size={world_size}) "
            "cannot change it: pass the torchrun world size or start torchrun with another one"
        )
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    backend, device_type = choose_backend(local_ranks, backend, device_type)
    _DEVICE = _rank_device(int(os.environ.get("LOCAL_RANK", 0)), device_type)
    if _DEVICE.type == "cuda":
        torch.cuda.set_device(_DEVICE)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    result = fn(*args)
    gathered = [None] * world_size
    dist.all_gather_object(gathered, result)
    return gathered


def launch(fn, world_size: int, *args, backend: str = "auto", timeout_s: float = 600, device: str = "auto") -> list:
    """Run fn(*args) on `world_size` ranks with the process group initialised; return each rank's result in rank order.

    backend: "auto" (NCCL when there is one GPU per rank, else gloo), "gloo" or "nccl".
    device: "auto" (cuda when present), "cpu" or "cuda"; a worker asks for its own with `helpers.launch.device()`.
    A rank that raises or dies makes this raise RankError within seconds, with that rank's traceback;
    a run past `timeout_s` raises TimeoutError. Either way every rank is stopped before this returns.
    Returned tensors come back on the CPU.
    """
    if not callable(fn):
        raise TypeError(f"launch needs a function to run on every rank, got {fn!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if _SPAWNED:
        raise RuntimeError("launch was called inside a launched worker; nesting is not supported")
    if _under_torchrun():
        return _launch_torchrun(fn, world_size, args, backend, device, timeout_s)
    backend, device_type = choose_backend(world_size, backend, device)
    try:
        payload = cloudpickle.dumps((fn, args))
    except Exception as exc:
        raise TypeError(
            f"launch could not pickle {getattr(fn, '__name__', fn)!r} or its arguments for the worker processes "
            f"({type(exc).__name__}: {exc}). Move the worker into an importable module (helpers/ or a .py file "
            "beside the notebook) and pass plain data (numbers, strings, tensors) as arguments."
        ) from exc
    threads = max(1, usable_cores() // world_size)  # ranks x threads <= cores: no oversubscription
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=60), wait_for_workers=False)
    ctx = mp.get_context(start_method())
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(["helpers.launch"])  # torch and helpers imported once, in the server
    with tempfile.TemporaryDirectory(prefix="launch-") as workdir:
        procs = [
            ctx.Process(
                target=_worker,
                name=f"rank{rank}",
                args=(rank, world_size, backend, device_type, store.port, payload, workdir, threads, dict(os.environ)),
            )
            for rank in range(world_size)
        ]
        try:
            for p in procs:
                p.start()
            deadline = time.monotonic() + STARTUP_S + timeout_s  # until every rank has started: then timeout_s
            started = False
            while any(p.exitcode is None for p in procs):
                first_dead = _failed(procs, Path(workdir))
                if first_dead:
                    time.sleep(0.2)  # let ranks that failed at the same moment write their errors too
                    raise _failure(procs, first_dead, Path(workdir), world_size)
                if not started and all((Path(workdir) / f"rank{r}.started").exists() for r in range(world_size)):
                    started, deadline = True, time.monotonic() + timeout_s  # a spawned GPU rank takes ~10-20 s
                left = deadline - time.monotonic()
                if left <= 0:
                    running = [r for r, p in enumerate(procs) if p.exitcode is None]
                    if not started:
                        raise TimeoutError(
                            f"launch: the {world_size} ranks did not all start within "
                            f"{STARTUP_S + timeout_s:g} s and were stopped (importing torch, the "
                            "rendezvous); a rank may be stuck before init_process_group"
                        )
                    raise TimeoutError(
                        f"launch: {getattr(fn, '__name__', 'fn')} on {world_size} ranks did not finish within "
                        f"timeout_s={timeout_s:g} s of starting (ranks {running} still running) and was stopped. A "
                        "rank may be waiting in a collective that another rank never entered; if the work is just "
                        "slow, raise timeout_s."
                    )
                wait([p.sentinel for p in procs if p.exitcode is None], timeout=min(left, 0.5))
            first_dead = _failed(procs, Path(workdir))
            if first_dead:
                raise _failure(procs, first_dead, Path(workdir), world_size)
            _warn_late_deaths(procs, Path(workdir))
            results = []
            for rank in range(world_size):
                out = Path(workdir) / f"rank{rank}.pt"
                if not out.exists():
                    raise RankError(f"rank {rank} exited cleanly without returning a value (os._exit(0)?)", rank)
                results.append(torch.load(out, map_location="cpu", weights_only=False))
            return results
        finally:
            _stop(procs)
            del store


# ---- small workers for notebook 00, `python -m helpers demo` and the tests ----


def all_reduce_rank_ids() -> dict:
    """Each rank all-reduces its rank id; returns what it saw (the sum should be 0+1+...+(n-1))."""
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank)], device=device())
    dist.all_reduce(t)
    return {
        "rank": rank,
        "world_size": world,
        "backend": dist.get_backend(),
        "device": str(t.device),
        "torch_threads": torch.get_num_threads(),
        "pid": os.getpid(),
        "sum": t.item(),
    }


def fail_on_rank(bad_rank: int = 1) -> int:
    """Raise on `bad_rank` while the other ranks wait in an all-reduce: shows how launch reports a crash."""
    if dist.get_rank() == bad_rank:
        raise ValueError(f"planted failure on rank {bad_rank}")
    dist.all_reduce(torch.ones(1, device=device()))
    return dist.get_rank()


def skip_collective_on_rank(skip_rank: int = 1) -> int:
    """Every rank but `skip_rank` enters an all-reduce that can never complete: a hung collective."""
    if dist.get_rank() != skip_rank:
        dist.all_reduce(torch.ones(1, device=device()))
    else:
        time.sleep(3600)
    return dist.get_rank()


def free_port() -> int:
    """A loopback port nobody was listening on a moment ago (for a rendezvous a script starts itself)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_simulated_nodes(
    argv: list[str], nodes: int = 2, timeout_s: float = 300, cwd=None
) -> list[subprocess.CompletedProcess]:
    """Rehearse a multi-node run on this machine: one torchrun agent per node (`--nnodes N --node-rank r`, one
    process each, c10d rendezvous on a free loopback port), each running `python -m helpers ARGV`. Every agent is
    killed if any fails or the run passes `timeout_s`. Real multi-node numbers need real nodes: this checks the path."""
    import uuid

    port = free_port()
    run_id = uuid.uuid4().hex[:8]
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(nodes),
                "--node-rank",
                str(r),
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-id",
                run_id,
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "-m",
                "helpers",
                *argv,
            ],
            cwd=cwd or Path(__file__).resolve().parent.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(nodes)
    ]
    try:
        outs = [a.communicate(timeout=timeout_s) for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.communicate()
    return [
        subprocess.CompletedProcess(a.args, a.returncode, out, err) for a, (out, err) in zip(agents, outs, strict=True)
    ]
