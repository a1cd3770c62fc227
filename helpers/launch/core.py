"""The launcher: each rank's device, the backend for N local ranks, how ranks are started, the body every launched
rank runs, and launch() itself (in its own processes, or inside torchrun's). The device a worker asks for
(`device()`) is this module's state, set by the rank's body.

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
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path

import cloudpickle
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers.env import usable_cores
from helpers.launch.failures import RankError, _failed, _failure, _stop, _warn_late_deaths

_DEVICE: torch.device | None = None  # this rank's device, set inside a launched worker
_SPAWNED = False  # True inside a worker process that launch() started
STARTUP_S = 120  # how long ranks may take to start (spawn, import torch, the CUDA context, the rendezvous)


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


def _under_torchrun() -> bool:
    """True in a process started by torchrun (it sets RANK and WORLD_SIZE), not in our own workers."""
    return not _SPAWNED and "RANK" in os.environ and "WORLD_SIZE" in os.environ


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


SOCKET_PATH_MAX = 107  # bytes in a Unix socket's path (sun_path) on Linux; macOS allows 103


def _short_socket_folder() -> None:
    """Make multiprocessing's private folder (where the forkserver's socket lives) short enough for a socket path.

    It is made once per process under the temporary folder; a long TMPDIR (pytest's per-worker folders, macOS's
    /var/folders/...) makes `bind` fail with "AF_UNIX path too long" before any rank starts. Then it goes under /tmp."""
    import multiprocessing.util

    if len(tempfile.gettempdir()) + len("/pymp-12345678/listener-12345678") <= SOCKET_PATH_MAX - 4:
        return
    before = tempfile.tempdir
    tempfile.tempdir = "/tmp" if os.access("/tmp", os.W_OK) else before
    try:
        multiprocessing.util.get_temp_dir()  # made now (and removed at exit by multiprocessing), cached for the process
    finally:
        tempfile.tempdir = before


PRELOAD = ("helpers.launch", "torch._dynamo", "pandas")  # torch and helpers; torch._dynamo, which a rank's first
# optimizer or torch DDP imports (about 2 s a rank on a 2-core CPU, each launch: notebook 04's speed launch spent 4 of
# its 6 s there); pandas, which the workers' modules import (helpers.results: 0.2 s a rank, 116 of make test's 293)
# Preloaded as well where the launcher has imported them itself (its ranks will, most likely): torch.distributed.optim
# scripts eight functional optimizers with TorchScript as it is imported (1 s a rank on a 2-core CPU, every launch of
# notebook 05 and of `yours` sharding that builds torch's ZeroRedundancyOptimizer)
PRELOAD_IF_IMPORTED = ("torch.distributed.optim",)


def preload() -> list[str]:
    """The modules a forkserver started now imports once for all the ranks it forks: PRELOAD, and those of
    PRELOAD_IF_IMPORTED this process has imported."""
    return [*PRELOAD, *(m for m in PRELOAD_IF_IMPORTED if m in sys.modules)]


def _ready_forkserver(extra: tuple[str, ...] = ()) -> None:
    """Before a forkserver starts: what it imports once for every rank (preload() and `extra`; read only when one
    starts, a running server keeps its modules) and a temporary folder short enough for its socket."""
    mp.get_context("forkserver").set_forkserver_preload([*preload(), *extra])
    _short_socket_folder()


def start_forkserver(extra: tuple[str, ...] = ()) -> None:
    """Start launch's forkserver now, where launch uses one (start_method), with `extra` modules imported beside
    preload()'s: a caller whose ranks all import them. Returns at once: the server imports in the background, and
    the first launch waits for it."""
    if start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    _ready_forkserver(extra)
    forkserver.ensure_running()


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
        _ready_forkserver()  # imported once, in the server: each rank forks with them
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
