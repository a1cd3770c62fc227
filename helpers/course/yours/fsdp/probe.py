"""What a student's FSDP holds and computes in, observed in a launched rank during two training steps of the course's
own model (the 2026 test's model on the student's cs336_basics layers, one seed on every rank): which gathered full
weights are alive when each layer uses its weight in the forward, between forward and backward, and after backward;
the dtypes of the forward's matmuls and of the all-gathers (with the weight whose shard each sends); the dtypes of the
master weights, their gradients and AdamW's state. helpers.course.yours.fsdp.rules judges the results.

A full weight is found by its values: every storage the step made or grew (helpers.memory.StorageWatch) is searched
for each sharded weight as it stood before the step, whole and contiguous, in fp32 or a 16-bit cast, as stored or
transposed. A shard, an activation or a gradient never matches; a flat buffer holding several weights matches each.
The wrapper's own parameters (the shards) and what held a full weight once get_fsdp returned are left aside.

    out = probe_step(impl, "fp16")   # {"uses": [...], "between": [...], "end": [...], "gathers": [...], ...}
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import deque

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

import helpers.course.yours.course_models as CM
import helpers.course.yours.student_calls as S
from helpers import memory as M
from helpers.experiments import fsdp as XF
from helpers.experiments.common import rank_rows

SEARCHED = (torch.float32, torch.float16, torch.bfloat16)  # the dtypes a gathered weight may be held in
MAX_STARTS = 256  # positions tried per pattern and storage (a weight's first value is random: a handful at most)
SHARD_PROBE = 8  # the values of an all-gather's input matched against the weights (random values: 8 never collide)
MATMULS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul", "linear", "_scaled_mm"}
USES = MATMULS | {"embedding", "index", "index_select"}  # the ops a layer uses its weight in
SETTLE_S = (0.0, 0.05)  # a finding not allowed is looked at again after these pauses, garbage collected each time
PROBE_STEPS = 2  # the first step may record the call order (no prefetch yet): the second is the steady one


AHEAD = 2  # the layers backward starts with, which may be gathered ahead of it (the prefetch window of the handout)


def forward_window(names: list[str], i: int) -> list[str]:
    """The weights that may be gathered while layer i uses its weight in the forward (2026 handout: 'only start
    gathering after the layer two before the current one has completed its forward pass'): layer i + 1, whose
    two-before (i - 1) is done, but not i + 2 (layer i is still computing); layer i; layer i - 1, whose free may come
    in a later hook than its own forward's."""
    return names[max(0, i - 1) : i + 2]


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


class FullWeights:
    """The sharded weights as they stand before the step, and where a storage holds one of them."""

    def __init__(self, weights: dict[str, torch.Tensor]):
        self.names = list(weights)  # in the forward's call order
        self.nbytes = {n: w.numel() * w.element_size() for n, w in weights.items()}  # fp32
        self.patterns = {
            dt: [(n, v.to(dt).contiguous().reshape(-1)) for n, w in weights.items() for v in (w, w.t())]
            for dt in SEARCHED
        }  # dtype -> [(name, flat values (numel,))]: as stored and transposed
        self.devices = {torch.device("cpu"): self.patterns}  # the same on another device (a student's .cuda())

    def on(self, device: torch.device) -> dict:
        """The patterns on `device` (copied there once)."""
        if device not in self.devices:
            self.devices[device] = {dt: [(n, p.to(device)) for n, p in ps] for dt, ps in self.patterns.items()}
        return self.devices[device]

    def weight_of(self, t: torch.Tensor) -> str | None:
        """The name of the full weight `t` is (any view of it, or of its transpose, in fp32 or a 16-bit cast)."""
        if t.dtype not in self.patterns or t.device.type == "meta":
            return None
        values = t.detach().reshape(-1)  # (numel,) in t's logical order
        patterns = self.on(t.device)[t.dtype]
        return next((n for n, p in patterns if p.numel() == values.numel() and torch.equal(values, p)), None)

    def shard_of(self, t: torch.Tensor) -> str | None:
        """The name of the weight whose values `t` starts with (a shard about to be all-gathered: a contiguous piece
        of the weight flattened as stored or transposed, in fp32 or a 16-bit cast), judged on its first SHARD_PROBE
        values."""
        if t.dtype not in self.patterns or t.device.type == "meta" or t.numel() == 0:
            return None
        head = t.detach().reshape(-1)[:SHARD_PROBE]  # (<= SHARD_PROBE,)
        for name, p in self.on(t.device)[t.dtype]:
            starts = (p[: p.numel() - head.numel() + 1] == head[0]).nonzero().flatten()[:MAX_STARTS].tolist()
            if any(torch.equal(p[s : s + head.numel()], head) for s in starts):
                return name
        return None

    def in_storage(self, storage) -> set[tuple[str, str]]:
        """{(weight name, dtype)} of the full weights `storage` holds, whole and contiguous."""
        found = set()
        for dt, patterns in self.on(storage.device).items():
            size = torch.empty((), dtype=dt).element_size()
            if storage.nbytes() % size:
                continue
            flat = torch.tensor([], dtype=dt, device=storage.device).set_(storage)  # (nbytes / size,) read as dt
            n = flat.numel()
            for name, p in patterns:
                m = p.numel()
                if m > n or (name, dtype_name(p)) in found:
                    continue
                starts = (flat[: n - m + 1] == p[0]).nonzero().flatten()[:MAX_STARTS].tolist()
                if any(torch.equal(flat[s : s + m], p) for s in starts):
                    found.add((name, dtype_name(p)))
        return found


class StepProbe(TorchDispatchMode):
    """In each phase of a step ("forward", "backward"): the dtypes of every matmul and collective, and for every
    all-gather the weight whose shard it sends (None: not a weight's); in the forward, before every op that may use a
    weight (a matmul, an embedding lookup), the weights it uses and the full weights alive then (`watch.alive`, a
    barrier: called at every such op, the same number on every rank)."""

    def __init__(self, watch):
        super().__init__()
        self.watch, self.phase, self.step = watch, None, 0
        self.matmuls = []  # (phase, op, floating dtypes, largest numel)
        self.gathers = []  # (phase, op, floating dtypes, largest numel, weight name or None)
        self.others = []  # every other collective: (phase, op, floating dtypes, largest numel)
        self.uses = []  # {"step", "used": [weight name], "alive": Watch.alive()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ns, name = func.namespace, func.__name__.split(".")[0]
        if self.phase is not None:
            if ns == "aten" and name in MATMULS:
                self.matmuls.append(self._row(func, args, kwargs))
            elif ns in ("c10d", "_c10d_functional") and "allgather" in name.replace("_", ""):
                sent = args[0] if ns == "_c10d_functional" else args[1]  # the input(s); c10d's outputs come first
                with _disable_current_modes():
                    whose = {self.watch.weights.shard_of(t) for t in tree_leaves(sent) if isinstance(t, torch.Tensor)}
                self.gathers.append((*self._row(func, args, kwargs), next(iter(sorted(whose - {None})), None)))
            elif ns in ("c10d", "_c10d_functional") and name != "barrier":
                self.others.append(self._row(func, args, kwargs))
        if self.phase == "forward" and ns == "aten" and name in USES:
            with _disable_current_modes():
                used = {self.watch.weights.weight_of(t) for t in tree_leaves(args) if isinstance(t, torch.Tensor)}
            used, names = sorted(used - {None}), self.watch.weights.names
            i = names.index(used[0]) if len(used) == 1 else None
            allowed = names if i is None else forward_window(names, i)
            self.uses.append({"step": self.step, "used": used, "alive": self.watch.alive(allowed=allowed)})
        return func(*args, **(kwargs or {}))

    def _row(self, func, args, kwargs) -> tuple:
        floating = [
            t for t in tree_leaves((args, kwargs or {})) if isinstance(t, torch.Tensor) and t.is_floating_point()
        ]
        dtypes = sorted({dtype_name(t) for t in floating})
        return (
            self.phase,
            f"{func.namespace}.{func.__name__.split('.')[0]}",
            dtypes,
            max((t.numel() for t in floating), default=0),
        )


def saved_storages(root: torch.Tensor) -> set:
    """Storage keys of the tensors root's autograd graph holds until backward: each node's _saved_* (built-in ops),
    saved_tensors and tensor attributes (a Python Function's ctx), and the leaves it accumulates gradients into."""
    keys, seen, todo = set(), set(), deque([root.grad_fn])
    while todo:
        node = todo.popleft()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        values = []
        for attr in dir(node):
            if attr.startswith("_saved_") or attr in ("saved_tensors", "variable"):  # variable: AccumulateGrad's leaf
                with contextlib.suppress(Exception):  # freed or not unpackable: nothing saved there now
                    values.append(getattr(node, attr))
        values += list(getattr(node, "__dict__", {}).values())
        for t in tree_leaves(values):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type != "meta":
                keys.add(M.storage_key(t))
        todo.extend(fn for fn, _ in node.next_functions)
    return keys


class Watch:
    """The storages of one step (StorageWatch) and the full weights found in them at a point. Two kinds of storage
    are never a gathered weight, whatever they hold: those holding a full weight once get_fsdp returned (`before`: the
    shard check judges them) and the wrapper's parameters while they keep the shape they had then (`masters`: a
    shard; a flat shard of several small weights may hold some of them whole)."""

    def __init__(self, weights: FullWeights, existing):
        self.weights, self.storages = weights, M.StorageWatch(existing)
        self.before, self.masters = set(), []  # storage keys; (parameter, its shape after get_fsdp)

    def start(self, wrapped) -> None:
        """After get_fsdp: note `before` and the wrapper's parameters."""
        self.masters = [(p, p.shape) for p in wrapped.parameters()]
        self.before = {key for key, _, _ in self.found(SETTLE_S[-1])}

    def found(self, settle_s: float | None = None) -> list[tuple]:
        """(storage key, storage bytes, {(weight name, dtype)}) of every storage holding a full weight now, the
        `before` and `masters` aside, once a barrier has completed the collectives in flight. With `settle_s`, first
        cyclic garbage collected (the objects made since probe_step's gc.freeze) and that long for gloo's threads to
        let go of the collectives they ran (a finished one keeps its tensors until its thread drops it)."""
        with _disable_current_modes():
            if settle_s is not None:
                gc.collect()
                time.sleep(settle_s)
            dist.barrier()  # gloo's barrier waits for the collectives started before it: their values are in
            aside = self.before | {M.storage_key(p) for p, shape in self.masters if p.shape == shape}
            held = [
                (key, storage.nbytes(), self.weights.in_storage(storage))
                for key, storage, _ in self.storages.alive()
                if key not in aside
            ]
        return [h for h in held if h[2]]

    def alive(self, saved=frozenset(), allowed=()) -> dict:
        """{weight name: [(dtype, storage bytes, held by autograd)]} of the full weights gathered now. A weight not in
        `allowed` is believed only if it is still there after each of SETTLE_S (garbage collected, gloo's threads
        given time); whether to look again is agreed by every rank, so each makes the same collective calls."""
        found = self.found()
        for settle_s in SETTLE_S:
            again = torch.tensor([int(any(n not in allowed for _, _, names in found for n, _ in names))])
            with _disable_current_modes():
                dist.all_reduce(again, op=dist.ReduceOp.MAX)
            if not again.item():
                break
            found = self.found(settle_s)
        out = {}
        for key, nbytes, names in found:
            for name, dt in sorted(names):
                out.setdefault(name, []).append((dt, nbytes, key in saved))
        return out


def probe_step(impl: XF.FsdpImpl, dtype: str) -> dict:
    """PROBE_STEPS AdamW steps (lr 0: the weights stay put) of the course's FSDP test model through the student's
    adapters (compute dtype `dtype`), the course test's data, this rank's rows, watched: per step, the full weights
    alive before each forward op that uses a weight, once the loss is computed (before backward) and after backward
    and fsdp_on_after_backward; the matmuls' and all-gathers' dtypes; the master weights', gradients' and optimizer
    state's dtypes."""
    layers, shard_types = CM.course_layers()
    torch.manual_seed(42)
    model = CM.FSDPToyModel(layers)
    full = {
        f"{n}.{pn}": p.detach().clone()
        for n, m in model.named_modules()
        if isinstance(m, shard_types)
        for pn, p in m.named_parameters(recurse=False)
    }  # in the course's model, the forward's call order
    watch = Watch(FullWeights(full), list(model.parameters()))
    gc.freeze()  # what exists now is never garbage we look for: a full collection then scans only the step's objects
    try:
        with watch.storages:
            wrapped = impl.wrap(model, XF.DTYPES[dtype])
        del model
        watch.start(wrapped)
        unsharded = {watch.weights.weight_of(p) for p in wrapped.parameters()} - {None}  # a parameter is one whole
        out = {"names": list(full), "nbytes": watch.weights.nbytes, "before": len(watch.before)}
        out["unsharded"] = sorted(unsharded)
        return {**out, **_watched_steps(impl, wrapped, watch)}
    finally:
        gc.unfreeze()


def _watched_steps(impl: XF.FsdpImpl, wrapped, watch: Watch) -> dict:
    """probe_step's steps, once get_fsdp has returned."""
    probe, between, end = StepProbe(watch), [], []
    master = {dtype_name(p) for p in wrapped.parameters()}
    opt = torch.optim.AdamW(wrapped.parameters(), lr=0.0)  # lr 0: the weights stay those FullWeights looks for
    ids, labels = CM.fsdp_data()
    rows = rank_rows(ids.shape[0], dist.get_rank(), S.WORLD)
    for step in range(PROBE_STEPS):
        probe.step = step
        with watch.storages, probe:
            probe.phase = "forward"
            loss = CM.last_position_loss(wrapped(ids[rows]), labels[rows])
            probe.phase = None
        between.append(watch.alive(saved_storages(loss), allowed=watch.weights.names[-AHEAD:]))
        with watch.storages, probe:
            probe.phase = "backward"
            loss.backward()
            impl.on_after_backward(wrapped, opt)
            probe.phase = None
        del loss
        end.append(watch.alive())
        grads = {dtype_name(p.grad) for p in wrapped.parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad(set_to_none=True)
    state = {dtype_name(t) for s in opt.state.values() for t in s.values() if _floating(t)}
    return {
        "uses": probe.uses,
        "between": between,
        "end": end,
        "matmuls": probe.matmuls,
        "gathers": probe.gathers,
        "others": probe.others,
        "master": sorted(master),
        "grads": sorted(grads),
        "state": sorted(state),
    }


def _floating(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()
