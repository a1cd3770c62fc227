"""When helpers.fsdp.FSDP gathers, frees and reduce-scatters: the forward pre/post hooks on each sharded module and
the tensor hooks on its outputs and gathered weights, with the forward call order they prefetch along (the table
in helpers.fsdp's docstring)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn as nn

from helpers.comm import wait_all
from helpers.fsdp_accounting import Accounting
from helpers.fsdp_storage import ShardStore, Use


class GatherHooks:
    """The hooks of one FSDP on its sharded modules. `gather` (module -> Use with its all-gathers started),
    `start_gather` (use, k) and `free` (use, k) are FSDP's, so that a subclass of FSDP sees every gather and free."""

    def __init__(
        self,
        store: ShardStore,
        account: Accounting,
        compute_dtype: torch.dtype | None,
        *,
        gather: Callable[[nn.Module], Use],
        start_gather: Callable[[Use, int], None],
        free: Callable[[Use, int], None],
    ):
        self.store, self.account, self.compute_dtype = store, account, compute_dtype
        self.gather, self.start_gather, self.free = gather, start_gather, free
        self.order: list[nn.Module] | None = None  # sharded modules in forward call order, from the first forward
        self.calls, self.prefetch, self.active, self.live = [], {}, [], []
        self.post_ids = {}  # sharded module -> id of its post-forward hook, moved last before each call
        self.handles = []  # removable
        for m in store.units:
            self.handles.append(m.register_forward_pre_hook(self.pre_forward, with_kwargs=True))
            self.handles.append(m.register_forward_hook(self.post_forward))
            self.post_ids[m] = self.handles[-1].id

    # ---- waiting and dropping ----

    def gathered(self, module: nn.Module) -> Use:
        use = self.gather(module)
        self.live.append(use)
        return use

    def wait(self, use: Use, timed: bool = True) -> None:
        with self.account.clock.waiting(self.store.device) if timed else contextlib.nullcontext():
            wait_all([handle for handle, _ in use.handles])
            use.handles = []
            use.in_flight.settle()  # before the gathered buffers get views (comm.InFlight)

    def drop(self, use: Use | None, timed: bool = True) -> None:
        """A prefetch nobody used (the call order changed): wait for it, free it."""
        if use is not None:
            self.wait(use, timed)
            for k in range(len(use.flats)):
                self.free(use, k)

    def drop_live(self) -> None:
        """End of step: backward prefetches never used; frozen weights that no input gradient freed."""
        for use in self.live:
            self.drop(use, timed=False)
        self.live, self.prefetch = [], {}

    # ---- forward ----

    def start_forward(self) -> None:
        self.calls = []  # this forward's uses of sharded modules, in call order

    def end_forward(self) -> None:
        if self.order is None:
            self.order = [use.module for use in self.calls]
        for use in self.prefetch.values():
            self.drop(use)
        self.prefetch = {}
        self.live = [u for u in self.live if u.needs_backward]  # the others are done (no_grad, eval)

    def pre_forward(self, module, args, kwargs):
        module._forward_hooks.move_to_end(self.post_ids[module])  # free after the user's forward hooks have run
        i = len(self.calls)
        use = self.prefetch.pop(i, None)
        if use is None or use.module is not module:
            self.drop(use)
            use = self.gathered(module)
        use.calls, use.index = self.calls, i
        self.calls.append(use)
        if self.order is not None and i + 1 < len(self.order) and i + 1 not in self.prefetch:
            self.prefetch[i + 1] = self.gathered(self.order[i + 1])  # overlaps this module's compute
            self.account.prefetched += 1
        self.wait(use)
        grad = torch.is_grad_enabled()
        for k, (attr, shard) in enumerate(use.params):
            full = use.flats[k][: shard.numel].view(shard.shape).data  # (*shape,) a leaf of its own, same storage
            if grad and shard.param.requires_grad:
                full.requires_grad_(True)
                full.register_post_accumulate_grad_hook(lambda t, use=use, k=k: self.reduce_scatter_grad(use, k, t))
            use.fulls.append(full)
            setattr(module, attr, full)
        frozen = grad and not all(s.param.requires_grad for _, s in use.params)
        self.active.append(use)
        args = tuple(self.input(x, use, frozen) for x in args)
        return args, {k: self.input(v, use, frozen) for k, v in kwargs.items()}

    def input(self, x, use: Use, frozen: bool):
        """Cast a floating input to compute_dtype; with frozen weights, free them once the input's gradient is in."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return x
        x = x.to(self.compute_dtype) if self.compute_dtype is not None else x
        if frozen and x.requires_grad:
            x = x.view_as(x)  # an alias only this module consumes: its gradient means the module's backward is done
            x.register_hook(lambda _, use=use: self.free_frozen(use))
        return x

    def post_forward(self, module, args, output):
        use = self.active.pop()
        for k, (attr, shard) in enumerate(use.params):
            self.free(use, k)
            setattr(module, attr, shard.outside)  # never the freed buffer: reading that would segfault
        outputs = list(output.values()) if isinstance(output, dict) else output
        for t in outputs if isinstance(outputs, (tuple, list)) else [outputs]:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                use.needs_backward = True
                t.register_hook(lambda _, use=use: self.pre_backward(use))

    # ---- backward ----

    def pre_backward(self, use: Use) -> None:
        if use.backward_seen:  # a second output of the same call
            return
        use.backward_seen = True
        if not use.handles:  # not prefetched
            for k in range(len(use.flats)):
                self.start_gather(use, k)
        nxt = next((u for u in reversed(use.calls[: use.index]) if u.needs_backward and not u.backward_seen), None)
        if nxt is not None and not nxt.handles:
            for k in range(len(nxt.flats)):
                self.start_gather(nxt, k)  # prefetch the module backward reaches next
            self.account.prefetched += 1
        self.wait(use)

    def reduce_scatter_grad(self, use: Use, k: int, full: torch.Tensor) -> None:
        grad, full.grad = full.grad, None  # (*shape,) in compute dtype
        self.store.reduce_scatter(use.params[k][1], grad)
        self.free(use, k)

    def free_frozen(self, use: Use) -> None:
        for k, (_, shard) in enumerate(use.params):
            if not shard.param.requires_grad:
                self.free(use, k)
