"""What notebook 07's FSDP experiments share: the dtypes and their eps, the loss scale, what is sharded, the learning
rate, the model builder, an FSDP implementation as the course's adapters call it (FsdpImpl, ours by default) and one
training step for any kind of data parallelism."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from helpers import launch as L
from helpers.fsdp import FSDP
from helpers.model import build_model, lm_loss

DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
EPS = {k: torch.finfo(v or torch.float32).eps for k, v in DTYPES.items()}
LOSS_SCALE = {"fp32": 1.0, "fp16": 2.0**10, "bf16": 1.0}  # a power of two (exact): keeps fp16 logit gradients out of
# subnormals; bf16 has fp32's range
SHARD_TYPES = (nn.Linear, nn.Embedding)
LR = 0.1


def build(name: str, n_layers=None, seed: int = 0, context_length=None) -> nn.Module:
    """A TransformerLM preset (optionally fewer/more layers, shorter context), seeded, on this rank's device."""
    torch.manual_seed(seed)
    overrides = {k: v for k, v in (("n_layers", n_layers), ("context_length", context_length)) if v is not None}
    return build_model(name, **overrides).to(L.device())


@dataclass(frozen=True)
class FsdpImpl:
    """An FSDP implementation as the course's adapters call it (ours by default): wrap(module, compute_dtype),
    on_after_backward(model, optimizer), gather_full_params(model) -> {name: full tensor}."""

    wrap: Callable = FSDP
    on_after_backward: Callable = lambda model, optimizer: model.finish_gradient_synchronization()  # noqa: E731
    gather_full_params: Callable = lambda model: model.gather_full_params()  # noqa: E731


class ImplSync:
    """An FsdpImpl's wrapped model behind the gradient-sync protocol `step` and train_step use."""

    def __init__(self, model, impl: FsdpImpl, optimizer=None):
        self.model, self.impl, self.optimizer = model, impl, optimizer

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def on_train_batch_start(self) -> None:
        """Nothing: the course's FSDP adapters have no such hook."""

    def finish_gradient_synchronization(self) -> None:
        self.impl.on_after_backward(self.model, self.optimizer)


def step(net, grad_sync, opt, x, y, optimizer_step: bool = True) -> None:
    """One training step for any kind: zero grads, forward, backward, wait for the gradients, optimizer step."""
    opt.zero_grad()
    if hasattr(grad_sync, "on_train_batch_start"):
        grad_sync.on_train_batch_start()
    lm_loss((grad_sync or net)(x), y).backward()
    if grad_sync is not None:
        grad_sync.finish_gradient_synchronization()
    if optimizer_step:
        opt.step()
