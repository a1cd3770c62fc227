"""Memory of a training step: measured (a device-agnostic tracker) and analytic (from the config).

    trace = track(lambda: train_step(lm, opt, x, y), existing=lm.parameters(), model=lm)
    trace.peak_bytes, trace.timeline, trace.largest(5)          # measured, any device
    trace.categorize(params=..., grads=..., optimizer_state=...) # what was live at the peak
    step_breakdown(cfg, batch_size, context_length)              # analytic bytes per part

The tracker is a TorchDispatchMode: every op's output storages are counted when they
first appear and uncounted by a weakref finalizer when they die, so it sees the bytes
PyTorch holds for tensors on any device (the CUDA caching allocator's rounding and
cached blocks are not included; on CUDA `track` also reports the allocator's peak).
Notebooks 01 (memory of one step) and 05 (optimizer-state sharding) use it.
"""
from __future__ import annotations

import contextlib
import itertools
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from helpers.model import ModelConfig, count_parameters, get_config

MiB = 2**20


@dataclass
class Allocation:
    """One live storage: bytes, the op that made it, the module it was made in, and an allocation id."""
    nbytes: int
    op: str
    module: str
    alloc_id: int


class _Tracker(TorchDispatchMode):
    """Counts live tensor storages by data pointer; current, peak and a timeline of (event, bytes)."""

    def __init__(self, module_tracker=None):
        super().__init__()
        self.live: dict[tuple, Allocation] = {}
        self.history: dict[int, Allocation] = {}  # alloc_id -> every allocation, live or freed
        self.current = self.peak = 0
        self.timeline: list[tuple[int, int]] = []
        self.peak_ids: set[int] = set()
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
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.device.type == "meta":
            return
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        nbytes = storage.nbytes()
        if key in self.live or nbytes == 0:
            return
        alloc = self.live[key] = Allocation(nbytes, op, self._where(), next(self._ids))
        self.history[alloc.alloc_id] = alloc
        self.current += nbytes
        self._finalizers.append(weakref.finalize(storage, self._free, key))
        if self.current > self.peak:
            self.peak = self.current
            self.peak_ids = {a.alloc_id for a in self.live.values()}

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
            self.timeline.append((len(self.timeline), self.current))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            self.add(t, func.__name__.split(".")[0])
        self.timeline.append((len(self.timeline), self.current))
        return out


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
                alloc = self.live.get((str(t.device), t.untyped_storage().data_ptr()))
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
        with (modules if modules is not None else contextlib.nullcontext()), tracker:
            result = fn()
    finally:
        tracker.detach()
    allocator_peak = None
    if cuda:
        torch.cuda.synchronize(dev)
        allocator_peak = torch.cuda.max_memory_allocated(dev)
    return MemoryTrace(tracker.peak, tracker.current, baseline, tracker.timeline, dict(tracker.live),
                       dict(tracker.history), set(tracker.peak_ids), allocator_peak, result)


def step_peaks(size, batch_size: int, context_length: int, autocast_dtype=None, device=None) -> dict[str, MemoryTrace]:
    """Traces of forward-only and of a steady-state training step (AdamW state exists) of a fresh model of `size`."""
    from helpers.model import build_model, random_batch
    from helpers.profiling import forward_step, train_step

    lm = build_model(size, device=device)
    opt = torch.optim.AdamW(lm.parameters())
    x, y = random_batch(lm.cfg, batch_size, context_length, device=device)
    train_step(lm, opt, x, y, autocast_dtype=autocast_dtype)  # creates the AdamW state
    lm.zero_grad(set_to_none=True)
    state = model_state(lm, opt, x, y)
    return {"forward": track(lambda: forward_step(lm, x, autocast_dtype), existing=state, device=device),
            "full step": track(lambda: train_step(lm, opt, x, y, autocast_dtype=autocast_dtype),
                               existing=state, device=device)}


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


# --- analytic accounting ------------------------------------------------------------------------

def dtype_bytes(dtype: torch.dtype) -> int:
    """Bytes per element of `dtype`."""
    return torch.empty((), dtype=dtype).element_size()


def param_bytes(cfg: ModelConfig | str, dtype=torch.float32) -> int:
    """Bytes of the parameters (also of their gradients, which have the parameters' dtype)."""
    return count_parameters(cfg) * dtype_bytes(dtype)


def param_tensor_count(cfg: ModelConfig | str) -> int:
    """Number of parameter tensors: embeddings 2, per block 2 norms + 4 linears, final norm, LM head."""
    return 2 + 6 * get_config(cfg).n_layers + 2


def adamw_state_bytes(cfg: ModelConfig | str, dtype=torch.float32) -> int:
    """AdamW state: exp_avg and exp_avg_sq like each parameter, plus a 4-byte fp32 `step` per parameter tensor."""
    return 2 * param_bytes(cfg, dtype) + 4 * param_tensor_count(cfg)


def residual_stream_bytes(batch_size: int, context_length: int, d_model: int, dtype=torch.float32) -> int:
    """One residual-stream activation (B, T, d_model): B·T·d·bytes."""
    return batch_size * context_length * d_model * dtype_bytes(dtype)


def buffer_bytes(cfg: ModelConfig | str) -> int:
    """The causal-mask buffers: one (context, context) bool matrix per block."""
    c = get_config(cfg)
    return c.n_layers * c.context_length**2


def activation_bytes(cfg: ModelConfig | str, batch_size: int, context_length: int | None = None,
                     dtype=torch.float32) -> dict[str, int]:
    """Bytes autograd saves for backward in one forward pass of TransformerLM (fp32), per part.

    Per block, with R = B·T·d: the block input, norm1's y and output, q, k and v made contiguous
    for the matmuls (3R), the re-assembled heads, the mid-block residual, norm2's y and output
    (10 R in all), two rsqrt columns (2 B·T), the attention probabilities (B·H·T²), the negated
    causal mask (T² bool), and the FFN's d_ff-wide w1 output and GELU output. After the blocks:
    the last residual, the final norm's y, output and rsqrt, the log-softmax output (B·T·V) and
    the loss with its total weight (2 scalars). The position ids (int64 T) for the embedding backward.
    """
    c = get_config(cfg)
    B, T = batch_size, context_length or c.context_length
    e = dtype_bytes(dtype)
    R = B * T * c.d_model
    per_block = (10 * R + 2 * B * T + 2 * B * T * c.d_ff + B * c.n_heads * T * T) * e + T * T
    return {"blocks": c.n_layers * per_block,
            "final norm + head + loss": (3 * R + B * T + B * T * c.vocab_size + 2) * e,
            "position ids": T * 8}


def model_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *batch) -> list:
    """Parameters, buffers, optimizer state and batch tensors: what is live before a step (pass as `existing`)."""
    state = [t for s in (optimizer.state.values() if optimizer else []) for t in s.values()
             if isinstance(t, torch.Tensor)]
    return list(model.parameters()) + list(model.buffers()) + state + list(batch)


def step_breakdown(cfg: ModelConfig | str, batch_size: int, context_length: int | None = None,
                   dtype=torch.float32) -> dict[str, int]:
    """Analytic bytes of one training step's state: parameters, gradients, AdamW state, saved activations."""
    return {"parameters": param_bytes(cfg, dtype), "buffers": buffer_bytes(cfg), "gradients": param_bytes(cfg, dtype),
            "optimizer state": adamw_state_bytes(cfg, dtype),
            "activations": sum(activation_bytes(cfg, batch_size, context_length, dtype).values()),
            "token ids": 2 * batch_size * (context_length or get_config(cfg).context_length) * 8}  # inputs, targets


def loss_grad_bytes(cfg: ModelConfig | str, batch_size: int, context_length: int | None = None,
                    dtype=torch.float32) -> int:
    """The two (B, T, V) buffers live as backward starts: d loss/d log-probs and d loss/d logits."""
    c = get_config(cfg)
    return 2 * batch_size * (context_length or c.context_length) * c.vocab_size * dtype_bytes(dtype)


def peak_breakdown(cfg: ModelConfig | str, batch_size: int, context_length: int | None = None,
                   dtype=torch.float32) -> dict[str, int]:
    """What is live as backward starts in a steady-state step (AdamW state exists, grads were set to None).

    That moment holds every saved activation plus the two (B, T, V) loss-gradient buffers and is
    the step's peak when activations outweigh the gradients (as at the reference sizes); otherwise
    the peak falls later in backward, as gradients pile up, and this sum is a lower bound.
    """
    full = step_breakdown(cfg, batch_size, context_length, dtype)
    return {"parameters": full["parameters"], "buffers": full["buffers"], "optimizer state": full["optimizer state"],
            "gradients": 0, "activations": full["activations"],
            "loss gradients (B·T·V ×2)": loss_grad_bytes(cfg, batch_size, context_length, dtype),
            "token ids": full["token ids"]}
