"""Pipeline parallelism by hand: the model's blocks cut into p stages over p ranks, micro-batches passed on with
send/recv, GPipe and 1F1B schedules, each rank's timeline recorded (notebook 08).

Runbook (inside a worker started by helpers.launch.launch, every rank with the same full model and batch):

    stage = PipelineStage(full_model, rank, world)       # this rank's blocks (+ embeddings first, + head last)
    actions = schedule("1f1b", stages=world, micro_batches=8, stage=rank)   # [("F", 0), ("F", 1), ("B", 0), ...]
    timeline = run_schedule(stage, actions, x, y, micro_batches=8)   # gradients accumulate in stage's parameters
    timeline  # [(kind, micro_batch, start_s, end_s), ...] of this rank's compute, from a common start

GPipe (Huang et al., 2019): every micro-batch's forward, then every backward; a stage holds all m micro-batches'
activations at once. 1F1B (PipeDream-Flush, Narayanan et al., 2021, §2.2): stage s runs p − s − 1 warm-up forwards,
then alternates one forward and one backward, so it holds at most p − s micro-batches. Both leave each rank idle for
p − 1 forward+backward slots of a step of m + p − 1: the bubble (p − 1) / (m + p − 1). The loss of each micro-batch is
divided by m, so the accumulated gradients are those of the whole batch's mean loss.

Sends are non-blocking (isend, waited at the end of the step) and receives blocking: a rank waits only for data
its schedule needs, and as both schedules respect the dependencies no two ranks wait on each other.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch import Tensor

from helpers.comm import InFlight, wait_all
from helpers.model import lm_loss
from helpers.timing import sync

SCHEDULES = ("gpipe", "1f1b")


def check_pipeline(n_layers: int, stages: int, micro_batches: int, batch_size: int) -> None:
    """Raise a ValueError naming the constraint when the model or the batch cannot be cut (before any rank starts)."""
    if n_layers % stages:
        raise ValueError(f"{stages} pipeline stages need n_layers ({n_layers}) divisible by {stages}")
    if micro_batches < stages:
        raise ValueError(
            f"{micro_batches} micro-batches cannot fill {stages} stages: use at least {stages} (the bubble is "
            f"(p − 1)/(m + p − 1), so m ≫ p keeps it small)"
        )
    if batch_size % micro_batches:
        raise ValueError(f"batch_size ({batch_size}) must be divisible by the {micro_batches} micro-batches")


class PipelineStage(nn.Module):
    """Blocks [s·L/p, (s+1)·L/p) of a TransformerLM, with its embeddings on the first stage and its final norm and
    LM head on the last. Parameter names are the full model's, so gradients compare name by name."""

    def __init__(self, model: nn.Module, stage: int, stages: int):
        super().__init__()
        per = model.cfg.n_layers // stages
        self.stage, self.stages, self.first, self.last = stage, stages, stage == 0, stage == stages - 1
        self.blocks = nn.ModuleDict(
            {str(i): copy.deepcopy(model.blocks[i]) for i in range(stage * per, (stage + 1) * per)}
        )
        if self.first:
            self.tok_emb, self.pos_emb = copy.deepcopy(model.tok_emb), copy.deepcopy(model.pos_emb)
        if self.last:
            self.norm_f, self.lm_head = copy.deepcopy(model.norm_f), copy.deepcopy(model.lm_head)

    def forward(self, x: Tensor) -> Tensor:
        if self.first:  # x: token ids (b, T)
            x = self.tok_emb(x) + self.pos_emb(torch.arange(x.shape[1], device=x.device))  # (b, T, C)
        for block in self.blocks.values():
            x = block(x)  # (b, T, C)
        return self.lm_head(self.norm_f(x)) if self.last else x  # (b, T, V) or (b, T, C)


class _Wait(torch.autograd.Function):
    """Identity that takes a fixed time: `forward_s` in forward, `backward_s` in backward (a stage of known cost)."""

    @staticmethod
    def forward(ctx, x, forward_s, backward_s):
        ctx.backward_s = backward_s
        time.sleep(forward_s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.backward_s)
        return grad, None, None


class FixedCostStage(nn.Module):
    """A PipelineStage whose forward takes `forward_s` more and backward `backward_s` more, in sleep: equal stages
    whatever else runs on the machine, so the measured idle share is the schedule's own (the formula's assumption)."""

    def __init__(self, stage: PipelineStage, forward_s: float, backward_s: float):
        super().__init__()
        self.inner, self.forward_s, self.backward_s = stage, forward_s, backward_s
        self.stage, self.stages, self.first, self.last = stage.stage, stage.stages, stage.first, stage.last

    def forward(self, x: Tensor) -> Tensor:
        return _Wait.apply(self.inner(x), self.forward_s, self.backward_s)


def schedule(kind: str, stages: int, micro_batches: int, stage: int) -> list[tuple[str, int]]:
    """Stage `stage`'s order of forward ("F", i) and backward ("B", i) passes over micro-batches 0..m-1."""
    m = micro_batches
    if kind == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if kind == "1f1b":
        warm = min(stages - stage - 1, m)
        out = [("F", i) for i in range(warm)]
        for i in range(m - warm):  # steady state: one forward, one backward
            out += [("F", warm + i), ("B", i)]
        return out + [("B", i) for i in range(m - warm, m)]
    raise ValueError(f"unknown schedule {kind!r}; expected one of {', '.join(SCHEDULES)}")


def staged(t: Tensor) -> Tensor:
    """`t` itself, or a CPU copy where the backend is gloo and `t` is on a GPU (gloo's send/recv take CPU tensors;
    one GPU shared by two ranks runs gloo, notebook 08's gpu profile on one device)."""
    return t.cpu() if t.is_cuda and dist.get_backend() == "gloo" else t


class _Channel:
    """send/recv between neighbouring stages: sends non-blocking (kept until the step ends), receives blocking."""

    def __init__(self):
        self.pending = []

    def send(self, t: Tensor, to: int) -> None:
        self._let_go(lambda h: h.is_completed())  # delivered buffers go, once gloo's threads let go of them too
        t = staged(t).contiguous()
        flight = InFlight()
        flight.launching(t)
        self.pending.append((dist.isend(t, to), flight))

    def _let_go(self, done) -> None:
        """Wait for the sends `done` picks, drop their works, then wait until the backend let go of their buffers."""
        flags = [done(handle) for handle, _ in self.pending]
        finished = [item for item, flag in zip(self.pending, flags, strict=True) if flag]
        self.pending = [item for item, flag in zip(self.pending, flags, strict=True) if not flag]
        flights = [flight for _, flight in finished]
        wait_all([handle for handle, _ in finished])
        del finished  # no name keeps a work (and through it a buffer) alive
        for flight in flights:
            flight.settle()

    def recv(self, shape, dtype, device, frm: int) -> Tensor:
        t = torch.empty(shape, dtype=dtype, device=device)
        buf = staged(t)
        flight = InFlight()
        flight.launching(buf)
        dist.recv(buf, frm)
        flight.settle()
        return t.copy_(buf) if buf is not t else t

    def finish(self) -> None:
        self._let_go(lambda h: True)


def run_schedule(stage: PipelineStage, actions, x: Tensor, y: Tensor, micro_batches: int, width: int) -> list:
    """Run one step's `actions` on this rank's stage; x, y are the whole batch (b·m, T). Returns this rank's compute
    timeline [(kind, micro_batch, start_s, end_s)], receives excluded (they are the waiting), on time.perf_counter's
    clock: CLOCK_MONOTONIC, one clock for every process of a machine (not across nodes)."""
    xs, ys = x.chunk(micro_batches), y.chunk(micro_batches)
    act_shape = (xs[0].shape[0], xs[0].shape[1], width)
    rank, chan, held, timeline = stage.stage, _Channel(), {}, []
    dist.barrier()
    for kind, i in actions:
        if kind == "F":
            inp = xs[i] if stage.first else chan.recv(act_shape, torch.float32, x.device, rank - 1).requires_grad_()
            start = time.perf_counter()
            out = stage(inp)
            if stage.last:
                out = lm_loss(out, ys[i]) / micro_batches  # the whole batch's mean, summed over micro-batches
            held[i], send = (inp, out), None if stage.last else (out.detach(), rank + 1)
        else:
            grad = None if stage.last else chan.recv(act_shape, torch.float32, x.device, rank + 1)
            start = time.perf_counter()
            inp, out = held.pop(i)
            out.backward(grad)
            send = None if stage.first else (inp.grad, rank - 1)
        sync(x.device)
        timeline.append((kind, i, start, time.perf_counter()))  # stamped before the send: a neighbour starts after
        if send is not None:
            chan.send(*send)
    chan.finish()
    return timeline


def replay(timelines: list[list], durations=None, latency: float = 0.0) -> list[list]:
    """The timelines the schedules give by their dependencies alone: each rank's passes in its own order, each
    starting when its rank is free and its input has arrived, `latency` seconds after it was sent (F i after the
    stage before finished F i, B i after the stage after finished B i), lasting what it took (or durations[kind]
    seconds: equal stages, where every rank's idle share is (p − 1)/(m + p − 1))."""
    p = len(timelines)
    out, ends, pos = [[] for _ in range(p)], {}, [0] * p
    while any(pos[r] < len(timelines[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pos[r] < len(timelines[r]):
                k, i, s, e = timelines[r][pos[r]]
                dep = (r - 1 if k == "F" else r + 1, k, i)
                if 0 <= dep[0] < p and dep not in ends:
                    break
                start = max(out[r][-1][3] if out[r] else 0.0, ends[dep] + latency if dep in ends else 0.0)
                end = start + (durations[k] if durations else e - s)
                out[r].append((k, i, start, end))
                ends[(r, k, i)], pos[r], moved = end, pos[r] + 1, True
        if not moved:
            raise ValueError("the timelines' passes wait on each other: not a pipeline schedule")
    return out


def handoff_latency(timelines: list[list]) -> float:
    """Median seconds from a neighbour finishing micro-batch i's pass to this rank starting its own on it, over the
    handoffs where this rank was idle waiting for it: send, receive and waking up (0.0 when there is none)."""
    ends = [{(k, i): e for k, i, _, e in t} for t in timelines]
    waits = []
    for rank, line in enumerate(timelines):
        for j, (k, i, s, _) in enumerate(line):
            frm = rank - 1 if k == "F" else rank + 1
            if 0 <= frm < len(timelines):
                ready = max(ends[frm][(k, i)], line[j - 1][3] if j else -float("inf"))
                if ready == ends[frm][(k, i)]:
                    waits.append(s - ready)
    return float(sorted(waits)[len(waits) // 2]) if waits else 0.0


def bubble_of(timelines: list[list]) -> list[float]:
    """Each rank's idle share of the step: 1 − its compute time / the step's span (first start to last end over
    every rank)."""
    span = max(t[-1][3] for t in timelines) - min(t[0][2] for t in timelines)
    return [1 - sum(e - s for _, _, s, e in t) / span for t in timelines]
