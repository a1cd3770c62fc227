"""The experiments notebook 05 runs with helpers.sharding: models, a training step with optional gradient sync, and
the workers launched on N ranks (equivalence, checkpoints, memory at each point, speed). Ranks return, the parent
prints. The tests and `bench sharding` use them too.

    model, grad_sync, opt = build("sharded", "small/8")          # kinds: KINDS and "torch_zero"
    per_rank = launch(equivalence_worker, 2, "small/8", list(KINDS), 3, 8, 64)   # weights, state bytes, collectives
    per_rank = launch(run_all, 2, [(memory_worker, ("xl/8", ["unsharded", "sharded"], 8, 128, 2))])
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn as nn

from helpers import ddp as D
from helpers import ddp_runs as DR
from helpers import launch as L
from helpers import memory as M
from helpers.model import lm_loss
from helpers.sharding import NaiveShardedOptimizer, ShardedOptimizer, Zero1Optimizer, _rank_world, count_collectives
from helpers.timing import sync

class UnevenToy(nn.Module):
    """ids (B, T) -> logits (B, T, 32) with odd-sized tensors (465 elements: no N > 1 divides them evenly)."""

    def __init__(self):
        super().__init__()
        self.emb, self.fc, self.norm = nn.Embedding(32, 5), nn.Linear(5, 7), nn.LayerNorm(7, bias=False)
        self.head = nn.Linear(7, 32)

    def forward(self, ids):
        return self.head(self.norm(torch.tanh(self.fc(self.emb(ids)))))  # (B, T, 32)


OPTIMIZERS = {"adamw": (torch.optim.AdamW, dict(lr=1e-3, weight_decay=0.1)),
              "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9))}


KINDS = {"unsharded": None, "sharded": ShardedOptimizer, "naive_sharded": NaiveShardedOptimizer,
         "zero1": Zero1Optimizer}


def make_model(name: str, seed: int) -> nn.Module:
    """"uneven" (UnevenToy), "toy" (helpers.ddp_runs.ToyModel) or a model size, on this rank's device."""
    if name != "uneven":
        return DR.make_model(name, seed)
    torch.manual_seed(seed)
    return UnevenToy().to(L.device())


def make_batches(name: str, steps: int, batch_size: int, context_length: int, seed: int = 0):
    """helpers.ddp_runs.make_batches; the toy models share a 32-token vocabulary."""
    return DR.make_batches("toy" if name == "uneven" else name, steps, batch_size, context_length, seed)


def param_groups(model: nn.Module, groups: bool | str):
    """All parameters in one group, or two: matrices with weight decay, the rest without and at twice the lr."""
    params = list(model.parameters())
    if not groups:
        return params
    return [{"params": [p for p in params if p.dim() >= 2]},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "lr": 2 * OPTIMIZERS["adamw"][1]["lr"]}]


def build(kind: str, name: str, optimizer: str = "adamw", seed: int = 0, groups: bool | str = False, bucket_mb=25):
    """(model, gradient sync or None, optimizer) for a kind in KINDS or "torch_zero", on this rank's device.
    groups: False (one group), True (two, see param_groups) or "late" (the second added by add_param_group)."""
    model = make_model(name, seed)
    cls, kwargs = OPTIMIZERS[optimizer]
    grad_sync = D.DDPBucketed(model, bucket_mb) if _rank_world()[1] > 1 and kind != "zero1" else None
    params = param_groups(model, groups)
    late = params.pop() if groups == "late" else None
    if kind == "torch_zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(params, cls, **kwargs)
    else:
        opt = KINDS[kind](params, cls, **kwargs) if KINDS[kind] else cls(params, **kwargs)
    if late is not None:
        opt.add_param_group(late)
    return model, grad_sync, opt


def forward_backward(model, grad_sync, opt, x, y) -> None:
    """Zero the gradients, forward, backward, and average the gradients over ranks (Zero1 does that in step)."""
    opt.zero_grad(set_to_none=True)
    if grad_sync is not None:
        grad_sync.on_train_batch_start()
    lm_loss(model(x), y).backward()
    if grad_sync is not None:
        grad_sync.finish_gradient_synchronization()


def train_step(model, grad_sync, opt, x, y, times: dict | None = None) -> None:
    """One step; `times` gets seconds of forward+backward+gradient sync, of waiting for the gradient all-reduce,
    of step() and of communication inside step()."""
    dev, grad_comm0 = x.device, getattr(grad_sync, "comm_s", 0.0)
    sync(dev)
    t0 = time.perf_counter()
    forward_backward(model, grad_sync, opt, x, y)
    sync(dev)
    t1, comm0 = time.perf_counter(), getattr(opt, "comm_s", 0.0)
    opt.step()
    sync(dev)
    if times is not None:
        times.update(fwd_bwd=t1 - t0, grad_comm=getattr(grad_sync, "comm_s", 0.0) - grad_comm0,
                     step=time.perf_counter() - t1, step_comm=getattr(opt, "comm_s", 0.0) - comm0)


def optimizer_state_bytes(opt) -> int:
    """Bytes of optimizer state this rank holds (torch's ZeroRedundancyOptimizer keeps it in .optim)."""
    state = getattr(opt, "optim", opt).state
    return sum(t.numel() * t.element_size() for s in state.values() for t in s.values() if torch.is_tensor(t))


def _share(batch, dev):
    rank, world = _rank_world()
    n = batch[0].shape[0]
    return tuple(t[rank * n // world:(rank + 1) * n // world].clone().to(dev) for t in batch)  # own storage


def equivalence_worker(name, kinds, steps, batch_size, context_length, optimizer="adamw", groups=False) -> dict:
    """Train each kind on this rank's share of the same batches; return final weights, state bytes and, per step,
    the collectives' (op, bytes)."""
    out = {}
    for kind in kinds:
        model, grad_sync, opt = build(kind, name, optimizer, groups=groups)
        logs = []
        for batch in make_batches(name, steps, batch_size, context_length, 0):
            with count_collectives() as log:
                train_step(model, grad_sync, opt, *_share(batch, L.device()))
            logs.append(log)
        out[kind] = {"weights": DR.cpu_state(model), "state_bytes": optimizer_state_bytes(opt), "collectives": logs}
    return out


def checkpoint_worker(name, steps, batch_size, context_length, resume=None, start=0, optimizer="adamw",
                      groups=True) -> dict:
    """ShardedOptimizer training on batches start..start+steps, from `resume` ({"weights", "state_dict"}) if given;
    returns the weights and, from rank 0, the consolidated state dict."""
    model, grad_sync, opt = build("sharded", name, optimizer, groups=groups)
    if resume is not None:
        model.load_state_dict(resume["weights"])
        opt.load_state_dict(resume["state_dict"])
    for batch in make_batches(name, start + steps, batch_size, context_length, 0)[start:]:
        train_step(model, grad_sync, opt, *_share(batch, L.device()))
    opt.consolidate_state_dict(to=0)
    return {"state_dict": opt.state_dict() if _rank_world()[0] == 0 else None, "weights": DR.cpu_state(model)}


def run_all(calls: list) -> list:
    """[fn(*args) for fn, args in calls]: several workers in one launch (each launch costs seconds of start-up)."""
    return [fn(*args) for fn, args in calls]


def memory_worker(name, kinds, batch_size, context_length, steps=1, optimizer="adamw") -> dict:
    """Per kind: bytes live and peak-so-far after init, before and after each optimizer step (helpers.memory.track),
    what is live after the last step by category, and how much the forward/backward peak exceeded its start."""
    dev, out = L.device(), {}
    x, y = _share(make_batches(name, 1, batch_size, context_length, 0)[0], dev)
    for kind in kinds:
        init = M.track(lambda: build(kind, name, optimizer), device=dev)
        model, grad_sync, opt = init.result
        init.result = None
        rows, peak = [{"point": "after init", "step": 0, "live": init.current_bytes, "peak": init.peak_bytes,
                       "allocator_peak": init.allocator_peak_bytes}], init.peak_bytes

        def live():
            inner = [p.grad for g in getattr(opt, "local", opt).param_groups for p in g["params"]]
            buckets = getattr(grad_sync, "bucket_buffers", [])  # gradient storage, also while the grads are None
            return M.model_state(model, opt, x, y) + [p.grad for p in model.parameters()] + inner + buckets

        for step in range(1, steps + 1):
            for point, fn in (("before step", lambda: forward_backward(model, grad_sync, opt, x, y)),
                              ("after step", opt.step)):
                trace = M.track(fn, existing=live(), device=dev)
                peak = max(peak, trace.peak_bytes)
                rows.append({"point": point, "step": step, "live": trace.current_bytes, "peak": peak,
                             "phase_start": trace.baseline_bytes, "phase_peak": trace.peak_bytes,
                             "allocator_peak": trace.allocator_peak_bytes})
        params = list(model.parameters()) + list(model.buffers())
        grads = [p.grad for p in model.parameters()] + [p.grad for g in getattr(opt, "local", opt).param_groups
                                                         for p in g["params"]]
        state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
        parts = {k: _storage_bytes(v, exclude) for k, v, exclude in
                 (("parameters", params, []), ("gradients", grads, params), ("optimizer state", state, params + grads))}
        out[kind] = {"rows": rows, "parts": parts}
        del model, grad_sync, opt
    return out


def _storage_bytes(tensors, exclude=()) -> int:
    """Bytes of the distinct storages behind `tensors`, leaving out those already behind `exclude`."""
    key = lambda t: (str(t.device), t.untyped_storage().data_ptr())
    seen = {key(t) for t in exclude if torch.is_tensor(t)}
    total = 0
    for t in tensors:
        if torch.is_tensor(t) and key(t) not in seen:
            seen.add(key(t))
            total += t.untyped_storage().nbytes()
    return total


def speed_worker(name, kinds, steps, warmup, batch_size, context_length, optimizer="adamw") -> dict:
    """Time every kind step by step, interleaved (the order alternates), from the same weights on the same batches."""
    dev, runs = L.device(), {k: build(k, name, optimizer) for k in kinds}
    batches = make_batches(name, 4, batch_size, context_length, 0)
    samples = {k: [] for k in kinds}
    for i in range(warmup + steps):
        x, y = _share(batches[i % len(batches)], dev)
        for kind in (kinds if i % 2 == 0 else kinds[::-1]):
            times = {}
            train_step(*runs[kind], x, y, times)
            if i >= warmup:
                samples[kind].append(times)
    first = DR.cpu_state(runs[kinds[0]][0])
    same = {k: all(torch.equal(first[n], v) for n, v in DR.cpu_state(r[0]).items()) for k, r in runs.items()}
    return {"samples": samples, "state_bytes": {k: optimizer_state_bytes(r[2]) for k, r in runs.items()},
            "same_weights": same}


def summarize_speed(per_rank: list[dict]) -> list[dict]:
    """One row per kind: the slowest rank's median seconds per iteration, in step(), and communicating in step()."""
    rows = []
    for kind in per_rank[0]["samples"]:
        med = {k: max(statistics.median(s[k] for s in r["samples"][kind]) for r in per_rank)
               for k in ("fwd_bwd", "grad_comm", "step", "step_comm")}
        total = max(statistics.median(s["fwd_bwd"] + s["step"] for s in r["samples"][kind]) for r in per_rank)
        rows.append({"kind": kind, "iteration_s": total, "fwd_bwd_s": med["fwd_bwd"], "grad_comm_s": med["grad_comm"],
                     "step_s": med["step"],
                     "step_comm_s": med["step_comm"], "steps": len(per_rank[0]["samples"][kind])})
    return rows
