"""A student's collectives as they are called, watched in a checked rank: per call the op, bytes, dtype, async_op and
when it was launched relative to the step's backward (autograd hooks on the loss), so that the handout's rules about
how the code communicates (DDP's overlap, a bucket as one call; FSDP's reduce-scatter) are judged, not only what it
computes (helpers.course.yours.ddp.lm and .rules use it).

    with watch_calls() as calls:
        loss = model(x).sum()
        calls.backward_of(loss)            # the phase: "forward" until backward starts, "backward", then "after"
        loss.backward()
        ddp.finish_gradient_synchronization()
    [(c.op, c.nbytes, c.async_op, c.phase) for c in calls]
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

# name -> (op, position of the tensor, its keyword, position of async_op)
_WATCHED = {
    "all_reduce": ("all_reduce", 0, "tensor", 3),
    "all_reduce_coalesced": ("all_reduce", 0, "tensors", 3),
    "broadcast": ("broadcast", 0, "tensor", 3),
    "all_gather": ("all_gather", 0, "tensor_list", 3),
    "all_gather_into_tensor": ("all_gather", 0, "output_tensor", 3),
    "reduce_scatter": ("reduce_scatter", 1, "input_list", 4),
    "reduce_scatter_tensor": ("reduce_scatter", 1, "input", 4),
}


@dataclass
class Call:
    """One collective as called: its op, bytes (all-reduce/broadcast buffer, all-gather output, reduce-scatter
    input), dtype, whether it was asked to run asynchronously, and the phase of the step it was launched in."""

    op: str
    nbytes: int
    dtype: str
    async_op: bool
    phase: str  # "forward" (before backward starts), "backward" (inside it: from a hook), "after" (once it returned)
    ready: int = 0  # gradients accumulated (count_ready's hooks) when it was launched: calls sharing one came at once


class Calls(list):
    """The calls watched so far, and the step's phase, moved by autograd hooks on the loss (backward_of)."""

    phase = "forward"
    ready = 0

    def count_ready(self, params) -> list:
        """Count each parameter's gradient as it is accumulated (a hook registered after the code's own, so a call
        from the code's hook on a tensor sees the tensors before it); returns the handles to remove."""

        def one(_p):
            self.ready += 1

        self.ready = 0
        return [p.register_post_accumulate_grad_hook(one) for p in params if p.requires_grad]

    def backward_of(self, loss: torch.Tensor) -> None:
        """Mark backward's start (a hook on the loss's gradient: the first thing backward computes) and its end (a
        callback queued on the autograd engine: it runs when this backward returns)."""
        self.phase = "forward"

        def started(grad):
            self.phase = "backward"
            torch.autograd.Variable._execution_engine.queue_callback(self._ended)
            return grad

        loss.register_hook(started)

    def _ended(self) -> None:
        self.phase = "after"

    def of(self, op: str) -> list[Call]:
        return [c for c in self if c.op == op]


@contextlib.contextmanager
def watch_calls():
    """torch.distributed's collectives wrapped while active (module attributes: code that imported a collective by
    name before this runs is not seen); yields the Calls list."""
    calls, saved = Calls(), {}
    for name, (op, pos, key, async_pos) in _WATCHED.items():
        if not hasattr(dist, name):
            continue
        saved[name] = fn = getattr(dist, name)

        def watching(*args, _fn=fn, _op=op, _pos=pos, _key=key, _apos=async_pos, **kwargs):
            t = args[_pos] if len(args) > _pos else kwargs.get(_key)
            parts = [x for x in (t if isinstance(t, (list, tuple)) else [t]) if isinstance(x, torch.Tensor)]
            asked = args[_apos] if len(args) > _apos else kwargs.get("async_op", False)
            calls.append(
                Call(
                    _op,
                    sum(x.numel() * x.element_size() for x in parts),
                    str(parts[0].dtype).removeprefix("torch.") if parts else "?",
                    bool(asked),
                    calls.phase,
                    calls.ready,
                )
            )
            return _fn(*args, **kwargs)

        setattr(dist, name, watching)
    try:
        yield calls
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
