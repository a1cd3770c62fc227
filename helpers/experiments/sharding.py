"""Notebook 05's experiments with helpers.sharding: the workers launched on N ranks (equivalence, checkpoints,
memory at each point, speed), their summaries, the ZeRO table, and `python -m helpers bench sharding`. Ranks return,
the parent prints. The tests use them too.

    model, grad_sync, opt = build("sharded", "small/8")          # kinds: KINDS and "torch_zero"
    per_rank = launch(equivalence_worker, 2, "small/8", list(KINDS), 3, 8, 64)   # weights, state bytes, collectives
    per_rank = launch(run_all, 2, [(memory_worker, ("xl/8", ["unsharded", "sharded"], 8, 128, 2))])

    python -m helpers bench sharding [--model small/8 --steps 30]   # vs torch's ZeroRedundancyOptimizer, gloo, 2 ranks
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from helpers import ddp as D
from helpers import launch as L
from helpers import memory as M
from helpers.comm import count_collectives
from helpers.experiments.common import (bench_parser, cpu_state, make_batches, make_model, rank_share,
                                        run_interleaved, slowest_rank, train_step)
from helpers.formulas import GiB, zero_memory
from helpers.sharding import NaiveShardedOptimizer, ShardedOptimizer, Zero1Optimizer, _rank_world

OPTIMIZERS = {"adamw": (torch.optim.AdamW, dict(lr=1e-3, weight_decay=0.1)),
              "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9))}


KINDS = {"unsharded": None, "sharded": ShardedOptimizer, "naive_sharded": NaiveShardedOptimizer,
         "zero1": Zero1Optimizer}


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
    train_step(model, opt, x, y, grad_sync=grad_sync, optimizer_step=False)


def optimizer_state_bytes(opt) -> int:
    """Bytes of optimizer state this rank holds (torch's ZeroRedundancyOptimizer keeps it in .optim)."""
    state = getattr(opt, "optim", opt).state
    return sum(t.numel() * t.element_size() for s in state.values() for t in s.values() if torch.is_tensor(t))


def equivalence_worker(name, kinds, steps, batch_size, context_length, optimizer="adamw", groups=False) -> dict:
    """Train each kind on this rank's share of the same batches; return final weights, state bytes and, per step,
    the collectives' (op, bytes)."""
    out = {}
    for kind in kinds:
        model, grad_sync, opt = build(kind, name, optimizer, groups=groups)
        logs = []
        for batch in make_batches(name, steps, batch_size, context_length, 0):
            with count_collectives() as log:
                train_step(model, opt, *rank_share(batch), grad_sync=grad_sync)
            logs.append(log)
        out[kind] = {"weights": cpu_state(model), "state_bytes": optimizer_state_bytes(opt), "collectives": logs}
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
        train_step(model, opt, *rank_share(batch), grad_sync=grad_sync)
    opt.consolidate_state_dict(to=0)
    return {"state_dict": opt.state_dict() if _rank_world()[0] == 0 else None, "weights": cpu_state(model)}


def run_all(calls: list) -> list:
    """[fn(*args) for fn, args in calls]: several workers in one launch (each launch costs seconds of start-up)."""
    return [fn(*args) for fn, args in calls]


def memory_worker(name, kinds, batch_size, context_length, steps=1, optimizer="adamw") -> dict:
    """Per kind: bytes live and peak-so-far after init, before and after each optimizer step (helpers.memory.track),
    what is live after the last step by category, and how much the forward/backward peak exceeded its start."""
    dev, out = L.device(), {}
    x, y = rank_share(make_batches(name, 1, batch_size, context_length, 0)[0])
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
    runs = {k: build(k, name, optimizer) for k in kinds}
    batches = [rank_share(b) for b in make_batches(name, 4, batch_size, context_length, 0)]

    def step(kind):
        def one(i):
            model, grad_sync, opt = runs[kind]
            times = {}
            train_step(model, opt, *batches[i % len(batches)], grad_sync=grad_sync, times=times)
            return {k: times[k] for k in ("fwd_bwd", "grad_comm", "step", "step_comm")}
        return one

    samples = run_interleaved({k: step(k) for k in kinds}, steps, warmup)
    first = cpu_state(runs[kinds[0]][0])
    same = {k: all(torch.equal(first[n], v) for n, v in cpu_state(r[0]).items()) for k, r in runs.items()}
    return {"samples": samples, "state_bytes": {k: optimizer_state_bytes(r[2]) for k, r in runs.items()},
            "same_weights": same}


def summarize_speed(per_rank: list[dict]) -> list[dict]:
    """One row per kind: medians over steps of the slowest rank's seconds per iteration, in step(), and communicating
    in step() (each step waits for its slowest rank)."""
    rows = []
    for kind in per_rank[0]["samples"]:
        per = lambda key: slowest_rank([[s[key] for s in r["samples"][kind]] for r in per_rank])  # noqa: E731
        med = {k: float(np.median(per(k))) for k in ("fwd_bwd", "grad_comm", "step", "step_comm")}
        total = slowest_rank([[s["fwd_bwd"] + s["step"] for s in r["samples"][kind]] for r in per_rank])
        rows.append({"kind": kind, "iteration_s": float(np.median(total)), "fwd_bwd_s": med["fwd_bwd"],
                     "grad_comm_s": med["grad_comm"], "step_s": med["step"], "step_comm_s": med["step_comm"],
                     "steps": len(per_rank[0]["samples"][kind])})
    return rows


def zero_table(model="xl", world_size: int = 8, precision: str = "mixed"):
    """Per-rank GiB of model states and of traffic per step for ZeRO stages 0-3 (notebook 05's table and widget)."""
    import pandas as pd

    rows = [{"stage": s, **{k: v / GiB for k, v in zero_memory(model, world_size, s, precision).items()}}
            for s in range(4)]
    return pd.DataFrame(rows).set_index("stage").round(3)


def bench_main(argv: list[str]) -> int:
    """`python -m helpers bench sharding`: ShardedOptimizer vs torch's ZeroRedundancyOptimizer, gloo, 2 ranks."""
    args = bench_parser("python -m helpers bench sharding", bench_main.__doc__).parse_args(argv)
    kinds = ["unsharded", "sharded", "torch_zero"]
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
