"""Optimizer-state sharding by hand (notebook 05): ShardedOptimizer, the ZeRO-1 variant, bytes sent, memory calculator.

Runbook:

    ddp = DDPBucketed(model, 25)                                    # gradients averaged over ranks (helpers.ddp)
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)   # state only for this rank's share
    ...  loss.backward(); ddp.finish_gradient_synchronization(); opt.step()  # step() broadcasts the updated shares

    opt = Zero1Optimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)     # no DDP: it reduce-scatters itself
    opt.consolidate_state_dict(to=0); sd = opt.state_dict()         # ShardedOptimizer, on rank 0; loads at any N
    with count_collectives() as log: train_step(...)                # [(op, bytes passed), ...]
    zero_memory("xl", world_size=8, stage=1, precision="mixed")      # per-rank bytes, counted on the meta device

    python -m helpers bench sharding [--model small/8 --steps 30]   # vs torch's ZeroRedundancyOptimizer, gloo, 2 ranks

ShardedOptimizer assigns whole tensors to ranks, largest first to the least-loaded rank (balanced by bytes);
Zero1Optimizer cuts one flat buffer per param group into N equal slices, so each rank holds exactly 1/N of the state.
The models, training step and multi-rank workers that notebook 05 runs with them are in helpers.sharding_runs.
"""
from __future__ import annotations

import contextlib
import functools
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers import ddp as D
from helpers import launch as L
from helpers import memory as M
from helpers.model import build_model
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
        for full, loc in zip(self.param_groups, self.local.param_groups):
            loc.update({k: v for k, v in full.items() if k != "params"})

    def _timed_comm(self, fn) -> None:
        dev = self.param_groups[0]["params"][0].device if self.param_groups[0]["params"] else torch.device("cpu")
        sync(dev)
        start = time.perf_counter()
        fn()
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
        for p, r in zip(full["params"], partition_by_bytes(sizes, self.world, self.loads)):
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
                for p, view in zip(params, flat.split([p.numel() for p in params])):
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
            dist.broadcast(flat, src)

    def _index(self) -> dict:
        """Parameter -> position in torch's state_dict numbering (param groups in order, then parameters)."""
        return {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def _local_state(self) -> dict:
        """This rank's state keyed by global index, on the CPU."""
        index = self._index()
        return {index[p]: {k: v.detach().cpu().clone() if torch.is_tensor(v) else v for k, v in s.items()}
                for p, s in self.local.state.items()}

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
            raise RuntimeError("call consolidate_state_dict(to=r) on every rank after the last step, then state_dict() "
                               "on rank r")
        state = self._consolidated if self.world > 1 else self._local_state()
        index = self._index()
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[p] for p in g["params"]]}
                  for g in self.param_groups]
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a consolidated (or plain optimizer_cls) state dict saved at any world size; keep this rank's share."""
        saved_groups = state_dict["param_groups"]
        if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("the state dict's param groups do not match this optimizer's (sizes differ)")
        local_groups, local_state, i = [], {}, 0
        for full, saved in zip(self.param_groups, saved_groups):
            hyper = {k: v for k, v in saved.items() if k != "params"}
            full.update(hyper)
            ids = []
            for p, gi in zip(full["params"], saved["params"]):
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
                dist.broadcast(p.data, src)


def _reduce_scatter(out, inp):
    """Looked up at call time, so count_collectives sees it; the newer name where this torch has it."""
    return getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(out, inp)


def _all_gather(out, inp):
    return getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, inp)


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
            raise ValueError("Zero1Optimizer keeps one flat buffer per param group, so a group's parameters need one "
                             f"dtype and device; got {sorted({f'{p.dtype} on {p.device}' for p in params})}. "
                             "Put each kind in a param group of its own.")
        numel = sum(p.numel() for p in params)
        S = -(-numel // self.world)  # shard length, ceil(numel / N)
        like = params[0] if params else torch.empty(0)
        flat = torch.zeros(S * self.world, dtype=like.dtype, device=like.device)  # (N·S,)
        grad = torch.zeros_like(flat)  # (N·S,)
        with torch.no_grad():
            for p, v in zip(params, flat[:numel].split([p.numel() for p in params])):
                v.copy_(p.reshape(-1))
                p.data = v.view_as(p)
            if self.world > 1 and S:
                dist.broadcast(flat, 0)  # every rank starts from rank 0's parameters
        grad_views = [v.view_as(p) for p, v in zip(params, grad[:numel].split([p.numel() for p in params]))]
        shard = flat[self.rank * S:(self.rank + 1) * S]  # (S,) a view: updating it updates the parameters
        shard.grad = grad[self.rank * S:(self.rank + 1) * S]  # (S,)
        self.flats.append(dict(params=params, flat=flat, grad=grad, grad_views=grad_views, shard=shard))
        self._add_local_group(full, [shard])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the flat gradient buffers and make every gradient a view into them (set_to_none is ignored)."""
        for f in self.flats:
            f["grad"].zero_()
            for p, v in zip(f["params"], f["grad_views"]):
                p.grad = v

    def _step(self) -> None:
        if not all(_lives_in(p, f["flat"]) for f in self.flats for p in f["params"]):
            raise RuntimeError("a parameter no longer lives in Zero1Optimizer's flat buffer (model.to(), .half() or "
                               "a .data assignment after the optimizer was built); build the optimizer after "
                               "moving or casting the model")
        for f in self.flats:  # a gradient not in the buffer (zero_grad was skipped or bypassed): copy it in
            for p, v in zip(f["params"], f["grad_views"]):
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
                _reduce_scatter(f["shard"].grad, f["grad"])

    def _all_gather(self) -> None:
        for f in self.flats:
            if f["shard"].numel():
                _all_gather(f["flat"], f["shard"])


# ---- counting the bytes handed to collectives ----

_COUNTED = {"all_reduce": ("all_reduce", 0, "tensor"), "broadcast": ("broadcast", 0, "tensor"),
            "all_gather_into_tensor": ("all_gather", 0, "output_tensor"),
            "all_gather_single": ("all_gather", 0, "output"),
            "reduce_scatter_tensor": ("reduce_scatter", 1, "input"),
            "reduce_scatter_single": ("reduce_scatter", 1, "input")}


@contextlib.contextmanager
def count_collectives():
    """Record (op, bytes) for each collective called through torch.distributed while active: the all-reduce and
    broadcast buffer, the all-gather output, the reduce-scatter input (nccl-tests' sizes)."""
    log, saved = [], {}
    for name, (op, pos, key) in _COUNTED.items():
        if not hasattr(dist, name):
            continue
        saved[name] = fn = getattr(dist, name)

        def counting(*args, _fn=fn, _op=op, _pos=pos, _key=key, **kwargs):
            t = args[_pos] if len(args) > _pos else kwargs[_key]
            log.append((_op, t.numel() * t.element_size()))
            return _fn(*args, **kwargs)
        setattr(dist, name, counting)
    try:
        yield log
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def wire_factor(op: str, world_size: int) -> float:
    """Bytes each rank receives per byte passed (ring algorithms): all-reduce 2(N-1)/N, the others (N-1)/N."""
    return (2 if op == "all_reduce" else 1) * (world_size - 1) / world_size


def expected_collectives(kind: str, grad_bytes: int, world_size: int) -> dict[str, int]:
    """Analytic bytes passed to each collective per step (Ψ = grad_bytes; Zero1: Ψ padded to a multiple of N)."""
    return {"unsharded": {"all_reduce": grad_bytes}, "sharded": {"all_reduce": grad_bytes, "broadcast": grad_bytes},
            "zero1": {"reduce_scatter": grad_bytes, "all_gather": grad_bytes}}[kind]


# ---- the memory calculator (ZeRO paper, section 5: (2 + 2 + K)Ψ) ----

PRECISIONS = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}  # bytes per parameter: weights, gradients, Adam state (K)


@functools.lru_cache(maxsize=64)
def meta_sizes(model) -> tuple[int, ...]:
    """numel of each parameter of a model name / ModelConfig, built once on the meta device (nothing allocated)."""
    return tuple(p.numel() for p in build_model(model, device="meta").parameters())


def meta_numel(model) -> int:
    """Parameters of a model name / ModelConfig (counted on the meta device) or an nn.Module."""
    if isinstance(model, nn.Module):
        return sum(p.numel() for p in model.parameters())
    return sum(meta_sizes(model))


def zero_memory(model, world_size: int, stage: int, precision: str = "mixed") -> dict[str, float]:
    """Per-rank bytes of model states under ZeRO stage 0-3 with Adam: stage 1 shards the optimizer state,
    2 also the gradients, 3 also the weights. Communication: per-rank bytes received per step (2Ψ_g, stage 3 3Ψ_g)."""
    psi, N = meta_numel(model), world_size
    w, g, k = PRECISIONS[precision]
    out = {"parameters": w * psi / (N if stage >= 3 else 1), "gradients": g * psi / (N if stage >= 2 else 1),
           "optimizer state": k * psi / (N if stage >= 1 else 1)}
    out["total"] = sum(out.values())
    out["communication"] = (3 if stage == 3 else 2) * g * psi * (N - 1) / N
    return out


def zero_table(model="xl", world_size: int = 8, precision: str = "mixed"):
    """Per-rank GiB of model states and of traffic per step for ZeRO stages 0-3 (notebook 05's table and widget)."""
    import pandas as pd

    rows = [{"stage": s, **{k: v / 2**30 for k, v in zero_memory(model, world_size, s, precision).items()}}
            for s in range(4)]
    return pd.DataFrame(rows).set_index("stage").round(3)

# ---- analytic per-rank memory of our runs (checked against measurements in notebook 05 and the tests) ----

def state_bytes(kind: str, model_name, world_size: int, rank: int) -> int:
    """AdamW state this rank holds: exp_avg and exp_avg_sq (fp32) per owned element + a 4-byte step per owned tensor."""
    sizes = list(meta_sizes(model_name))
    if kind == "unsharded":
        owned = sizes
    elif kind in ("sharded", "naive_sharded"):
        owned = [s for s, r in zip(sizes, partition_by_bytes([4 * s for s in sizes], world_size)) if r == rank]
    else:
        owned = [-(-sum(sizes) // world_size)]
    return sum(8 * s + 4 for s in owned)


def live_bytes(kind: str, model_name, world_size: int, rank: int, batch_per_rank: int, context_length: int,
               point: str, step: int = 1) -> dict[str, int]:
    """What is live at 'after init' / 'before step' / 'after step' of step `step`: parameters and buffers,
    gradients (DDP buckets or Zero1's flat buffer, allocated when wrapping), optimizer state, token ids."""
    has_state = point == "after step" or step > 1
    psi = 4 * meta_numel(model_name)
    if kind == "zero1":
        psi = 4 * -(-meta_numel(model_name) // world_size) * world_size  # padded flat buffer
    return {"parameters": psi + M.buffer_bytes(model_name), "gradients": psi,
            "optimizer state": state_bytes(kind, model_name, world_size, rank) if has_state else 0,
            "other": 0 if point == "after init" else 2 * batch_per_rank * context_length * 8}


def bench_main(argv: list[str]) -> int:
    """`python -m helpers bench sharding`: ShardedOptimizer vs torch's ZeroRedundancyOptimizer, gloo, 2 ranks."""
    args = D.bench_parser("python -m helpers bench sharding").parse_args(argv)
    kinds = ["unsharded", "sharded", "torch_zero"]
    from helpers.sharding_runs import speed_worker, summarize_speed  # sharding_runs imports this module

    per_rank = L.launch(speed_worker, 2, args.model, kinds, args.steps, args.warmup, args.batch_size,
                        args.context_length, backend="gloo", device=args.device)
    rows = {r["kind"]: r for r in summarize_speed(per_rank)}
    ours, theirs = rows["sharded"], rows["torch_zero"]
    state = max(r["state_bytes"]["sharded"] / (r["state_bytes"]["unsharded"] / 2) for r in per_rank)
    same = all(all(r["same_weights"].values()) for r in per_rank)
    print(f"{args.model}, gloo on {args.device}, 2 ranks, {args.steps} interleaved steps (median of the slowest rank):")
    for k, r in rows.items():
        print(f"  {k:>10}: iteration {r['iteration_s'] * 1e3:.2f} ms, optimizer step {r['step_s'] * 1e3:.2f} ms "
              f"(communicating {r['step_comm_s'] * 1e3:.2f} ms)")
    print(f"ShardedOptimizer / ZeroRedundancyOptimizer: step {ours['step_s'] / theirs['step_s']:.3f}, iteration "
          f"{ours['iteration_s'] / theirs['iteration_s']:.3f} (target <= 1.05); per-rank state / (unsharded / 2): "
          f"{state:.4f} (target <= 1.02); identical weights in all three: {same}")
    return 0 if same else 1
