"""What every notebook 05 run builds (helpers.experiments.sharding's shared floor): a model, its gradient sync and an
optimizer of one kind (unsharded, ShardedOptimizer, naive sharding, Zero1 or torch's ZeroRedundancyOptimizer), and the
forward/backward every worker times or measures.

    model, grad_sync, opt = build("sharded", "small/cpu")          # kinds: KINDS and "torch_zero"
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn as nn

# imported here, not in each rank (launch preloads it: 1 s a rank); it scripts its functional optimizers, whose
# TorchScript deprecation notices are torch's, not ours
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from torch.distributed.optim import ZeroRedundancyOptimizer

from helpers import ddp as D
from helpers import memory as M
from helpers.experiments.common import (
    make_model,
    train_step,
)
from helpers.sharding import NaiveShardedOptimizer, ShardedOptimizer, Zero1Optimizer, _rank_world

OPTIMIZERS = {
    "adamw": (torch.optim.AdamW, dict(lr=1e-3, weight_decay=0.1)),
    "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
}


KINDS = {
    "unsharded": None,
    "sharded": ShardedOptimizer,
    "naive_sharded": NaiveShardedOptimizer,
    "zero1": Zero1Optimizer,
}


def param_groups(model: nn.Module, groups: bool | str):
    """All parameters in one group, or two: matrices with weight decay, the rest without and at twice the lr."""
    params = list(model.parameters())
    if not groups:
        return params
    return [
        {"params": [p for p in params if p.dim() >= 2]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "lr": 2 * OPTIMIZERS["adamw"][1]["lr"]},
    ]


def build(
    kind: str,
    name: str,
    optimizer: str = "adamw",
    seed: int = 0,
    groups: bool | str = False,
    bucket_mb=25,
    impl: Callable | None = None,
):
    """(model, gradient sync or None, optimizer) for a kind in KINDS or "torch_zero", on this rank's device; with
    `impl` (called as KINDS' classes are: impl(params, optimizer_cls, **kwargs), e.g. a student's sharded optimizer)
    any kind name builds that implementation.
    groups: False (one group), True (two, see param_groups) or "late" (the second added by add_param_group).
    Every kind but zero1 averages gradients with the same DDPBucketed (same buckets, same all-reduce)."""
    model = make_model(name, seed)
    cls, kwargs = OPTIMIZERS[optimizer]
    grad_sync = D.DDPBucketed(model, bucket_mb) if _rank_world()[1] > 1 and kind != "zero1" else None
    params = param_groups(model, groups)
    late = params.pop() if groups == "late" else None
    if impl is not None:
        opt = impl(params, cls, **kwargs)
    elif kind == "torch_zero":
        opt = ZeroRedundancyOptimizer(params, cls, **kwargs)
    else:
        opt = KINDS[kind](params, cls, **kwargs) if KINDS[kind] else cls(params, **kwargs)
    if late is not None:
        opt.add_param_group(late)
    return model, grad_sync, opt


def forward_backward(model, grad_sync, opt, x, y) -> None:
    """Zero the gradients, forward, backward, average the gradients over ranks (Zero1 does that in step); the loss
    is dropped, so memory measured around this call holds no 4-byte loss."""
    train_step(model, opt, x, y, grad_sync=grad_sync, optimizer_step=False)


def optimizer_state_bytes(opt) -> int:
    """Bytes of optimizer state this rank holds, in every torch optimizer `opt` is or holds (torch's
    ZeroRedundancyOptimizer keeps it in .optim, a student's wrapper in one per shard): memory.optimizer_state_bytes."""
    return M.optimizer_state_bytes(opt)


def run_all(calls: list[Callable]) -> list:
    """[call() for call in calls]: several workers (functools.partial) in one launch (each launch costs seconds)."""
    return [call() for call in calls]
