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

The parts, one module each: helpers.fsdp_storage (shards, gathered buffers, ShardedWeight, the collectives on them),
helpers.fsdp_hooks (when to gather, free and reduce-scatter), helpers.fsdp_accounting (bytes and counters). FSDP's
_gather, _start_gather and _free are the one path every gather and free takes: a subclass may wrap them (as
helpers.experiments.fsdp_measure.TrackedFSDP does for the memory tracker).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.comm import InFlight, no_python_refs
from helpers.fsdp_accounting import Accounting
from helpers.fsdp_hooks import GatherHooks
from helpers.fsdp_storage import Shard, ShardedWeight, ShardStore, Use

__all__ = ["FSDP", "ShardedWeight", "Shard", "Use", "bytes_sent", "fsdp_bytes_per_step", "ddp_bytes_per_step"]

COMPUTE_DTYPES = (None, torch.float16, torch.bfloat16)


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


def check_model(module: nn.Module, compute_dtype, shard_types: tuple[type, ...]) -> torch.device:
    """Refuse what FSDP cannot wrap, with what to do instead; return the model's device."""
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
    return model_device(module)


def model_device(module: nn.Module) -> torch.device:
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
        self.device = check_model(module, compute_dtype, shard_types)
        self.module, self.compute_dtype = module, compute_dtype
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        flight = InFlight()
        with torch.no_grad(), no_python_refs():  # ranks may start from different weights: rank 0's win
            for t in list(module.parameters()) + list(module.buffers()):
                flight.launching(t)
                dist.broadcast(t, src=0)
        flight.settle()
        self.account = Accounting()
        self.store = ShardStore(module, shard_types, self.rank, self.world, self.account)
        self.local_shards = self.store.local_shards  # after .module: .parameters() lists the model's first
        self.replicated = self.store.replicated  # the trainable parameters left in the model, whole on every rank
        self.param_names = self.store.param_names  # gather_full_params' keys, tied once
        self.hooks = GatherHooks(
            self.store,
            self.account,
            compute_dtype,
            gather=self._gather,
            start_gather=self._start_gather,
            free=self._free,
        )

    # ---- what a step reads: the counters (helpers.fsdp_accounting) and the call order ----

    @property
    def comm_log(self) -> list[tuple[str, int]]:
        """(op, bytes) per collective of the training steps."""
        return self.account.comm_log

    @property
    def comm_s(self) -> float:
        """Seconds spent waiting for collectives (on a GPU: the time the stream waited, not the host)."""
        return self.account.clock.seconds

    @property
    def gathered_bytes(self) -> int:
        """Bytes of gathered weights alive now."""
        return self.account.gathered_bytes

    @property
    def peak_gathered_bytes(self) -> int:
        """The most bytes of gathered weights alive at once so far."""
        return self.account.peak_gathered_bytes

    @property
    def prefetched(self) -> int:
        """Gathers started ahead of their module (overlapping the one before it)."""
        return self.account.prefetched

    @property
    def units(self) -> dict[nn.Module, list[tuple[str, Shard]]]:
        """Sharded module -> its (attribute, Shard)s."""
        return self.store.units

    @property
    def call_order(self) -> list[nn.Module] | None:
        """The sharded modules in forward call order (None before the first forward)."""
        return self.hooks.order

    # ---- every gather and free goes through these (a subclass may wrap them) ----

    def _gather(self, module: nn.Module) -> Use:
        """A Use of `module` with its all-gathers started."""
        use = Use(module, self.store.units[module], self.compute_dtype or torch.float32)
        for k in range(len(use.params)):
            self._start_gather(use, k)
        return use

    def _start_gather(self, use: Use, k: int) -> None:
        self.store.start_gather(use, k)

    def _free(self, use: Use, k: int) -> None:
        self.store.free(use, k)

    # ---- a step ----

    def forward(self, *args, **kwargs):
        self.hooks.start_forward()
        out = self.module(*args, **kwargs)
        self.hooks.end_forward()
        return out

    def finish_gradient_synchronization(self) -> None:
        """Wait for every reduce-scatter; all-reduce (mean) the replicated gradients; a missing gradient is zeros."""
        with self.account.clock.waiting(self.store.device):
            self.hooks.drop_live()
            self.store.wait_reduce_scatters()
            self.store.all_reduce_replicated()

    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """{name: full fp32 tensor} for every parameter of .module (names as module.named_parameters() gave them
        before wrapping; a tied one once), on the model's device. A collective: call it on every rank."""
        return self.store.gather_all(lambda p: p.detach(), dict(self.module.named_parameters()))

    def gather_full_grads(self) -> dict[str, torch.Tensor]:
        """The same for the gradients, after finish_gradient_synchronization (zeros where there is none)."""
        return self.store.gather_all(
            lambda p: p.grad if p.grad is not None else torch.zeros_like(p), dict(self.module.named_parameters())
        )
