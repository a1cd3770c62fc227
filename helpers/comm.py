"""Communication shims and counting: one name per collective whatever the torch version, and a byte counter.

    run_collective("reduce_scatter", work, out)        # the four ops the notebooks time, result tensor back
    reduce_scatter(out, inp); all_gather(out, inp)     # torch's newer names where this torch has them
    with count_collectives() as log: train_step(...)   # [(op, bytes passed), ...]: nccl-tests' sizes
    with no_python_refs(): dist.all_reduce(g, async_op=True)   # from an autograd hook: nothing to abort at exit
    flight.launching(g); ...; handle.wait(); del handle; flight.settle()   # the backend has let go: safe at exit

Counting patches torch.distributed's functions while active, so it sees every call made through them
(our wrappers and optimizers look the functions up at call time for this reason).
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def reduce_scatter(out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
    """Sum `inp` (N·S,) over ranks; this rank keeps its slice in `out` (S,). Looked up at call time (counting)."""
    return getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(out, inp, async_op=async_op)


def all_gather(out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
    """Concatenate every rank's `inp` (S,) into `out` (N·S,), in rank order."""
    return getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, inp, async_op=async_op)


def run_collective(op: str, work: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """Run one of OPS on `work` (all-gather and reduce-scatter write into `out`); return the tensor holding the
    result."""
    if op == "all_reduce":
        dist.all_reduce(work)
        return work
    if op == "all_gather":
        all_gather(out, work)
        return out
    if op == "reduce_scatter":
        reduce_scatter(out, work)
        return out
    if op == "broadcast":
        dist.broadcast(work, src=0)
        return work
    raise ValueError(f"unknown collective {op!r}; use one of {', '.join(OPS)}")


# Python objects torch keeps in thread-local state, which every collective's work object copies when launched:
# the autograd engine's contextvars.Context during backward (torch.autograd.graph._engine_run_backward), and
# Inductor's CUDA-graph tree managers once torch._inductor.cudagraph_trees is imported.
_TLS_KEYS = ("context", "tree_manager_containers", "tree_manager_locks")
_AUTOGRAD = torch._C._autograd


@contextlib.contextmanager
def no_python_refs():
    """Launch collectives whose work objects hold no reference to a Python object; put the state back after.

    Why: a gloo (or NCCL) work copies the thread-local state it was launched under, and during backward that state
    holds Python objects (the autograd engine's contextvars, saved-tensor hooks). The work can be released last by
    the backend's own thread, after the launching code dropped it (a later barrier keeps a reference to it). If
    that happens while the interpreter is exiting, the release takes the GIL on a finalizing interpreter, the
    thread is unwound through a noexcept destructor, and the process dies by SIGABRT ("terminate called without an
    active exception"). With nothing Python in the work, its release never enters the interpreter.
    A Python __torch_function__ or dispatch mode active at the call is left in place (it may want to see the call)."""
    stashed = []
    if hasattr(torch._C, "_is_key_in_tls"):
        stashed = [(key, torch._C._get_obj_in_tls(key)) for key in _TLS_KEYS if torch._C._is_key_in_tls(key)]
    for key, _ in stashed:
        torch._C._remove_obj_from_tls(key)
    hooks = []  # saved-tensor default hooks (activation checkpointing), innermost first
    top = getattr(_AUTOGRAD, "_top_saved_tensors_default_hooks", lambda _: None)
    while (pair := top(True)) is not None:
        hooks.append(pair)
        _AUTOGRAD._pop_saved_tensors_default_hooks()
    try:
        yield
    finally:
        for pack, unpack in reversed(hooks):
            _AUTOGRAD._push_saved_tensors_default_hooks(pack, unpack)
        for key, obj in stashed:
            torch._C._stash_obj_in_tls(key, obj)


def python_objects_in_tls() -> list[str]:
    """What Python objects a collective launched here and now would hold (see no_python_refs): [] when none."""
    found = [key for key in _TLS_KEYS if hasattr(torch._C, "_is_key_in_tls") and torch._C._is_key_in_tls(key)]
    top = getattr(_AUTOGRAD, "_top_saved_tensors_default_hooks", lambda _: None)
    return found + (["saved-tensor hooks"] if top(True) is not None else [])


SETTLE_TIMEOUT_S = 10.0  # a backend that still holds a finished work after this is stuck, not slow


class InFlight:
    """Tensors a wrapper handed to collectives and keeps from Python until the backend's threads have let go of them.

    Why: a work is released by the process group's own worker thread a moment after it completes, or later still
    when a barrier launched meanwhile took it as prior work. A tensor whose Python object dies while a work holds
    it is not freed: PyTorch hands its Python object to the tensor (so it can come back), and the work's release
    then decrefs that object from the worker thread. If the interpreter is finalizing by then (a script that
    returns right after its last step, a barrier and destroy_process_group(), while torch._dynamo, imported by
    torch.optim, keeps the process group alive), that thread cannot take the GIL: Python ends it with
    pthread_exit, whose unwinding through a noexcept destructor calls std::terminate, and the rank dies by
    SIGABRT ("terminate called without an active exception"). So every tensor given to a collective is held here
    with its use count before the launch; settle(), at the wrapper's sync point, waits until each count is back
    down (no backend thread holds it) and lets go, on the caller's thread."""

    def __init__(self):
        self._held: list[tuple[torch.Tensor, int]] = []

    def launching(self, *tensors: torch.Tensor) -> None:
        """Call right before handing `tensors` to a collective."""
        self._held += [(t, _use_count(t)) for t in tensors]

    def settle(self, timeout_s: float = SETTLE_TIMEOUT_S) -> bool:
        """After waiting for the works and dropping their handles: wait until the backend released every held
        tensor, then let go of them. False when some backend thread still held one at the timeout (let go anyway)."""
        deadline = time.monotonic() + timeout_s
        released = True
        for t, before in self._held:
            while _use_count(t) > before:
                if time.monotonic() > deadline:
                    released = False
                    break
                time.sleep(1e-5)  # the worker thread that holds it needs the CPU (and this thread not the GIL)
        self._held = []
        return released

    def __len__(self) -> int:
        return len(self._held)


def wait_all(handles: list) -> None:
    """Wait for every work of `handles`; no name here outlives the call (a handle kept alive keeps its work, and
    the work its tensors, so InFlight.settle() would wait for it)."""
    for handle in handles:
        handle.wait()


def _use_count(t: torch.Tensor) -> int:
    """How many C++ references the tensor has (its Python object's, its views', and any backend work's); 0 where
    this torch cannot say (then settle() waits for nothing)."""
    count = getattr(t, "_use_count", None)
    return count() if count is not None else 0


_COUNTED = {
    "all_reduce": ("all_reduce", 0, "tensor"),
    "broadcast": ("broadcast", 0, "tensor"),
    "all_gather_into_tensor": ("all_gather", 0, "output_tensor"),
    "all_gather_single": ("all_gather", 0, "output"),
    "reduce_scatter_tensor": ("reduce_scatter", 1, "input"),
    "reduce_scatter_single": ("reduce_scatter", 1, "input"),
    "all_gather": ("all_gather", 0, "tensor_list"),  # the list forms, as many students write them
    "reduce_scatter": ("reduce_scatter", 1, "input_list"),
}


@contextlib.contextmanager
def count_collectives():
    """Record (op, bytes) for each collective called through torch.distributed while active: the all-reduce and
    broadcast buffer, the all-gather output, the reduce-scatter input (nccl-tests' sizes); the list forms summed."""
    log, saved = [], {}
    for name, (op, pos, key) in _COUNTED.items():
        if not hasattr(dist, name):
            continue
        saved[name] = fn = getattr(dist, name)

        def counting(*args, _fn=fn, _op=op, _pos=pos, _key=key, **kwargs):
            t = args[_pos] if len(args) > _pos else kwargs[_key]
            parts = t if isinstance(t, (list, tuple)) else [t]
            log.append((_op, sum(x.numel() * x.element_size() for x in parts)))
            return _fn(*args, **kwargs)

        setattr(dist, name, counting)
    try:
        yield log
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
