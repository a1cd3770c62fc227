"""Optimizer-state sharding by hand (notebook 05): ShardedOptimizer (whole tensors per rank) and ZeRO-1 (flat slices).

Runbook:

    ddp = DDPBucketed(model, 25)                                    # gradients averaged over ranks (helpers.ddp)
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)   # state only for this rank's share
    ...  loss.backward(); ddp.finish_gradient_synchronization(); opt.step()  # step() broadcasts the updated shares

    opt = Zero1Optimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)     # no DDP: it reduce-scatters itself
    opt.consolidate_state_dict(to=0); sd = opt.state_dict()         # ShardedOptimizer, on rank 0; loads at any N

ShardedOptimizer assigns whole tensors to ranks, largest first to the least-loaded rank (balanced by bytes);
Zero1Optimizer cuts one flat buffer per param group into N equal slices, so each rank holds exactly 1/N of the state.
Their memory and bytes in closed form are in helpers.formulas; the workers notebook 05 runs with them, and
`python -m helpers bench sharding`, in helpers.experiments.sharding.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from helpers.comm import InFlight, all_gather, no_python_refs, reduce_scatter
from helpers.timing import sync


def _rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def partition_by_count(n_tensors: int, world_size: int) -> list[int]:
    """The naive split: consecutive runs of equally many tensors per rank, whatever their sizes."""
    return [min(i * world_size // max(n_tensors, 1), world_size - 1) for i in range(n_tensors)]


def partition_by_bytes(sizes: list[int], world_size: int, loads: list[int] | None = None) -> list[int]:
    """Owner rank per tensor: largest first, each to the least-loaded rank (ties: lowest rank); updates `loads`."""
    loads = loads if loads is not None else [0] * world_size
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        owner[i] = min(range(world_size), key=lambda r: (loads[r], r))
        loads[owner[i]] += sizes[i]
    return owner


def _lives_in(p: torch.Tensor, flat: torch.Tensor) -> bool:
    """True while `p` is still a view into `flat` (model.to() and friends give parameters new storage)."""
    return p.device == flat.device and p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()


class _Sharded(torch.optim.Optimizer):
    """What both sharded optimizers share: a full view of the param groups, an inner optimizer for this rank's share."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world = _rank_world()
        self.optimizer_cls, self.local, self.comm_s = optimizer_cls, None, 0.0
        self.in_flight = InFlight()  # what the collectives were given, held until the backend lets go (comm.InFlight)
        super().__init__(params, kwargs)
        self.state = self.local.state  # only this rank's share has state

    def _add_local_group(self, full: dict, mine: list) -> None:
        group = {**full, "params": mine}
        if self.local is None:
            self.local = self.optimizer_cls([group], **self.defaults)
        else:
            self.local.add_param_group(group)
        for k, v in self.local.param_groups[-1].items():  # the inner optimizer's defaults show in the full group too
            full.setdefault(k, v)

    @torch.no_grad()
    def step(self, closure=None):
        """Run the closure (if any), copy the hyperparameters into the inner optimizer, then the sharded update."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_hyperparameters()
        self._step()
        return loss

    def _step(self) -> None:
        raise NotImplementedError

    def _sync_hyperparameters(self) -> None:
        """Copy lr etc. from the full groups (what schedulers change) into the inner optimizer's groups."""
        for full, loc in zip(self.param_groups, self.local.param_groups, strict=True):
            loc.update({k: v for k, v in full.items() if k != "params"})

    def _timed_comm(self, fn) -> None:
        dev = self.param_groups[0]["params"][0].device if self.param_groups[0]["params"] else torch.device("cpu")
        sync(dev)
        start = time.perf_counter()
        with no_python_refs():  # step() may run under saved-tensor hooks or in a hook: see helpers.comm
            fn()
        self.in_flight.settle()
        sync(dev)
        self.comm_s += time.perf_counter() - start


class ShardedOptimizer(_Sharded):
    """Optimizer-state sharding over whole tensors: after the gradients are averaged (e.g. helpers.ddp), each rank
    steps only the parameters it owns, then every owner broadcasts its updated parameters as one flat buffer.
    The trainable parameters become views into those buffers (one per owner), so nothing is packed or copied."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.owner, self.loads, self._consolidated = {}, None, None
        super().__init__(params, optimizer_cls, **kwargs)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        full = self.param_groups[-1]
        self.loads = self.loads or [0] * self.world
        sizes = [p.numel() * p.element_size() if p.requires_grad else 0 for p in full["params"]]  # frozen: no state
        for p, r in zip(full["params"], partition_by_bytes(sizes, self.world, self.loads), strict=True):
            self.owner[p] = r
        self._add_local_group(full, [p for p in full["params"] if self.owner[p] == self.rank])
        self._plan()

    def _plan(self) -> None:
        """One flat buffer per (owner, dtype, device) holding the trainable parameters that rank owns, in registration
        order; the parameters become views into it, so each broadcast sends and receives in place (no packing)."""
        buckets = {}
        for p in (p for g in self.param_groups for p in g["params"] if p.requires_grad):
            buckets.setdefault((self.owner[p], p.dtype, p.device), []).append(p)
        self._buckets = []
        for (src, dtype, device), params in sorted(buckets.items(), key=lambda kv: kv[0][0]):
            flat = torch.empty(sum(p.numel() for p in params), dtype=dtype, device=device)  # (numel of src's params,)
            with torch.no_grad():
                for p, view in zip(params, flat.split([p.numel() for p in params]), strict=True):
                    view.copy_(p.reshape(-1))
                    p.data = view.view_as(p)  # the old storage is freed here, one tensor at a time
            self._buckets.append((src, params, flat))

    def _step(self) -> None:
        self._consolidated = None
        if not all(_lives_in(p, flat) for _, params, flat in self._buckets for p in params):
            self._plan()  # model.to(), .half() etc. gave some parameters new storage: pack them again
        self.local.step()
        if self.world > 1:
            self._timed_comm(self._broadcast)

    def _broadcast(self) -> None:
        """Each owner broadcasts its flat buffer; the others receive straight into their parameters' storage."""
        for src, _, flat in self._buckets:
            self.in_flight.launching(flat)
            dist.broadcast(flat, src)

    def _index(self) -> dict:
        """Parameter -> position in torch's state_dict numbering (param groups in order, then parameters)."""
        return {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def _local_state(self) -> dict:
        """This rank's state keyed by global index, on the CPU."""
        index = self._index()
        return {
            index[p]: {k: v.detach().cpu().clone() if torch.is_tensor(v) else v for k, v in s.items()}
            for p, s in self.local.state.items()
        }

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Collective (every rank calls it): gather all ranks' state on rank `to`; its state_dict() then has it all."""
        parts = [None] * self.world if self.rank == to else None
        if self.world == 1:
            parts = [self._local_state()]
        else:
            dist.gather_object(self._local_state(), parts, dst=to)
        self._consolidated = {k: v for part in parts for k, v in part.items()} if parts is not None else None

    def state_dict(self) -> dict:
        """The whole optimizer's state in torch's format (loadable by optimizer_cls and at any world size)."""
        if self.world > 1 and self._consolidated is None:
            raise RuntimeError(
                "call consolidate_state_dict(to=r) on every rank after the last step, then state_dict() on rank r"
            )
        state = self._consolidated if self.world > 1 else self._local_state()
        index = self._index()
        groups = [
            {**{k: v for k, v in g.items() if k != "params"}, "params": [index[p] for p in g["params"]]}
            for g in self.param_groups
        ]
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a consolidated (or plain optimizer_cls) state dict saved at any world size; keep this rank's share."""
        saved_groups = state_dict["param_groups"]
        if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("the state dict's param groups do not match this optimizer's (sizes differ)")
        local_groups, local_state, i = [], {}, 0
        for full, saved in zip(self.param_groups, saved_groups, strict=True):
            hyper = {k: v for k, v in saved.items() if k != "params"}
            full.update(hyper)
            ids = []
            for p, gi in zip(full["params"], saved["params"], strict=True):
                if self.owner[p] == self.rank:
                    if gi in state_dict["state"]:
                        local_state[i] = state_dict["state"][gi]
                    ids.append(i)
                    i += 1
            local_groups.append({**hyper, "params": ids})
        self.local.load_state_dict({"state": local_state, "param_groups": local_groups})
        self.state = self.local.state


class NaiveShardedOptimizer(ShardedOptimizer):
    """The baseline beside it: one blocking broadcast per parameter tensor (one start-up cost per tensor)."""

    def _broadcast(self) -> None:
        for src, params, _ in self._buckets:
            for p in params:
                data = p.data  # an alias of its own: held until the backend lets go
                self.in_flight.launching(data)
                dist.broadcast(data, src)


class Zero1Optimizer(_Sharded):
    """ZeRO stage 1 (P_os) as in the paper: per param group one flat parameter and one flat gradient buffer, padded
    to a multiple of N; rank r owns elements [r·S, (r+1)·S). step(): reduce-scatter the gradients (mean) in place,
    update the slice, all-gather the parameters in place. It averages gradients itself: use it without DDP.
    Parameters become views into the flat buffer; zero_grad() zeros the gradient buffer (grads stay views into it);
    after step() only this rank's slice of the gradients is the mean over ranks."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.flats = []
        super().__init__(params, optimizer_cls, **kwargs)
        self.zero_grad()

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        full = self.param_groups[-1]
        params = [p for p in full["params"] if p.requires_grad]  # frozen ones stay out: never updated
        if len({(p.dtype, p.device) for p in params}) > 1:
            raise ValueError(
                "Zero1Optimizer keeps one flat buffer per param group, so a group's parameters need one "
                f"dtype and device; got {sorted({f'{p.dtype} on {p.device}' for p in params})}. "
                "Put each kind in a param group of its own."
            )
        numel = sum(p.numel() for p in params)
        S = -(-numel // self.world)  # shard length, ceil(numel / N)
        like = params[0] if params else torch.empty(0)
        flat = torch.zeros(S * self.world, dtype=like.dtype, device=like.device)  # (N·S,)
        grad = torch.zeros_like(flat)  # (N·S,)
        with torch.no_grad():
            for p, v in zip(params, flat[:numel].split([p.numel() for p in params]), strict=True):
                v.copy_(p.reshape(-1))
                p.data = v.view_as(p)
            if self.world > 1 and S:
                self.in_flight.launching(flat)
                with no_python_refs():
                    dist.broadcast(flat, 0)  # every rank starts from rank 0's parameters
                self.in_flight.settle()
        grad_views = [
            v.view_as(p) for p, v in zip(params, grad[:numel].split([p.numel() for p in params]), strict=True)
        ]
        shard = flat[self.rank * S : (self.rank + 1) * S]  # (S,) a view: updating it updates the parameters
        shard.grad = grad[self.rank * S : (self.rank + 1) * S]  # (S,)
        self.flats.append(dict(params=params, flat=flat, grad=grad, grad_views=grad_views, shard=shard))
        self._add_local_group(full, [shard])

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero the flat gradient buffers; every gradient stays a view into them, so backward accumulates in place and
        the reduce-scatter reads them with no copy (hence the default False). set_to_none=True drops the gradients
        instead: backward then allocates fresh ones, copied into the buffer by step() (one more Ψ of bytes until
        then)."""
        for f in self.flats:
            f["grad"].zero_()
            for p, v in zip(f["params"], f["grad_views"], strict=True):
                p.grad = None if set_to_none else v

    def _step(self) -> None:
        if not all(_lives_in(p, f["flat"]) for f in self.flats for p in f["params"]):
            raise RuntimeError(
                "a parameter no longer lives in Zero1Optimizer's flat buffer (model.to(), .half() or "
                "a .data assignment after the optimizer was built); build the optimizer after "
                "moving or casting the model"
            )
        for f in self.flats:  # a gradient not in the buffer (zero_grad was skipped or bypassed): copy it in
            for p, v in zip(f["params"], f["grad_views"], strict=True):
                if p.grad is None:
                    v.zero_()
                elif p.grad.data_ptr() != v.data_ptr():
                    v.copy_(p.grad)
                p.grad = v
        if self.world > 1:
            self._timed_comm(self._reduce_scatter)
        self.local.step()
        if self.world > 1:
            self._timed_comm(self._all_gather)

    def _reduce_scatter(self) -> None:
        for f in self.flats:
            if f["shard"].numel():
                f["grad"].div_(self.world)  # as helpers.ddp: divide, then sum over ranks
                self.in_flight.launching(f["shard"].grad, f["grad"])
                reduce_scatter(f["shard"].grad, f["grad"])

    def _all_gather(self) -> None:
        for f in self.flats:
            if f["shard"].numel():
                self.in_flight.launching(f["flat"], f["shard"])
                all_gather(f["flat"], f["shard"])
