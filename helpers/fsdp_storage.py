"""Where helpers.fsdp.FSDP keeps its bytes: each rank's flat fp32 shards, the gathered full weights of one module call
(allocated by the all-gather, freed by resizing their storage to zero), the reduce-scatters into the shards'
gradients, and ShardedWeight, what a sharded module's weight is between its forward and backward."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.comm import InFlight, all_gather, no_python_refs, reduce_scatter, wait_all
from helpers.fsdp_accounting import Accounting


def _all_gather(out, inp, async_op=False):
    """comm.all_gather with nothing Python in its work (launched from autograd hooks: comm.no_python_refs)."""
    with no_python_refs():
        return all_gather(out, inp, async_op=async_op)


def _reduce_scatter(out, inp, async_op=False):
    """comm.reduce_scatter, likewise."""
    with no_python_refs():
        return reduce_scatter(out, inp, async_op=async_op)


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


class Shard:
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


class Use:
    """One forward call of one sharded module: its gathered weights (padded flat buffers), alive between hooks.
    `calls` (that forward's uses, in call order) and `index` (this one's place in it) are set by the pre-forward
    hook."""

    def __init__(self, module: nn.Module, params: list[tuple[str, Shard]], dtype: torch.dtype):
        self.module, self.params, self.calls, self.index = module, params, [], 0
        self.flats = [torch.empty(s.padded, dtype=dtype, device=s.param.device) for _, s in params]  # (padded,)
        for flat in self.flats:
            flat.untyped_storage().resize_(0)  # allocated by the gather
        self.fulls, self.handles = [], []
        self.in_flight = InFlight()  # what this use's gathers were given, until the backend lets go (comm.InFlight)
        self.needs_backward = self.backward_seen = False

    def gathered(self, k: int) -> bool:
        return self.flats[k].untyped_storage().nbytes() > 0


def _list_weights(module: nn.Module, state_dict: dict, prefix: str, attrs: list[str]) -> None:
    """A sharded module's state_dict lists its weights as they stand outside forward (Shard.outside): on one
    rank the weights, on N ranks ShardedWeights, which torch.save and load_state_dict refuse with the way out."""
    for attr in attrs:
        state_dict.setdefault(prefix + attr, getattr(module, attr))


class ShardStore:
    """The sharded parameters of one model and their collectives: built by taking every parameter of a module of
    `shard_types` out of it (a tied one sharded once), gathered per Use, reduce-scattered into the shards' gradients;
    the parameters left in the model (`replicated`) are all-reduced."""

    def __init__(self, module: nn.Module, shard_types: tuple[type, ...], rank: int, world: int, account: Accounting):
        self.world, self.account = world, account
        self.scattering = InFlight()  # the reduce-scatters' tensors until the backend lets go (comm.InFlight)
        self.param_names = [name for name, _ in module.named_parameters()]  # gather_full_params' keys, tied once
        names = {id(p): name for name, p in module.named_parameters()}
        self.shards: dict[int, Shard] = {}  # id(parameter) -> its shard, a tied one once
        self.units: dict[nn.Module, list[tuple[str, Shard]]] = {}  # sharded module -> its (attribute, shard)s
        self.state_dict_hooks = []  # removable handles
        for m in module.modules():
            params = [(attr, p) for attr, p in m._parameters.items() if p is not None]
            if not isinstance(m, shard_types) or not params:
                continue
            for attr, p in params:
                if id(p) not in self.shards:
                    self.shards[id(p)] = Shard(names[id(p)], p, rank, world)
                del m._parameters[attr]  # the module now sees a plain tensor, set by the hooks
                setattr(m, attr, self.shards[id(p)].outside)
            self.units[m] = [(attr, self.shards[id(p)]) for attr, p in params]
            self.state_dict_hooks.append(
                m.register_state_dict_post_hook(
                    lambda mod, state, prefix, _, attrs=[a for a, _ in params]: _list_weights(mod, state, prefix, attrs)
                )
            )
        self.local_shards = nn.ParameterList([s.param for s in self.shards.values()])  # FSDP registers it
        self.replicated = [p for p in module.parameters() if p.requires_grad]  # what is left in the module
        self.by_name = {s.name: s for s in self.shards.values()}

    @property
    def device(self) -> torch.device:
        return self.local_shards[0].device if len(self.local_shards) else torch.device("cpu")

    def start_gather(self, use: Use, k: int) -> None:
        """Async all-gather of shard k of `use` into its flat buffer (re-allocated if freed)."""
        flat, shard = use.flats[k], use.params[k][1]
        if not use.gathered(k):
            flat.untyped_storage().resize_(flat.numel() * flat.element_size())
            self.account.allocated(flat)
        inp = shard.param.detach().to(flat.dtype)  # (padded/N,) cast before the gather: half the bytes in 16 bits
        self.account.collective("all_gather", flat)
        out = flat.data  # autograd sees no write
        use.in_flight.launching(out, inp)
        use.handles.append((_all_gather(out, inp, async_op=True), inp))

    def free(self, use: Use, k: int) -> None:
        if use.gathered(k):  # the tensors autograd saved keep their shape and lose their bytes until the next gather
            use.flats[k].untyped_storage().resize_(0)
            self.account.released(use.flats[k])

    def reduce_scatter(self, shard: Shard, grad: torch.Tensor) -> None:
        """Start the reduce-scatter of one use's gradient (*shape,) into the shard's: to fp32, padded, / N."""
        flat = torch.zeros(shard.padded, dtype=torch.float32, device=grad.device)  # (padded,)
        flat[: shard.numel] = grad.reshape(-1)
        flat.div_(self.world)  # mean over ranks
        out = torch.empty_like(shard.param)  # (padded/N,)
        self.account.collective("reduce_scatter", flat)
        self.scattering.launching(out, flat)
        shard.pending.append((_reduce_scatter(out, flat, async_op=True), out, flat))

    def wait_reduce_scatters(self) -> None:
        """Every shard's gradient: the sum of its reduce-scatters (a tied one has one per use); zeros if none. The
        backend lets go of them before any becomes a gradient (comm.InFlight)."""
        outs = {}
        for shard in self.shards.values():
            wait_all([handle for handle, _, _ in shard.pending])
            outs[shard] = [out for _, out, _ in shard.pending]
            shard.pending = []
        self.scattering.settle()
        for shard, parts in outs.items():
            for out in parts:
                shard.param.grad = out if shard.param.grad is None else shard.param.grad.add_(out)
            if shard.param.requires_grad and shard.param.grad is None:
                shard.param.grad = torch.zeros_like(shard.param)

    def all_reduce_replicated(self) -> None:
        """The mean over ranks of the replicated parameters' gradients, in one all-reduce (a missing one: zeros)."""
        if not self.replicated:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.replicated]
        flat = torch.cat([g.reshape(-1) for g in grads]).div_(self.world)  # (replicated numel,)
        self.account.collective("all_reduce", flat)
        flight = InFlight()
        flight.launching(flat)
        with no_python_refs():
            dist.all_reduce(flat)
        flight.settle()
        for p, part in zip(self.replicated, flat.split([p.numel() for p in self.replicated]), strict=True):
            p.grad = part.view_as(p).clone()

    @torch.no_grad()
    def gather_all(self, value, replicated: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """{name: full fp32 value(parameter)} for every parameter name, sharded ones all-gathered (a collective);
        `replicated`: the model's named_parameters() now (those it kept)."""
        out = {}
        for name in self.param_names:
            if name not in self.by_name:
                out[name] = value(replicated[name]).clone()
                continue
            shard = self.by_name[name]
            flat = torch.empty(shard.padded, dtype=torch.float32, device=shard.param.device)  # (padded,)
            inp, flight = value(shard.param).float(), InFlight()
            flight.launching(flat, inp)
            _all_gather(flat, inp)
            flight.settle()
            out[name] = flat[: shard.numel].view(shard.shape).clone()  # (*shape,)
        return out
