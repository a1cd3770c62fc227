"""Fully sharded data parallel by hand (ZeRO-3), notebook 07.

Runbook (inside a worker started by helpers.launch.launch):

    fsdp = FSDP(model, compute_dtype=torch.bfloat16)     # or None: compute in fp32
    opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-3)  # this rank's fp32 shards + the replicated parameters
    for x, y in batches:                                 # x, y: this rank's share of the global batch
        opt.zero_grad(set_to_none=True)
        lm_loss(fsdp(x), y).backward()                   # all-gathers and reduce-scatters start from hooks
        fsdp.finish_gradient_synchronization()           # wait for them; every .grad is (a slice of) the rank mean
        opt.step()
    state = fsdp.gather_full_params()                    # {name: full fp32 tensor} on the model's device, every rank

What is sharded: every parameter of a module whose type is in `shard_types` (nn.Linear, nn.Embedding). Each rank
keeps a flat fp32 slice of 1/N of it, zero-padded to a multiple of N (so every world size works), as an nn.Parameter
of FSDP's; the module itself no longer registers it. Other parameters (norm gains) stay whole on every rank, in
fp32; their gradients are all-reduced (mean) in finish_gradient_synchronization, bitwise identical across ranks.
Frozen parameters (requires_grad False) are gathered like the others and never reduced or updated.

One sharded module's weight during a step:
    forward pre-hook   wait for its all-gather (cast to compute_dtype first); start the next module's (prefetch)
    forward post-hook  free the gathered bytes (autograd keeps the tensor object, with no storage, for backward)
    output grad hook   backward is about to reach the module: gather again into the same storage; prefetch the next
    weight grad hook   its gradient: to fp32, / N, async reduce-scatter into the shard's gradient; free the bytes
A gather starts when the module before it starts computing, so ~2 gathered modules are alive at most
(`peak_gathered_bytes`, `prefetched` count them). The forward call order is recorded in the first forward (no
forward prefetch in it) and must be the same on every rank, as the gathers are collectives. A Parameter shared by
two sharded modules (tied embedding and LM head) is sharded once and gathered for each use; each use's gradient is
reduce-scattered into the same shard gradient, which so holds the sum of both. With compute_dtype, floating inputs
of sharded modules are cast to it too (their outputs stay in it); every .grad is fp32.

Bytes each rank sends per step (ring algorithms, Ψ sharded parameters, b bytes per element; `fsdp_bytes_per_step`):
    FSDP: all-gather in forward + all-gather in backward + reduce-scatter = 3 (N-1)/N Ψ b
    DDP:  one all-reduce = 2 (N-1)/N Ψ b,  so FSDP moves 1.5x DDP's bytes (its price for 1/N of the memory).
compute_dtype halves the two gathers (b = 2); gradients are reduce-scattered in fp32 (b = 4). A tied parameter's Ψ
counts once per use; replicated parameters add one all-reduce, 2 (N-1)/N Ψ_rep 4. `comm_log` holds (op, bytes)
per collective of the training steps (all-gather: its output, reduce-scatter: its input, all-reduce: its buffer,
as helpers.comm counts them), and `comm_s` the seconds spent waiting for collectives.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.comm import all_gather, no_python_refs, reduce_scatter
from helpers.timing import WaitClock

COMPUTE_DTYPES = (None, torch.float16, torch.bfloat16)


def _all_gather(out, inp, async_op=False):
    """comm.all_gather with nothing Python in its work (launched from autograd hooks: comm.no_python_refs)."""
    with no_python_refs():
        return all_gather(out, inp, async_op=async_op)


def _reduce_scatter(out, inp, async_op=False):
    """comm.reduce_scatter, likewise."""
    with no_python_refs():
        return reduce_scatter(out, inp, async_op=async_op)


def bytes_sent(log: list[tuple[str, int]], world: int) -> float:
    """Bytes each rank sends for the collectives in `log` (ring algorithms): all-reduce 2(N-1)/N, others (N-1)/N."""
    factor = {
        "all_gather": (world - 1) / world,
        "reduce_scatter": (world - 1) / world,
        "all_reduce": 2 * (world - 1) / world,
    }
    return sum(factor[op] * nbytes for op, nbytes in log)


def fsdp_bytes_per_step(
    n_sharded: int, world: int, gather_bytes: int = 4, reduce_bytes: int = 4, n_replicated: int = 0
) -> float:
    """Bytes each rank sends per FSDP step: (N-1)/N Ψ (2 gather_bytes + reduce_bytes) + the replicated all-reduce."""
    return (world - 1) / world * (n_sharded * (2 * gather_bytes + reduce_bytes) + 2 * n_replicated * 4)


def ddp_bytes_per_step(n_params: int, world: int, bytes_per_element: int = 4) -> float:
    """Bytes each rank sends per DDP step: one all-reduce of every gradient, 2 (N-1)/N Ψ b."""
    return 2 * (world - 1) / world * n_params * bytes_per_element


class ShardedWeight(torch.Tensor):
    """What a sharded module's weight is outside its forward and backward when it is split over N > 1 ranks: the
    weight's shape and dtype, no data (meta). Reading it raises a RuntimeError that says how to get the full weight,
    instead of reading the gathered buffer FSDP has freed (a segfault). Shape, dtype, device and repr still work."""

    _ALLOWED = {
        torch.Tensor.shape.__get__,
        torch.Tensor.dtype.__get__,
        torch.Tensor.device.__get__,
        torch.Tensor.ndim.__get__,
        torch.Tensor.requires_grad.__get__,
        torch.Tensor.size,
        torch.Tensor.dim,
        torch.Tensor.numel,
        torch.Tensor.is_floating_point,
    }

    @staticmethod
    def __new__(cls, name: str, shape, dtype):
        return torch.Tensor._make_subclass(cls, torch.empty(shape, dtype=dtype, device="meta"))

    def __init__(self, name: str, shape, dtype):
        self.fsdp_name = name

    def __repr__(self, *, tensor_contents=None) -> str:
        return (
            f"ShardedWeight({self.fsdp_name!r}, shape={tuple(self.shape)}, dtype={self.dtype}: sharded over "
            "ranks, gathered only during its module's forward and backward)"
        )

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in cls._ALLOWED:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        name = next((a.fsdp_name for a in args if isinstance(a, ShardedWeight)), "this weight")
        raise RuntimeError(
            f"{name} is sharded by FSDP: each rank holds 1/N of it, and the full weight exists only "
            "during its module's forward and backward (a forward hook sees it). For the full "
            "weights, call fsdp.gather_full_params() on every rank (a collective); for this rank's "
            f"slice, fsdp.local_shards. ({getattr(func, '__name__', func)} was called on it.)"
        )


class _Shard:
    """One sharded Parameter: its full shape and this rank's flat fp32 slice (the nn.Parameter the optimizer sees)."""

    def __init__(self, name: str, p: nn.Parameter, rank: int, world: int):
        self.name, self.shape, self.numel = name, p.shape, p.numel()
        self.padded = -(-self.numel // world) * world  # numel rounded up to a multiple of N
        n = self.padded // world
        flat = torch.zeros(self.padded, dtype=torch.float32, device=p.device)  # (padded,)
        flat[: self.numel] = p.detach().reshape(-1)
        self.param = nn.Parameter(flat[rank * n : (rank + 1) * n].clone(), requires_grad=p.requires_grad)  # (padded/N,)
        self.pending = []  # reduce-scatters in flight: (handle, output slice, input kept alive)
        # the module's attribute outside the gathered window: on one rank the shard is the whole weight (a view of
        # it, current after every step); on N ranks a ShardedWeight that refuses to be read
        self.outside = (
            self.param.detach().view(self.shape)
            if world == 1  # (*shape,)
            else ShardedWeight(name, self.shape, self.param.dtype)
        )


class _Use:
    """One forward call of one sharded module: its gathered weights (padded flat buffers), alive between hooks."""

    def __init__(self, module: nn.Module, params: list[tuple[str, _Shard]], calls: list, dtype: torch.dtype):
        self.module, self.params, self.calls, self.index = module, params, calls, len(calls)
        self.flats = [torch.empty(s.padded, dtype=dtype, device=s.param.device) for _, s in params]  # (padded,)
        for flat in self.flats:
            flat.untyped_storage().resize_(0)  # allocated by the gather
        self.fulls, self.handles = [], []
        self.needs_backward = self.backward_seen = False

    def gathered(self, k: int) -> bool:
        return self.flats[k].untyped_storage().nbytes() > 0


def _list_weights(module: nn.Module, state_dict: dict, prefix: str, attrs: list[str]) -> None:
    """A sharded module's state_dict lists its weights as they stand outside forward (_Shard.outside): on one
    rank the weights, on N ranks ShardedWeights, which torch.save and load_state_dict refuse with the way out."""
    for attr in attrs:
        state_dict.setdefault(prefix + attr, getattr(module, attr))


class FSDP(nn.Module):
    """ZeRO-3 by hand: sharded fp32 master weights, gathered per module for forward and backward, gradients
    reduce-scattered as soon as each module's backward is done; see the module docstring."""

    def __init__(
        self,
        module: nn.Module,
        compute_dtype: torch.dtype | None = None,
        shard_types: tuple[type, ...] = (nn.Linear, nn.Embedding),
    ):
        super().__init__()
        shard_types = tuple(shard_types)
        self.device = self._check(module, compute_dtype, shard_types)
        self.module, self.compute_dtype = module, compute_dtype
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        with torch.no_grad(), no_python_refs():  # ranks may start from different weights: rank 0's win
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)
        self.param_names = [name for name, _ in module.named_parameters()]  # gather_full_params' keys, tied once
        names = {id(p): name for name, p in module.named_parameters()}
        self._shards: dict[int, _Shard] = {}  # id(parameter) -> its shard, a tied one once
        self._units: dict[nn.Module, list[tuple[str, _Shard]]] = {}  # sharded module -> its (attribute, shard)s
        self._hooks = []  # removable handles
        for m in module.modules():
            params = [(attr, p) for attr, p in m._parameters.items() if p is not None]
            if not isinstance(m, shard_types) or not params:
                continue
            for attr, p in params:
                if id(p) not in self._shards:
                    self._shards[id(p)] = _Shard(names[id(p)], p, self.rank, self.world)
                del m._parameters[attr]  # the module now sees a plain tensor, set by the hooks
                setattr(m, attr, self._shards[id(p)].outside)
            self._units[m] = [(attr, self._shards[id(p)]) for attr, p in params]
            self._hooks.append(
                m.register_state_dict_post_hook(
                    lambda mod, state, prefix, _, attrs=[a for a, _ in params]: _list_weights(mod, state, prefix, attrs)
                )
            )
        self.local_shards = nn.ParameterList([s.param for s in self._shards.values()])  # after .module: .parameters()
        self.replicated = [p for p in module.parameters() if p.requires_grad]  # what is left in the module
        self._by_name = {s.name: s for s in self._shards.values()}
        self.comm_log: list[tuple[str, int]] = []  # (op, bytes) per collective of the training steps
        self.clock = WaitClock()  # waits for collectives (CUDA events on a GPU: NCCL's wait() only orders streams)
        self.gathered_bytes = self.peak_gathered_bytes = 0  # bytes of gathered weights alive now, and the most so far
        self.prefetched = 0  # gathers started ahead of their module (overlapping the one before it)
        self._order: list[nn.Module] | None = None  # sharded modules in forward call order, from the first forward
        self._calls, self._prefetch, self._active, self._live = [], {}, [], []
        self._post_ids = {}  # sharded module -> id of its post-forward hook, moved last before each call
        for m in self._units:
            self._hooks.append(m.register_forward_pre_hook(self._pre_forward, with_kwargs=True))
            self._hooks.append(m.register_forward_hook(self._post_forward))
            self._post_ids[m] = self._hooks[-1].id

    @staticmethod
    def _check(module: nn.Module, compute_dtype, shard_types: tuple[type, ...]) -> torch.device:
        """Refuse what cannot work, with what to do instead; return the model's device."""
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(
                "FSDP needs torch.distributed initialised: run the code in a worker started by "
                "helpers.launch.launch(worker, world_size) (or under torchrun)"
            )
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be None, torch.float16 or torch.bfloat16, got {compute_dtype!r}")
        for name, p in module.named_parameters():
            if p.dtype != torch.float32:
                raise ValueError(
                    f"FSDP keeps fp32 master weights, but {name} is {p.dtype}: build the model in "
                    "float32 and pass compute_dtype= for lower-precision compute"
                )
        sharded = {id(p) for m in module.modules() if isinstance(m, shard_types) for p in m.parameters(recurse=False)}
        if not sharded:
            raise ValueError(
                f"FSDP found no parameters to shard: no {'/'.join(t.__name__ for t in shard_types)} "
                f"with parameters in this {type(module).__name__}; pass shard_types= with its layer types"
            )
        for m in module.modules():
            if not isinstance(m, shard_types) and any(id(p) in sharded for p in m.parameters(recurse=False)):
                raise ValueError(
                    f"a {type(m).__name__} shares a parameter with a sharded module; add "
                    f"{type(m).__name__} to shard_types so that every use of it is gathered"
                )
        return FSDP._check_device(module)

    @staticmethod
    def _check_device(module: nn.Module) -> torch.device:
        """The model's one device, if the process group's backend moves tensors there (NCCL: this rank's GPU)."""
        devices = {t.device for t in list(module.parameters()) + list(module.buffers())}
        if len(devices) > 1:
            raise ValueError(
                f"FSDP needs the whole model on one device, found {sorted(map(str, devices))}: "
                "move it with model.to(helpers.launch.device())"
            )
        device, backend = (devices.pop() if devices else torch.device("cpu")), str(dist.get_backend())
        moves = (
            {part.split(":")[0] for part in backend.split(",")}
            if ":" in backend
            else {"nccl": {"cuda"}}.get(backend, {"cpu", "cuda"})
        )
        if backend == "nccl" and device.type == "cuda" and device.index != torch.cuda.current_device():
            moves = set()  # NCCL works on the rank's current GPU
        if device.type not in moves:
            raise ValueError(
                f"the model is on {device}, where this rank's {backend} process group does not move "
                f"tensors: move it with model.to(helpers.launch.device())"
            )
        return device

    # ---- collectives, logged and timed ----

    def _start_gather(self, use: _Use, k: int) -> None:
        """Async all-gather of shard k of `use` into its flat buffer (re-allocated if freed)."""
        flat, shard = use.flats[k], use.params[k][1]
        if not use.gathered(k):
            flat.untyped_storage().resize_(flat.numel() * flat.element_size())
            self.gathered_bytes += flat.numel() * flat.element_size()
            self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)
        inp = shard.param.detach().to(flat.dtype)  # (padded/N,) cast before the gather: half the bytes in 16 bits
        self.comm_log.append(("all_gather", flat.numel() * flat.element_size()))
        use.handles.append((_all_gather(flat.data, inp, async_op=True), inp))  # .data: autograd sees no write

    def _gather(self, module: nn.Module) -> _Use:
        use = _Use(module, self._units[module], self._calls, self.compute_dtype or torch.float32)
        for k in range(len(use.params)):
            self._start_gather(use, k)
        self._live.append(use)
        return use

    def _free(self, use: _Use, k: int) -> None:
        if use.gathered(k):  # the tensors autograd saved keep their shape and lose their bytes until the next gather
            use.flats[k].untyped_storage().resize_(0)
            self.gathered_bytes -= use.flats[k].numel() * use.flats[k].element_size()

    @property
    def comm_s(self) -> float:
        """Seconds spent waiting for collectives (on a GPU: the time the stream waited, not the host)."""
        return self.clock.seconds

    def _device(self) -> torch.device:
        return self.local_shards[0].device if len(self.local_shards) else torch.device("cpu")

    def _wait(self, use: _Use, timed: bool = True) -> None:
        with self.clock.waiting(self._device()) if timed else contextlib.nullcontext():
            for handle, _ in use.handles:
                handle.wait()
        use.handles = []

    def _drop(self, use: _Use | None, timed: bool = True) -> None:
        """A prefetch nobody used (the call order changed): wait for it, free it."""
        if use is not None:
            self._wait(use, timed)
            for k in range(len(use.flats)):
                self._free(use, k)

    # ---- hooks ----

    def forward(self, *args, **kwargs):
        self._calls = []  # this forward's uses of sharded modules, in call order
        out = self.module(*args, **kwargs)
        if self._order is None:
            self._order = [use.module for use in self._calls]
        for use in self._prefetch.values():
            self._drop(use)
        self._prefetch = {}
        self._live = [u for u in self._live if u.needs_backward]  # the others are done (no_grad, eval)
        return out

    def _pre_forward(self, module, args, kwargs):
        module._forward_hooks.move_to_end(self._post_ids[module])  # free after the user's forward hooks have run
        i = len(self._calls)
        use = self._prefetch.pop(i, None)
        if use is None or use.module is not module:
            self._drop(use)
            use = self._gather(module)
        use.calls, use.index = self._calls, i
        self._calls.append(use)
        if self._order is not None and i + 1 < len(self._order) and i + 1 not in self._prefetch:
            self._prefetch[i + 1] = self._gather(self._order[i + 1])  # overlaps this module's compute
            self.prefetched += 1
        self._wait(use)
        grad = torch.is_grad_enabled()
        for k, (attr, shard) in enumerate(use.params):
            full = use.flats[k][: shard.numel].view(shard.shape).data  # (*shape,) a leaf of its own, same storage
            if grad and shard.param.requires_grad:
                full.requires_grad_(True)
                full.register_post_accumulate_grad_hook(lambda t, use=use, k=k: self._reduce_scatter_grad(use, k, t))
            use.fulls.append(full)
            setattr(module, attr, full)
        frozen = grad and not all(s.param.requires_grad for _, s in use.params)
        self._active.append(use)
        args = tuple(self._input(x, use, frozen) for x in args)
        return args, {k: self._input(v, use, frozen) for k, v in kwargs.items()}

    def _input(self, x, use: _Use, frozen: bool):
        """Cast a floating input to compute_dtype; with frozen weights, free them once the input's gradient is in."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return x
        x = x.to(self.compute_dtype) if self.compute_dtype is not None else x
        if frozen and x.requires_grad:
            x = x.view_as(x)  # an alias only this module consumes: its gradient means the module's backward is done
            x.register_hook(lambda _, use=use: self._free_frozen(use))
        return x

    def _post_forward(self, module, args, output):
        use = self._active.pop()
        for k, (attr, shard) in enumerate(use.params):
            self._free(use, k)
            setattr(module, attr, shard.outside)  # never the freed buffer: reading that would segfault
        outputs = list(output.values()) if isinstance(output, dict) else output
        for t in outputs if isinstance(outputs, (tuple, list)) else [outputs]:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                use.needs_backward = True
                t.register_hook(lambda _, use=use: self._pre_backward(use))

    def _pre_backward(self, use: _Use) -> None:
        if use.backward_seen:  # a second output of the same call
            return
        use.backward_seen = True
        if not use.handles:  # not prefetched
            for k in range(len(use.flats)):
                self._start_gather(use, k)
        nxt = next((u for u in reversed(use.calls[: use.index]) if u.needs_backward and not u.backward_seen), None)
        if nxt is not None and not nxt.handles:
            for k in range(len(nxt.flats)):
                self._start_gather(nxt, k)  # prefetch the module backward reaches next
            self.prefetched += 1
        self._wait(use)

    def _reduce_scatter_grad(self, use: _Use, k: int, full: torch.Tensor) -> None:
        shard = use.params[k][1]
        grad, full.grad = full.grad, None  # (*shape,) in compute dtype
        flat = torch.zeros(shard.padded, dtype=torch.float32, device=grad.device)  # (padded,)
        flat[: shard.numel] = grad.reshape(-1)
        flat.div_(self.world)  # mean over ranks
        out = torch.empty_like(shard.param)  # (padded/N,)
        self.comm_log.append(("reduce_scatter", flat.numel() * flat.element_size()))
        shard.pending.append((_reduce_scatter(out, flat, async_op=True), out, flat))
        self._free(use, k)

    def _free_frozen(self, use: _Use) -> None:
        for k, (_, shard) in enumerate(use.params):
            if not shard.param.requires_grad:
                self._free(use, k)

    # ---- end of step ----

    def finish_gradient_synchronization(self) -> None:
        """Wait for every reduce-scatter; all-reduce (mean) the replicated gradients; a missing gradient is zeros."""
        with self.clock.waiting(self._device()):
            self._finish()

    def _finish(self) -> None:
        for use in self._live:  # backward prefetches never used; frozen weights that no input gradient freed
            self._drop(use, timed=False)
        self._live, self._prefetch = [], {}
        for shard in self._shards.values():
            for handle, out, _ in shard.pending:
                handle.wait()
                shard.param.grad = out if shard.param.grad is None else shard.param.grad.add_(out)
            shard.pending = []
            if shard.param.requires_grad and shard.param.grad is None:
                shard.param.grad = torch.zeros_like(shard.param)
        if self.replicated:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.replicated]
            flat = torch.cat([g.reshape(-1) for g in grads]).div_(self.world)  # (replicated numel,)
            self.comm_log.append(("all_reduce", flat.numel() * flat.element_size()))
            with no_python_refs():
                dist.all_reduce(flat)
            for p, part in zip(self.replicated, flat.split([p.numel() for p in self.replicated])):
                p.grad = part.view_as(p).clone()

    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """{name: full fp32 tensor} for every parameter of .module (names as module.named_parameters() gave them
        before wrapping; a tied one once), on the model's device. A collective: call it on every rank."""
        return self._gather_all(lambda p: p.detach())

    def gather_full_grads(self) -> dict[str, torch.Tensor]:
        """The same for the gradients, after finish_gradient_synchronization (zeros where there is none)."""
        return self._gather_all(lambda p: p.grad if p.grad is not None else torch.zeros_like(p))

    @torch.no_grad()
    def _gather_all(self, value) -> dict[str, torch.Tensor]:
        replicated, out = dict(self.module.named_parameters()), {}
        for name in self.param_names:
            if name not in self._by_name:
                out[name] = value(replicated[name]).clone()
                continue
            shard = self._by_name[name]
            flat = torch.empty(shard.padded, dtype=torch.float32, device=shard.param.device)  # (padded,)
            _all_gather(flat, value(shard.param).float())
            out[name] = flat[: shard.numel].view(shard.shape).clone()  # (*shape,)
        return out
