"""Data-parallel training by hand: naive, flat, overlapped per-parameter and bucketed DDP (notebook 04).

Runbook:

    ddp = DDPBucketed(model, bucket_size_mb=25)        # or NaiveDDP / FlatDDP / DDPIndividualParameters(model)
    for x, y in batches:                               # x, y: this rank's share of the global batch
        optimizer.zero_grad(set_to_none=True)
        ddp.on_train_batch_start()                     # bucketed: drop last step's gradient views
        lm_loss(ddp(x), y).backward()                  # overlapped variants start all-reduces from hooks
        ddp.finish_gradient_synchronization()          # wait (naive/flat: all-reduce here); grads = rank mean
        optimizer.step()

    ddp.close()                                        # overlapped variants: remove the gradient hooks (or `with`)

The workers notebook 04 runs with these wrappers, and `python -m helpers bench ddp`, are in helpers.experiments.ddp.

Every wrapper broadcasts rank 0's parameters and buffers at construction, averages the gradients of the
parameters that require them (a tied Parameter once: named_parameters() dedupes by identity), in
named_parameters() order, and gives a parameter that got no gradient this step a zero gradient on every rank
(not None: under weight decay or momentum the optimizer then still moves it, unlike in one process; with plain SGD
the two agree). `comm_s` adds up the time spent waiting in finish_gradient_synchronization (on a GPU, the time the
stream waited: helpers.timing.WaitClock).
"""

from __future__ import annotations

import time
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.comm import InFlight, no_python_refs, wait_all
from helpers.formulas import MiB
from helpers.timing import WaitClock

MB = MiB  # bucket sizes are in binary MB, as torch's bucket_cap_mb
_HOOKED = weakref.WeakValueDictionary()  # id(parameter) -> the live wrapper whose gradient hook it carries


class _DataParallel(nn.Module):
    """What every wrapper shares: `.module`, rank-0 broadcast, the gradient list, comm timing and a timeline."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world = dist.get_world_size()
        self.in_flight = InFlight()  # what the collectives were given, held until the backend lets go (comm.InFlight)
        with torch.no_grad(), no_python_refs():
            for t in list(module.parameters()) + list(module.buffers()):
                self.in_flight.launching(t)
                dist.broadcast(t, src=0)
        self.in_flight.settle()
        self.params = [p for _, p in module.named_parameters() if p.requires_grad]  # deduped, registration order
        self.clock = WaitClock()  # waits in finish_gradient_synchronization (CUDA events on a GPU)
        self.timeline: list | None = None  # set to [] to record [launch, done] pairs per all-reduce (see _span)

    @property
    def comm_s(self) -> float:
        """Seconds spent waiting in finish_gradient_synchronization (on a GPU: the stream's wait, not the host's)."""
        return self.clock.seconds

    def _device(self) -> torch.device:
        return self.params[0].device if self.params else torch.device("cpu")

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def on_train_batch_start(self) -> None:
        """Nothing to prepare, except for DDPBucketed."""

    def close(self) -> None:
        """Remove what this wrapper attached to the module (hooks); nothing for the wrappers that attach none."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _all_reduce(self, flat: torch.Tensor):
        """Start an async all-reduce of flat / world (the mean over ranks); return its handle."""
        flat.div_(self.world)
        nccl = flat.is_cuda and dist.get_backend() == "nccl"
        launched = torch.cuda.Event(enable_timing=True) if nccl else time.perf_counter()
        if nccl:
            launched.record()  # when the stream reaches the launch: the gradient is ready
        self.in_flight.launching(flat)
        with no_python_refs():  # called from autograd hooks: see helpers.comm.no_python_refs
            handle = dist.all_reduce(flat, async_op=True)
        if self.timeline is not None:
            self.timeline.append(_span(handle, launched, flat.device) if nccl else _host_span(handle, launched))
        return handle

    def _grads(self) -> list[torch.Tensor]:
        """Every parameter's gradient, a zero one where backward left it None."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return [p.grad for p in self.params]


class NaiveDDP(_DataParallel):
    """The baseline: after backward, one blocking all-reduce per parameter, in order (no overlap, many calls)."""

    def finish_gradient_synchronization(self) -> None:
        with self.clock.waiting(self._device()):
            for g in self._grads():
                self._all_reduce(g).wait()
            self.in_flight.settle()


class FlatDDP(_DataParallel):
    """After backward, all gradients copied into one flat buffer and all-reduced once (one α, two copies)."""

    def finish_gradient_synchronization(self) -> None:
        with self.clock.waiting(self._device()):
            grads = self._grads()
            flat = torch.cat([g.reshape(-1) for g in grads])  # (total numel,)
            self._all_reduce(flat).wait()
            self.in_flight.settle()  # before the views below: they count as holders too
            for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
                g.copy_(part.view_as(g))


def _weak_hook(wrapper: DDPBucketed):
    """wrapper._hook behind a weak reference: a hook holding the wrapper would close a cycle (parameter -> hook ->
    wrapper -> module -> parameter), so a wrapper dropped without close() would keep its bucket buffers (a model's
    worth of gradients) until the next full garbage collection. Once the wrapper is gone the hook does nothing."""
    ref = weakref.ref(wrapper)

    def hook(p: torch.Tensor) -> None:
        alive = ref()
        if alive is not None:
            alive._hook(p)

    return hook


def _host_span(handle, launched: float) -> list:
    """[launch, done] in perf_counter seconds; done set by the work's future (gloo completes it when the data is in)."""
    span = [launched, None]
    handle.get_future().then(lambda _: span.__setitem__(1, time.perf_counter()))
    return span


_SIDE_STREAMS = {}  # device -> a stream that only waits for collectives (for their done events)


def _span(handle, launched, device) -> list:
    """[launch, done] as CUDA events: NCCL completes a work's future as soon as it is enqueued, so its callback says
    nothing of when the data arrived; a side stream made to wait for the work records when it did, without making
    the compute stream wait (which would serialize backward behind the all-reduce)."""
    side = _SIDE_STREAMS.setdefault(device, torch.cuda.Stream(device))
    done = torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(side):
        handle.wait()  # the side stream waits for NCCL's stream
        done.record(side)
    return [launched, done]


def _remove_hooks(handles: list) -> None:
    """Remove gradient hooks by their handles, emptying the list in place."""
    for h in handles:
        h.remove()
    handles.clear()


def plan_buckets(sizes_bytes: list[int], bucket_size_bytes: float) -> list[list[int]]:
    """Greedy buckets of parameter indices in reverse order, each <= bucket_size_bytes (a larger one sits alone)."""
    buckets, used = [], 0
    for i in reversed(range(len(sizes_bytes))):
        if not buckets or (buckets[-1] and used + sizes_bytes[i] > bucket_size_bytes):
            buckets.append([])
            used = 0
        buckets[-1].append(i)
        used += sizes_bytes[i]
    return buckets


class DDPBucketed(_DataParallel):
    """Overlap with fewer calls: each gradient is copied once into its slot of a flat bucket buffer and stays a view
    of it (the all-reduced bucket is the gradient: nothing is copied back); a bucket's async
    all-reduce starts once all its gradients are in and every earlier bucket has started, so all ranks issue the
    same calls in the same order, even when some parameter got no gradient on some rank (finish sends those)."""

    def __init__(self, module: nn.Module, bucket_size_mb: float | None = None):
        if bucket_size_mb is not None and not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb must be > 0 (or None for one bucket), got {bucket_size_mb!r}")
        super().__init__(module)
        plan = self._plan([p.numel() * p.element_size() for p in self.params], bucket_size_mb)
        self.buckets = [[self.params[i] for i in b] for b in plan]  # parameters per bucket, launch order
        self.bucket_buffers, self._where = [], {}  # flat gradient buffers, launch order; id(param) -> (bucket, view)
        for p in self.params:  # the module was wrapped before (a re-run notebook cell): that wrapper's hooks go
            if id(p) in _HOOKED:
                _HOOKED[id(p)].close()
        self._handles_hooks = []
        weakref.finalize(self, _remove_hooks, self._handles_hooks)  # dropped without close(): its hooks go too
        for k, bucket in enumerate(self.buckets):
            if len({p.dtype for p in bucket}) > 1:
                raise ValueError("DDPBucketed needs one dtype per bucket; cast the model or use smaller buckets")
            flat = torch.zeros(sum(p.numel() for p in bucket), dtype=bucket[0].dtype, device=bucket[0].device)
            self.bucket_buffers.append(flat)
            for p, view in zip(bucket, flat.split([p.numel() for p in bucket]), strict=True):
                self._where[id(p)] = (k, view.view_as(p))
                self._handles_hooks.append(p.register_post_accumulate_grad_hook(_weak_hook(self)))
                _HOOKED[id(p)] = self
        self._reset()

    def close(self) -> None:
        """Wait for any all-reduce still in flight, then remove the gradient hooks (a module wrapped again gets a
        fresh wrapper and this one stops syncing). Pending collectives or hooks left firing into a process group that
        is being torn down are what can abort a process at exit."""
        wait_all(self._handles)
        self._reset()
        self.in_flight.settle()
        _remove_hooks(self._handles_hooks)
        for p in self.params:
            if _HOOKED.get(id(p)) is self:
                del _HOOKED[id(p)]

    @staticmethod
    def _plan(sizes_bytes: list[int], bucket_size_mb: float | None) -> list[list[int]]:
        return plan_buckets(sizes_bytes, float("inf") if bucket_size_mb is None else bucket_size_mb * MB)

    def _reset(self) -> None:
        self._ready, self._fired, self._next, self._handles = [0] * len(self.buckets), set(), 0, []

    def on_train_batch_start(self) -> None:
        """Drop the last step's gradients: each hook then copies its fresh gradient into its bucket view once (a read
        and a write), cheaper than zeroing the buckets and letting backward add into them (a write, two reads and a
        write). Zeroed views (zero_grad(set_to_none=False)) work too: backward then adds in place."""
        for p in self.params:
            p.grad = None

    def _hook(self, p: torch.Tensor) -> None:
        if id(p) in self._fired:  # its bucket may already be on the wire
            raise RuntimeError(
                "a gradient arrived twice in one step: call finish_gradient_synchronization() "
                "after each backward (accumulating over several backward passes is not supported)"
            )
        k, view = self._where[id(p)]
        if p.grad.data_ptr() != view.data_ptr():  # a fresh gradient (the usual case): one copy into the bucket
            view.copy_(p.grad)
            p.grad = view
        self._fired.add(id(p))
        self._ready[k] += 1
        self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and self._ready[self._next] == len(self.buckets[self._next]):
            self._handles.append(self._all_reduce(self.bucket_buffers[self._next]))
            self._next += 1

    def finish_gradient_synchronization(self) -> None:
        with self.clock.waiting(self._device()):
            for p in self.params:  # no gradient this step: a zero one, so its bucket can go
                if id(p) not in self._fired:
                    k, view = self._where[id(p)]
                    view.zero_()
                    p.grad = view
                    self._ready[k] += 1
            self._launch_ready()
            wait_all(self._handles)
            self._reset()  # drops the handles: now only the backend's threads may hold the buckets
            self.in_flight.settle()


class DDPIndividualParameters(DDPBucketed):
    """Overlap, one call per parameter: each gradient's async all-reduce starts from its post-accumulate-grad hook
    while backward goes on. It is DDPBucketed with one parameter per bucket: launches go in reverse registration
    order (a gradient that arrives early waits for the ones before it), so ranks whose graphs differ still match."""

    def __init__(self, module: nn.Module):
        super().__init__(module, None)

    @staticmethod
    def _plan(sizes_bytes: list[int], bucket_size_mb: float | None) -> list[list[int]]:
        return [[i] for i in reversed(range(len(sizes_bytes)))]


class TorchDDP(_DataParallel):
    """torch.nn.parallel.DistributedDataParallel behind the same loop (it waits for its buckets inside backward)."""

    def __init__(self, module: nn.Module, bucket_size_mb: float = 25, find_unused_parameters: bool = False):
        super().__init__(module)
        self.ddp = nn.parallel.DistributedDataParallel(
            module,
            bucket_cap_mb=bucket_size_mb,
            gradient_as_bucket_view=True,
            find_unused_parameters=find_unused_parameters,
        )

    def forward(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Already done by the time backward returns."""


VARIANTS = {
    "naive": NaiveDDP,
    "flat": FlatDDP,
    "per_parameter": DDPIndividualParameters,
    "bucketed": DDPBucketed,
    "torch_ddp": TorchDDP,
}


def wrap(kind: str, module: nn.Module, bucket_size_mb: float | None = None, **kwargs) -> _DataParallel:
    """VARIANTS[kind](module), with bucket_size_mb for "bucketed" and "torch_ddp" (the others have no buckets)."""
    if kind not in VARIANTS:
        raise ValueError(f"unknown DDP variant {kind!r}; expected one of {', '.join(VARIANTS)}")
    if bucket_size_mb is not None and kind not in ("bucketed", "torch_ddp"):
        raise ValueError(f"{kind!r} has no buckets, so bucket_size_mb={bucket_size_mb!r} would be ignored; pass None")
    if kind in ("bucketed", "torch_ddp"):
        kwargs["bucket_size_mb"] = bucket_size_mb if bucket_size_mb is not None or kind == "bucketed" else 25
    return VARIANTS[kind](module, **kwargs)
