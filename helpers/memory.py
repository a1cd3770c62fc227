"""Memory of a training step, measured: a device-agnostic tracker (the closed forms are in helpers.formulas).

    trace = track(lambda: train_step(lm, opt, x, y), existing=lm.parameters(), model=lm)
    trace.peak_bytes, trace.timeline, trace.largest(5)          # measured, any device
    trace.categorize(params=..., grads=..., optimizer_state=...) # what was live at the peak
    model_state(model, opt, x, y)                                 # what is live before a step (as `existing`)
    with StorageWatch(existing) as watch: fsdp_step()             # storages resized in place too; watch.alive()

The tracker is a TorchDispatchMode: every op's output storages are counted when they
first appear and uncounted by a weakref finalizer when they die, so it sees the bytes
PyTorch holds for tensors on any device (the CUDA caching allocator's rounding and
cached blocks are not included; on CUDA `track` also reports the allocator's peak).
Notebooks 01 (memory of one step) and 05 (optimizer-state sharding) use it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from helpers.formulas import MiB

_COUNT_META = False  # meta tensors are counted only inside counting_meta() (a dry run); elsewhere they hold no bytes


@contextlib.contextmanager
def counting_meta():
    """Count meta tensors' bytes as if they were allocated: a dry run on the meta device measures its peaks."""
    global _COUNT_META
    saved, _COUNT_META = _COUNT_META, True
    try:
        yield
    finally:
        _COUNT_META = saved


@dataclass
class Allocation:
    """One live storage: bytes, the op that made it, the module it was made in, and an allocation id."""

    nbytes: int
    op: str
    module: str
    alloc_id: int


def storage_key(t: torch.Tensor, storage=None) -> tuple[str, int]:
    """Which storage `t` lives in: its device and the storage object's identity (not its data pointer, which a
    storage resized to 0 bytes and grown again changes, and which a new storage may reuse while an old one lives on).
    `storage`: t.untyped_storage() where the caller holds it already."""
    return str(t.device), (t.untyped_storage() if storage is None else storage)._cdata


class _Tracker(TorchDispatchMode):
    """Counts live tensor storages (by identity); current, peak and a timeline of (event, bytes)."""

    def __init__(self, module_tracker=None):
        super().__init__()
        self.live: dict[tuple, Allocation] = {}
        self.history: dict[int, Allocation] = {}  # alloc_id -> every allocation, live or freed
        self.current = self.peak = 0
        self.timeline: list[tuple[int, int]] = []
        self._freed: list[int] = []  # alloc_ids in the order their storages died
        self._peak_mark = (-1, 0)  # at the peak: the last alloc_id counted, and how many had died (peak_ids)
        self._ids = itertools.count()
        self._finalizers: list[weakref.finalize] = []
        self._modules = module_tracker

    def _where(self) -> str:
        """The innermost module being run (forward or backward), or '' outside any."""
        if self._modules is None:
            return ""
        names = [n for n in self._modules.parents if n != "Global"]
        return max(names, key=lambda n: n.count("."), default="")

    def add(self, t, op: str) -> None:
        """Count `t`'s storage if it is new (views and in-place results share one)."""
        if (
            not isinstance(t, torch.Tensor)
            or t.layout != torch.strided
            or (t.device.type == "meta" and not _COUNT_META)
        ):
            return
        storage = t.untyped_storage()
        key = storage_key(t, storage)
        nbytes = storage.nbytes()
        if key in self.live or nbytes == 0:
            return
        alloc = self.live[key] = Allocation(nbytes, op, self._where(), next(self._ids))
        self.history[alloc.alloc_id] = alloc
        self.current += nbytes
        self._finalizers.append(weakref.finalize(storage, self._free, key))
        if self.current > self.peak:
            self.peak, self._peak_mark = self.current, (alloc.alloc_id, len(self._freed))

    @property
    def peak_ids(self) -> set[int]:
        """The alloc_ids live at the peak: every one counted up to it, less those that had died by then (ids are
        handed out in order; a set built at each new peak was quadratic: 1 s of the dry run's 31)."""
        last, died = self._peak_mark
        return set(range(last + 1)).difference(self._freed[:died])

    def detach(self) -> None:
        """Stop watching: drop the finalizers so storages that outlive the run do not keep the tracker alive."""
        for fin in self._finalizers:
            fin.detach()
        self._finalizers.clear()

    def _free(self, key) -> None:
        """Finalizer: the storage at `key` died."""
        alloc = self.live.pop(key, None)
        if alloc is not None:
            self.current -= alloc.nbytes
            self._freed.append(alloc.alloc_id)
            self.timeline.append((len(self.timeline), self.current))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out,) if isinstance(out, torch.Tensor) else tree_leaves(out):
            self.add(t, _op_name(func))
        self.timeline.append((len(self.timeline), self.current))
        return out


@functools.cache
def _op_name(func) -> str:
    """'mm' for aten.mm.default: what an allocation's row names as the op that made it."""
    return func.__name__.split(".")[0]


@dataclass
class MemoryTrace:
    """What `track` measured: bytes now and at the peak, a timeline, and the live allocations."""

    peak_bytes: int
    current_bytes: int
    baseline_bytes: int
    timeline: list[tuple[int, int]]
    live: dict = field(repr=False, default_factory=dict)
    history: dict = field(repr=False, default_factory=dict)
    peak_ids: set = field(repr=False, default_factory=set)
    allocator_peak_bytes: int | None = None  # CUDA only: torch.cuda.max_memory_allocated() over the call (all of it)
    result: object = field(repr=False, default=None)

    def largest(self, n: int = 5, at_peak: bool = False) -> list[dict]:
        """The n largest storages live at the end (or at the peak): MiB, op and module that allocated them."""
        pool = [self.history[i] for i in self.peak_ids] if at_peak else self.live.values()
        top = sorted(pool, key=lambda a: (-a.nbytes, a.alloc_id))[:n]
        return [{"MiB": a.nbytes / MiB, "op": a.op, "module": a.module or "(outside any module)"} for a in top]

    def ids_of(self, tensors) -> set[int]:
        """Allocation ids of the live storages behind `tensors` (params, grads, optimizer state...)."""
        ids = set()
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                alloc = self.live.get(storage_key(t))
                if alloc is not None:
                    ids.add(alloc.alloc_id)
        return ids

    def categorize(self, **groups) -> dict[str, int]:
        """Bytes live at the peak per named group of tensors (still live now); the rest is 'activations & other'."""
        by_id = {a.alloc_id: a.nbytes for a in self.live.values()}
        out, seen = {}, set()
        for name, tensors in groups.items():
            ids = (self.ids_of(tensors) & self.peak_ids) - seen
            out[name] = sum(by_id[i] for i in ids)
            seen |= ids
        out["activations & other"] = self.peak_bytes - sum(out.values())
        return out


def _active_trackers() -> list:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return [m for m in _get_current_dispatch_mode_stack() if isinstance(m, _Tracker)]


def note_storage_allocated(t: torch.Tensor, op: str) -> None:
    """Tell the active trackers that `t`'s storage now holds bytes it did not hold when it was made (a storage grown
    with resize_, as FSDP does when it gathers into a buffer it keeps): ops do not report that."""
    for tracker in _active_trackers():
        tracker.add(t, op)


def note_storage_freed(t: torch.Tensor) -> None:
    """Tell the active trackers that `t`'s storage is about to be resized to 0 bytes: the storage object lives on, so
    its finalizer, which the tracker relies on, does not run (FSDP frees gathered weights that way)."""
    for tracker in _active_trackers():
        tracker._free(storage_key(t))


RELEASE_QUIET_S = 0.005  # backend_releases: this long with no storage freed ends the wait
RELEASE_LIMIT_S = 0.1  # and it never waits longer


def _backend_threads() -> bool:
    """Whether a process group is up whose backend releases works from threads of its own (gloo, NCCL; not the dry
    run's fake group, which holds nothing)."""
    d = torch.distributed
    return d.is_available() and d.is_initialized() and "fake" not in str(d.get_backend())


def backend_releases(tracker: _Tracker) -> None:
    """Let a process group's threads finish dropping what the tracked run gave them, before `current` is read.

    A collective's work is released by the backend's own thread a moment after it completes, and a tensor the work
    allocated on this thread (gloo's reduce-scatter copies its whole input) dies there, once that thread gets the
    GIL: read at once, `current` could still count it (notebook 05's zero1 row, after step 2 on rank 1: measured
    one flat gradient buffer above the formula, once in several make test runs). Sleeping hands over the GIL; the
    wait ends after RELEASE_QUIET_S with no storage freed, or at RELEASE_LIMIT_S."""
    quiet_s, deadline = RELEASE_QUIET_S, time.monotonic() + RELEASE_LIMIT_S
    freed, quiet_since = len(tracker._freed), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet_s:
        time.sleep(quiet_s / 5)
        if len(tracker._freed) != freed:
            freed, quiet_since = len(tracker._freed), time.monotonic()


def track(fn, existing=(), model: torch.nn.Module | None = None, device=None) -> MemoryTrace:
    """Run fn() under the tracker; count `existing` tensors (e.g. parameters) as live from the start."""
    from torch.utils.module_tracker import ModuleTracker

    dev = torch.device(device) if device is not None else None
    cuda = dev is not None and dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    modules = ModuleTracker() if model is not None else None
    tracker = _Tracker(modules)
    for t in existing:
        tracker.add(t, "existing")
    baseline = tracker.current
    tracker.timeline.append((0, baseline))
    try:
        with modules if modules is not None else contextlib.nullcontext(), tracker:
            result = fn()
        if _backend_threads():
            backend_releases(tracker)
    finally:
        tracker.detach()
    allocator_peak = None
    if cuda:
        torch.cuda.synchronize(dev)
        allocator_peak = torch.cuda.max_memory_allocated(dev)
    return MemoryTrace(
        tracker.peak,
        tracker.current,
        baseline,
        tracker.timeline,
        dict(tracker.live),
        dict(tracker.history),
        set(tracker.peak_ids),
        allocator_peak,
        result,
    )


# --- CUDA: the allocator's own record, for PyTorch's memory viewer -----------------------------


def cuda_snapshot(fn, path, max_entries: int = 100_000):
    """Run fn() on CUDA recording allocator history; save a pickle for https://pytorch.org/memory_viz."""
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    try:
        result = fn()
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return result


def timeline_from_snapshot(snapshot: dict, device: int = 0) -> list[tuple[int, int]]:
    """(event, allocated bytes relative to the start) from a CUDA snapshot's trace of allocs and frees."""
    bytes_now, out = 0, []
    for i, ev in enumerate(snapshot["device_traces"][device]):
        if ev["action"] == "alloc":
            bytes_now += ev["size"]
        elif ev["action"] == "free_completed":
            bytes_now -= ev["size"]
        out.append((i, bytes_now))
    return out


# --- what is live before a step -----------------------------------------------------------------


def model_state(model: torch.nn.Module, optimizer=None, *batch) -> list:
    """Parameters, buffers, optimizer state and batch tensors: what is live before a step (pass as `existing`)."""
    state = optimizer_state(optimizer) if optimizer is not None else []
    return list(model.parameters()) + list(model.buffers()) + state + list(batch)


def optimizer_state(obj) -> list[torch.Tensor]:
    """The tensors in the state of every torch optimizer `obj` is or holds (optimizers_in): a wrapper that is one, or
    a plain class that keeps one per shard, or torch's ZeroRedundancyOptimizer (its .optim)."""
    return [
        t
        for opt in optimizers_in(obj)
        for per_param in vars(opt).get("state", {}).values()  # the attribute itself (a wrapper's property may raise)
        for t in (per_param.values() if isinstance(per_param, dict) else ())
        if isinstance(t, torch.Tensor)
    ]


def optimizer_state_bytes(obj) -> int:
    """Bytes of the distinct storages behind optimizer_state(obj): what the state of every torch optimizer `obj` is
    or holds takes in memory (a storage several state tensors view is counted once)."""
    return sum({storage_key(t): t.untyped_storage().nbytes() for t in optimizer_state(obj)}.values())


def optimizers_in(obj, depth: int = 3) -> list[torch.optim.Optimizer]:
    """The torch optimizers `obj` is or holds: in its attributes, lists, tuples and dict values, `depth` levels down
    (self.optimizer, self._local_optimizers[i], ...)."""
    found, seen, todo = [], set(), [(obj, 0)]
    while todo:
        o, level = todo.pop()
        if id(o) in seen or isinstance(o, (torch.Tensor, torch.nn.Module, type)):
            continue
        seen.add(id(o))
        if isinstance(o, torch.optim.Optimizer):
            found.append(o)
        if level < depth:
            todo += [(child, level + 1) for child in _children(o)]
    return found


def _children(o) -> list:
    if isinstance(o, dict):
        return list(o.values())
    if isinstance(o, (list, tuple)):
        return list(o)
    return list(vars(o).values()) if hasattr(o, "__dict__") else []


class StorageWatch(TorchDispatchMode):
    """Live bytes of every storage seen (op outputs and `existing`), re-read after each op: a storage grown or
    emptied in place with untyped_storage().resize_ (no op reports that) counts at its size now. `alive()` lists the
    storages that still hold bytes, with the dtype they were first seen in, for a caller that inspects their contents
    (helpers.course.yours.fsdp.rules looks for gathered weights). Holds weak references only."""

    def __init__(self, existing=()):
        super().__init__()
        self.storages, self.current, self.peak = {}, 0, 0  # key -> (weakref to the storage, dtype first seen in)
        for t in existing:
            self.add(t)
        self.rescan()

    def add(self, t) -> None:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type != "meta":
            storage, key = t.untyped_storage(), storage_key(t)
            seen = self.storages.get(key)
            if seen is None or seen[0]() is not storage:  # new, or a dead storage's address reused
                self.storages[key] = (weakref.ref(storage), t.dtype)

    def rescan(self) -> None:
        alive = {k: v for k, v in self.storages.items() if v[0]() is not None}
        self.storages = alive
        self.current = sum(v[0]().nbytes() for v in alive.values())
        self.peak = max(self.peak, self.current)

    def alive(self) -> list[tuple[tuple, torch.UntypedStorage, torch.dtype]]:
        """(key, storage, dtype) of every storage seen that is alive and holds bytes now."""
        out = []
        for key, (ref, dtype) in list(self.storages.items()):
            storage = ref()
            if storage is not None and storage.nbytes() > 0:
                out.append((key, storage, dtype))
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            self.add(t)
        self.rescan()
        return out


def track_resizing(fn, existing=(), device=None) -> MemoryTrace:
    """helpers.memory.track's peak and live bytes for code that may resize storages in place (any FSDP: a gathered
    buffer grown and freed with resize_), at the price of re-reading every live storage's size after each op."""
    watch = StorageWatch(existing)
    baseline = watch.current
    with watch:
        result = fn()
    watch.rescan()
    return MemoryTrace(watch.peak, watch.current, baseline, [], result=result)
