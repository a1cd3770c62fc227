"""What several experiments share: toy models, model and batch builders, each rank's share of a batch, one training
step, the slowest-rank summary and the bench commands' argument parser.

    model = make_model("toy", seed=0)                   # "toy" | "uneven" | a helpers.model size, on this rank's device
    batches = make_batches("toy", steps=3, batch_size=8, context_length=6, seed=0)   # the same on every rank
    x, y = rank_share(batches[0])                       # this rank's rows (own storage), on its device
    train_step(model, opt, x, y, grad_sync=ddp, times=t)   # one step; t gets the phases' seconds
    slowest_rank([rank0_samples, rank1_samples])        # per step: the slowest rank's time
    config = name_models(PROFILES["cpu"], ("sizes", "sweep_model"), "2026")   # "small/cpu" -> "small-2026/cpu"
"""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from helpers import launch as L
from helpers import results
from helpers.model import build_model, for_edition, lm_loss, random_batch, size_edition
from helpers.timing import sync

TOY_VOCAB = 32  # both toy models' vocabulary
BACKWARD_RANGE = "backward (train_step)"  # record_function range around loss.backward(); a label to the profiler tables


class TiedToyModel(nn.Module):
    """ids (B, T) -> logits (B, T, vocab): tied embedding/head, a frozen Linear, an unused Parameter, a buffer.
    Every way a data-parallel wrapper can get a parameter wrong, in 5 tensors (notebook 04)."""

    def __init__(self, vocab: int = TOY_VOCAB, d: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.fc = nn.Linear(d, d)
        self.frozen = nn.Linear(d, d, bias=False).requires_grad_(False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied: one Parameter in two modules
        self.unused = nn.Parameter(torch.randn(d))  # never in forward: gets no gradient
        self.register_buffer("scale", torch.rand(d))  # differs per rank until broadcast

    def forward(self, ids):
        h = torch.tanh(self.fc(self.emb(ids))) * self.scale  # (B, T, d)
        return self.head(self.frozen(h))  # (B, T, vocab)


class UnevenToyModel(nn.Module):
    """ids (B, T) -> logits (B, T, vocab) with odd-sized tensors (465 elements: no N > 1 divides them evenly)."""

    def __init__(self, vocab: int = TOY_VOCAB):
        super().__init__()
        self.emb, self.fc, self.norm = nn.Embedding(vocab, 5), nn.Linear(5, 7), nn.LayerNorm(7, bias=False)
        self.head = nn.Linear(7, vocab)

    def forward(self, ids):
        return self.head(self.norm(torch.tanh(self.fc(self.emb(ids)))))  # (B, T, vocab)


TOY_MODELS = {"toy": TiedToyModel, "uneven": UnevenToyModel}


def make_model(name: str, seed: int) -> nn.Module:
    """A toy model ("toy", "uneven") or a helpers.model size, built with torch seeded by `seed`, on this rank's
    device."""
    torch.manual_seed(seed)
    model = TOY_MODELS[name]() if name in TOY_MODELS else build_model(name)
    return model.to(L.device())


def make_batches(name: str, steps: int, batch_size: int, context_length: int, seed: int = 0):
    """`steps` global (inputs, targets) batches of token ids for model `name`, the same on every rank."""
    gen = torch.Generator().manual_seed(seed + 1)
    out = []
    for _ in range(steps):
        if name in TOY_MODELS:
            tokens = torch.randint(TOY_VOCAB, (batch_size, context_length + 1), generator=gen)  # (B, T+1)
            out.append((tokens[:, :-1], tokens[:, 1:]))
        else:
            out.append(random_batch(name, batch_size, context_length, generator=gen))
    return out


def rank_share(batch, device=None) -> tuple[torch.Tensor, ...]:
    """This rank's consecutive rows of every tensor in `batch` (own storage), on its device; all rows outside a
    group."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    rows = rank_rows(batch[0].shape[0], rank, world)
    return tuple(t[rows].clone().to(device or L.device()) for t in batch)


def rank_rows(n: int, rank: int, world: int) -> slice:
    """The consecutive rows of n that rank_share gives `rank` of `world`."""
    return slice(rank * n // world, (rank + 1) * n // world)


def variant_runs(cfg, field: str, values, device="cpu", batch_size: int = 2) -> dict:
    """value -> (logits, loss, {name: grad}) of the model `cfg` built with `field=value` (a norm, an attention...),
    same seed and same batch for every value: what notebooks 02 and 06 compare implementations inside the model with."""
    x, y = random_batch(cfg, batch_size, generator=torch.Generator().manual_seed(0))
    out = {}
    for value in values:
        torch.manual_seed(0)
        model = build_model(cfg, device=device, **{field: value})
        logits = model(x.to(device))
        loss = lm_loss(logits, y.to(device))
        loss.backward()
        out[value] = logits.detach(), loss.detach(), {n: p.grad for n, p in model.named_parameters()}
    return out


def cpu_state(model: nn.Module) -> dict:
    """A copy of model.state_dict() on the CPU: what workers return to the parent for comparison."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def make_optimizer(params, name: str):
    """SGD (lr 0.1) or AdamW (lr 1e-3): what notebook 04's equivalence, speed and bench runs train with."""
    return torch.optim.SGD(params, lr=0.1) if name == "sgd" else torch.optim.AdamW(params, lr=1e-3)


def train_step(
    model,
    optimizer,
    x,
    y,
    grad_sync=None,
    autocast_dtype=None,
    optimizer_step: bool = True,
    times: dict | None = None,
    device_backward: bool = False,
) -> torch.Tensor:
    """One training step: zero grads, forward (through `grad_sync`, a DDP wrapper, when given), backward, gradient
    sync, optimizer step. Returns the loss (detached). `times` gets the backward's (start, end) perf_counter pair and
    seconds of forward+backward+sync ('fwd_bwd'), of waiting for the gradient sync ('grad_comm'), of step() ('step')
    and of communication inside step() ('step_comm'); the device is synchronized at each boundary when it is asked.
    device_backward: also synchronize right before and after backward, so the host's pair is when the device ran it
    (on a GPU the host returns from backward() once its kernels are queued): what spans on the host clock (gloo's,
    on CUDA tensors too) are measured against."""
    dev = x.device
    grad_comm0, step_comm0 = getattr(grad_sync, "comm_s", 0.0), getattr(optimizer, "comm_s", 0.0)
    if times is not None:
        sync(dev)
    t0 = time.perf_counter()
    optimizer.zero_grad()  # each optimizer's default: torch's set to None, Zero1Optimizer's zero its flat buffer
    if grad_sync is not None:
        grad_sync.on_train_batch_start()
    ctx = torch.autocast(dev.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with ctx:
        loss = lm_loss((grad_sync or model)(x), y)
    events = (
        [torch.cuda.Event(enable_timing=True) for _ in range(2)] if times is not None and dev.type == "cuda" else []
    )
    if device_backward:
        sync(dev)
    b0 = time.perf_counter()
    if events:
        events[0].record()
    with record_function(BACKWARD_RANGE):  # what a profiler trace finds (notebook 04)
        loss.backward()
    if device_backward:
        sync(dev)
    b1 = time.perf_counter()
    if events:
        events[1].record()  # where the device ends backward (the host returns from it earlier)
    if grad_sync is not None:
        grad_sync.finish_gradient_synchronization()
    if times is not None:
        sync(dev)
    t1 = time.perf_counter()
    if optimizer_step:
        optimizer.step()
    if times is not None:
        sync(dev)
        times.update(
            backward=(b0, b1),
            backward_events=tuple(events),
            fwd_bwd=t1 - t0,
            step=time.perf_counter() - t1,
            grad_comm=getattr(grad_sync, "comm_s", 0.0) - grad_comm0,
            step_comm=getattr(optimizer, "comm_s", 0.0) - step_comm0,
        )
    return loss.detach()


def slowest_rank(per_rank: list) -> np.ndarray:
    """Per step (or call), the slowest rank's seconds: (ranks, steps) -> (steps,). A synchronized step waits for it."""
    return np.max(np.asarray(per_rank, dtype=float), axis=0)


def quartiles(values) -> tuple[float, float, float]:
    """(p25, median, p75) of `values`."""
    p25, p50, p75 = np.percentile(np.asarray(values, dtype=float), [25, 50, 75])
    return float(p25), float(p50), float(p75)


def bench_parser(prog: str, description: str = "") -> argparse.ArgumentParser:
    """The options the 2-rank training benchmarks share (bench ddp, bench sharding): model, steps, batch, device."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--model", default="small/cpu")
    parser.add_argument("--steps", type=positive_int, default=30)
    parser.add_argument("--warmup", type=nonnegative_int, default=5)
    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument("--context-length", type=positive_int, default=64)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cpu | cuda (gloo either way)")
    return parser


def positive_int(text: str) -> int:
    """argparse type: an int >= 1, else a one-line usage error."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def nonnegative_int(text: str) -> int:
    """argparse type: an int >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def log_ticks(ax, values, axis: str = "x") -> None:
    """Ticks of a log axis at the measured `values` only, labelled plainly (256, 512; not 3×10²): notebooks 02, 06."""
    from matplotlib.ticker import NullLocator

    if axis not in ("x", "y"):
        raise ValueError(f"axis must be 'x' or 'y', got {axis!r}")
    values = sorted({float(v) for v in values})
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_ticks(values, [f"{v:.0f}" if v.is_integer() else f"{v:g}" for v in values])
    target.set_minor_locator(NullLocator())


# ---- the multi-rank notebooks' setting: their models named by edition, results saved with it ----


def name_models(config: dict, keys, edition: str) -> dict:
    """`config` with the model sizes under `keys` (a name, a list of names, or None) named as `edition`'s Table 1
    names them (model.for_edition: "xl/cpu" -> "xl-2026/cpu")."""

    def named(v):
        if v is None:
            return None
        return [for_edition(m, edition) for m in v] if isinstance(v, list) else for_edition(v, edition)

    return {k: named(v) if k in keys else v for k, v in config.items()}


@dataclass
class RankSetting:
    """Where a multi-rank notebook runs: the profile, the ranks' backend and device, its config (with the model sizes
    under MODEL_KEYS), the time budget and the caption every table carries. save() adds the provenance every saved
    result shares, the edition whose model ran included (the answers page says which, per edition)."""

    MODEL_KEYS: ClassVar[tuple[str, ...]] = ()

    profile: str
    backend: str
    device: str
    config: dict
    budget: object  # helpers.budget.Budget
    where: str

    @property
    def edition(self) -> str:
        """The edition whose Table 1 names this config's models (its first named model's, model.size_edition)."""
        first = next((v for k in self.MODEL_KEYS if (v := self.config.get(k))), None)
        return size_edition(first[0] if isinstance(first, list) else first or "")

    def save(self, rows, name: str, **extra):
        """results.save_results with the profile, the backend and the edition."""
        return results.save_results(
            rows, name, profile=self.profile, backend=self.backend, edition=self.edition, **extra
        )
