"""Communication shims and counting: one name per collective whatever the torch version, and a byte counter.

    run_collective("reduce_scatter", work, out)        # the four ops the notebooks time, result tensor back
    reduce_scatter(out, inp); all_gather(out, inp)     # torch's newer names where this torch has them
    with count_collectives() as log: train_step(...)   # [(op, bytes passed), ...]: nccl-tests' sizes

Counting patches torch.distributed's functions while active, so it sees every call made through them
(our wrappers and optimizers look the functions up at call time for this reason).
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def reduce_scatter(out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
    """Sum `inp` (N·S,) over ranks; this rank keeps its slice in `out` (S,). Looked up at call time (counting)."""
    return getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(out, inp, async_op=async_op)


def all_gather(out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
    """Concatenate every rank's `inp` (S,) into `out` (N·S,), in rank order."""
    return getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, inp, async_op=async_op)


def run_collective(op: str, work: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """Run one of OPS on `work` (all-gather and reduce-scatter write into `out`); return the tensor holding the result."""
    if op == "all_reduce":
        dist.all_reduce(work)
        return work
    if op == "all_gather":
        all_gather(out, work)
        return out
    if op == "reduce_scatter":
        reduce_scatter(out, work)
        return out
    if op == "broadcast":
        dist.broadcast(work, src=0)
        return work
    raise ValueError(f"unknown collective {op!r}; use one of {', '.join(OPS)}")


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
