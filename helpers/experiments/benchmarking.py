"""Notebook 01's experiments: a step's time per model size (with and without warm-up), its memory (tracked and
analytic), the dtypes autocast picks, and the steps the profiler watches.

    time_size("small/8", batch_size=4, context_length=128, warmup=3, steps=10)   # rows: forward, backward, both
    step_peaks("small/8", 4, 128)                   # {"forward": MemoryTrace, "full step": MemoryTrace}
    autocast_dtypes(MixedPrecisionToyModel(), x, y) # which dtype each tensor gets under autocast
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from helpers.experiments.common import train_step
from helpers.memory import MemoryTrace, model_state, track
from helpers.model import build_model, lm_loss, random_batch
from helpers.timing import benchmark


def forward_step(lm, x, autocast_dtype=None):
    """Forward pass only, no graph (inference), optionally under autocast."""
    ctx = torch.autocast(x.device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with torch.no_grad(), ctx:
        return lm(x)


def guarded(fn):
    """fn(), or the string "OOM" when the GPU runs out of memory (the cache is emptied so the run goes on)."""
    try:
        return fn()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return "OOM"


# --- timing one model per size (notebook 01) ----------------------------------------------------

def pass_fn(lm, x, y, kind: str, autocast_dtype=None):
    """A callable for one pass of `lm`: "forward" (building the graph), "backward" (re-run on one retained graph)
    or "both"; the forward runs under autocast when `autocast_dtype` is given."""
    def loss():
        ctx = torch.autocast(x.device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
        with ctx:
            return lm_loss(lm(x), y)

    if kind == "forward":
        return loss
    if kind == "backward":
        graph = loss()  # one graph: backward alone is timed
        return lambda: graph.backward(retain_graph=True)
    if kind == "both":
        return lambda: loss().backward()
    raise ValueError(f"kind={kind!r}: use 'forward', 'backward' or 'both'")


def time_size(size, batch_size: int, context_length: int, warmup: int, steps: int, device=None,
              kinds=("forward", "backward", "both"), autocast_dtype=None) -> list[dict]:
    """One row per pass of a freshly built model of `size`: timing stats and the first sample, or status "OOM"."""
    def run(kind):
        lm = build_model(size, device=device)
        x, y = random_batch(lm.cfg, batch_size, context_length, device=device)
        fn = pass_fn(lm, x, y, kind, autocast_dtype)
        return benchmark(fn, warmup=warmup, steps=steps, device=device, label=f"{size} {kind}")

    rows = []
    for kind in kinds:
        t = guarded(lambda: run(kind))
        row = {"size": size, "pass": kind, "warm-up": warmup,
               "precision": "fp32" if autocast_dtype is None else f"autocast {str(autocast_dtype)[6:]}"}
        row.update({"mean_s": None, "median_s": None, "std_s": None, "status": "OOM"} if t == "OOM" else
                   {**t.as_row(), "first_s": t.samples[0], "status": "ok"})
        rows.append(row)
    return rows


# --- memory of one step ---------------------------------------------------------------------------

def step_peaks(size, batch_size: int, context_length: int, autocast_dtype=None, device=None) -> dict[str, MemoryTrace]:
    """Traces of forward-only and of a steady-state training step (AdamW state exists) of a fresh model of `size`."""
    lm = build_model(size, device=device)
    opt = torch.optim.AdamW(lm.parameters())
    x, y = random_batch(lm.cfg, batch_size, context_length, device=device)
    train_step(lm, opt, x, y, autocast_dtype=autocast_dtype)  # creates the AdamW state
    lm.zero_grad(set_to_none=True)
    state = model_state(lm, opt, x, y)
    return {"forward": track(lambda: forward_step(lm, x, autocast_dtype), existing=state, device=device),
            "full step": track(lambda: train_step(lm, opt, x, y, autocast_dtype=autocast_dtype),
                               existing=state, device=device)}


# --- mixed precision: dtypes seen by hooks -------------------------------------------------------

class MixedPrecisionToyModel(nn.Module):
    """The handout's mixed-precision toy model: fc1 -> ReLU -> LayerNorm -> fc2."""

    def __init__(self, in_features: int = 10, out_features: int = 5):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.fc2(self.ln(self.relu(self.fc1(x))))


def autocast_dtypes(model: nn.Module, x, y, device_type: str = "cpu", dtype=torch.bfloat16) -> dict[str, str]:
    """Dtypes of parameters, fc1's output, the norm's output, logits, loss and grads under autocast, via hooks."""
    seen = {"parameters": str({p.dtype for p in model.parameters()}.pop())}
    hooks = [model.fc1.register_forward_hook(lambda m, i, o: seen.__setitem__("fc1 output", str(o.dtype))),
             model.ln.register_forward_hook(lambda m, i, o: seen.__setitem__("norm output", str(o.dtype)))]
    try:
        with torch.autocast(device_type, dtype=dtype):
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y)
        seen["logits"], seen["loss"] = str(logits.dtype), str(loss.dtype)
        loss.backward()
    finally:
        for h in hooks:
            h.remove()
    seen["gradients"] = str({p.grad.dtype for p in model.parameters()}.pop())
    return seen
