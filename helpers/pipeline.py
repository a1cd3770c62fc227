"""Pipeline parallelism by hand: the model's blocks cut into p stages over p ranks, micro-batches passed on with
send/recv, GPipe and 1F1B schedules, each rank's timeline recorded (notebook 08).

Runbook (inside a worker started by helpers.launch.launch, every rank with the same full model and batch):

    stage = PipelineStage(full_model, rank, world)       # this rank's blocks (+ embeddings first, + head last)
    actions = schedule("1f1b", stages=world, micro_batches=8, stage=rank)   # [("F", 0, 0), ("F", 1, 0), ...]
    timeline = run_schedule(stage, actions, x, y, micro_batches=8, width=C)   # gradients accumulate in the stage
    timeline  # [(kind, micro_batch, chunk, start_s, end_s), ...] of this rank's compute, from a common start

    stage = PipelineStage(full_model, rank, world, chunks=2)   # interleaved: blocks of virtual stages r and p + r
    actions = schedule("interleaved", world, 8, rank, chunks=2)

GPipe (Huang et al., 2019): every micro-batch's forward, then every backward; a stage holds all m micro-batches'
activations at once. 1F1B (PipeDream-Flush, Narayanan et al., 2021, §2.2): stage s runs p − s − 1 warm-up forwards,
then alternates one forward and one backward, so it holds at most p − s micro-batches. Both leave each rank idle for
p − 1 forward+backward slots of a step of m + p − 1: the bubble (p − 1) / (m + p − 1). The loss of each micro-batch is
divided by m, so the accumulated gradients are those of the whole batch's mean loss.

Interleaved 1F1B (Narayanan et al., 2021, §2.2.1; Megatron-LM's schedule with virtual stages): the layers are cut
into p·v chunks and rank r holds v of them, virtual stages r, p + r, ..., so a micro-batch passes every rank v times.
Each pass is 1/v as long, and the warm-up and cool-down, still p − 1 passes on the way in and out, shrink with it:
the bubble is (p − 1) / (v·m + p − 1), for v times as many sends. The schedule takes micro-batches in groups of p per
chunk, so m must be a multiple of p.

Sends are non-blocking (isend, waited at the end of the step) and receives blocking: a rank waits only for data
its schedule needs, and as the schedules respect the dependencies no two ranks wait on each other. Between two
ranks, messages arrive in the order they were sent (one queue per direction, activations and gradients alike): every
schedule here receives in the order its neighbour sends (tests/test_pipeline.py checks each).
"""

from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch import Tensor

from helpers import timing
from helpers.comm import InFlight, wait_all
from helpers.model import lm_loss

SCHEDULES = ("gpipe", "1f1b", "interleaved")


def check_pipeline(n_layers: int, stages: int, micro_batches: int, batch_size: int, chunks: int = 1) -> None:
    """Raise a ValueError naming the constraint when the model or the batch cannot be cut (before any rank starts);
    chunks > 1: also for the interleaved schedule with `chunks` virtual stages per rank."""
    if n_layers % stages:
        raise ValueError(f"{stages} pipeline stages need n_layers ({n_layers}) divisible by {stages}")
    if micro_batches < stages:
        raise ValueError(
            f"{micro_batches} micro-batches cannot fill {stages} stages: use at least {stages} (the bubble is "
            f"(p − 1)/(m + p − 1), so m ≫ p keeps it small)"
        )
    if batch_size % micro_batches:
        raise ValueError(f"batch_size ({batch_size}) must be divisible by the {micro_batches} micro-batches")
    if chunks > 1 and n_layers % (stages * chunks):
        raise ValueError(
            f"interleaved 1F1B with {chunks} chunks on each of {stages} stages needs n_layers ({n_layers}) divisible "
            f"by p·v = {stages * chunks}"
        )
    if chunks > 1 and micro_batches % stages:
        raise ValueError(
            f"interleaved 1F1B needs the micro-batches ({micro_batches}) a multiple of the {stages} stages: it takes "
            f"them in groups of p per chunk (Megatron-LM's constraint)"
        )


def chunk_layers(stage: int, stages: int, chunks: int, n_layers: int) -> list[range]:
    """The blocks of each of this rank's chunks: chunk c is virtual stage c·p + s, blocks [(c·p + s)·n, ... + n) with
    n = L/(p·v) (v = 1: the contiguous L/p blocks of stage s)."""
    n = n_layers // (stages * chunks)
    return [range((c * stages + stage) * n, (c * stages + stage + 1) * n) for c in range(chunks)]


class PipelineStage(nn.Module):
    """Blocks [s·L/p, (s+1)·L/p) of a TransformerLM, with its embeddings on the first stage and its final norm and
    LM head on the last; with chunks = v, the blocks of virtual stages s, p + s, ..., (v − 1)·p + s (chunk_layers),
    the embeddings at chunk 0 of stage 0, the head at chunk v − 1 of stage p − 1. Parameter names are the full
    model's, so gradients compare name by name."""

    def __init__(self, model: nn.Module, stage: int, stages: int, chunks: int = 1):
        super().__init__()
        self.stage, self.stages, self.chunks = stage, stages, chunks
        self.first, self.last = stage == 0, stage == stages - 1
        self.layers = chunk_layers(stage, stages, chunks, model.cfg.n_layers)
        self.blocks = nn.ModuleDict({str(i): copy.deepcopy(model.blocks[i]) for r in self.layers for i in r})
        if self.first:
            self.tok_emb, self.pos_emb = copy.deepcopy(model.tok_emb), copy.deepcopy(model.pos_emb)
        if self.last:
            self.norm_f, self.lm_head = copy.deepcopy(model.norm_f), copy.deepcopy(model.lm_head)

    def takes_ids(self, chunk: int) -> bool:
        """Whether `chunk` is the model's first virtual stage (its input: token ids)."""
        return self.first and chunk == 0

    def gives_logits(self, chunk: int) -> bool:
        """Whether `chunk` is the model's last virtual stage (its output: logits)."""
        return self.last and chunk == self.chunks - 1

    def forward(self, x: Tensor, chunk: int = 0) -> Tensor:
        if self.takes_ids(chunk):  # x: token ids (b, T)
            x = self.tok_emb(x) + self.pos_emb(torch.arange(x.shape[1], device=x.device))  # (b, T, C)
        for i in self.layers[chunk]:
            x = self.blocks[str(i)](x)  # (b, T, C)
        return self.lm_head(self.norm_f(x)) if self.gives_logits(chunk) else x  # (b, T, V) or (b, T, C)


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
        self.stage, self.stages, self.chunks = stage.stage, stage.stages, stage.chunks
        self.first, self.last, self.takes_ids, self.gives_logits = (
            stage.first, stage.last, stage.takes_ids, stage.gives_logits
        )  # fmt: skip

    def forward(self, x: Tensor, chunk: int = 0) -> Tensor:
        return _Wait.apply(self.inner(x, chunk), self.forward_s, self.backward_s)


def schedule(kind: str, stages: int, micro_batches: int, stage: int, chunks: int = 1) -> list[tuple[str, int, int]]:
    """Stage `stage`'s order of forward ("F", i, c) and backward ("B", i, c) passes over micro-batches 0..m-1 and its
    chunks c (0 except in "interleaved")."""
    m = micro_batches
    if kind != "interleaved" and chunks != 1:
        raise ValueError(f"{kind!r} runs one chunk per stage; chunks={chunks} is for 'interleaved'")
    if kind == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if kind == "1f1b":
        return one_f_one_b(min(stages - stage - 1, m), m, lambda k, fwd: (k, 0))
    if kind == "interleaved":
        return one_f_one_b(interleaved_warmup(stages, m, stage, chunks), m * chunks, interleaved_pass(stages, chunks))
    raise ValueError(f"unknown schedule {kind!r}; expected one of {', '.join(SCHEDULES)}")


def one_f_one_b(warm: int, passes: int, which) -> list[tuple[str, int, int]]:
    """`warm` forwards, then one forward and one backward until `passes` of each, then the backwards left; the k-th
    forward (backward) is the pass which(k, True) ((k, False)) = (micro-batch, chunk)."""
    out = [("F", *which(k, True)) for k in range(warm)]
    for k in range(passes - warm):  # steady state: one forward, one backward
        out += [("F", *which(warm + k, True)), ("B", *which(k, False))]
    return out + [("B", *which(k, False)) for k in range(passes - warm, passes)]


def interleaved_warmup(stages: int, micro_batches: int, stage: int, chunks: int) -> int:
    """Forwards before the first backward on `stage` in Megatron-LM's interleaved schedule: 2(p − s − 1) + (v − 1)p,
    at most all v·m of them; all of them when m = p."""
    total = micro_batches * chunks
    if micro_batches == stages:
        return total
    return min(2 * (stages - stage - 1) + (chunks - 1) * stages, total)


def interleaved_pass(stages: int, chunks: int):
    """The k-th forward or backward of the interleaved schedule as (micro-batch, chunk): groups of p micro-batches,
    each group through chunk 0, 1, ..., v − 1 in forward and v − 1, ..., 0 in backward."""

    def which(k: int, forward: bool) -> tuple[int, int]:
        group, j = divmod(k, stages * chunks)
        chunk = j // stages
        return group * stages + j % stages, chunk if forward else chunks - 1 - chunk

    return which


def upstream(rank: int, kind: str, micro: int, chunk: int, stages: int, chunks: int) -> tuple | None:
    """(rank, kind, micro-batch, chunk) of the pass whose output this pass receives: the forward of the virtual stage
    before, the backward of the one after; None for the first forward and the last backward (its own loss)."""
    s = chunk * stages + rank
    t = s - 1 if kind == "F" else s + 1
    return (t % stages, kind, micro, t // stages) if 0 <= t < stages * chunks else None


def downstream(rank: int, kind: str, micro: int, chunk: int, stages: int, chunks: int) -> tuple | None:
    """(rank, kind, micro-batch, chunk) of the pass that receives this pass's output (upstream's inverse); None for
    the last forward (its loss) and the first backward (the token ids)."""
    s = chunk * stages + rank
    t = s + 1 if kind == "F" else s - 1
    return (t % stages, kind, micro, t // stages) if 0 <= t < stages * chunks else None


def held_micro_batches(actions, chunk_bytes: list) -> float:
    """The most micro-batches' activations a stage holds at once under `actions` (forward adds its chunk's bytes,
    backward frees them), in units of one micro-batch through every chunk (sum of chunk_bytes)."""
    held = most = 0
    for kind, _, chunk in actions:
        held += chunk_bytes[chunk] if kind == "F" else -chunk_bytes[chunk]
        most = max(most, held)
    return most / sum(chunk_bytes)


def staged(t: Tensor) -> Tensor:
    """`t` itself, or a CPU copy where the backend is gloo and `t` is on a GPU (gloo's send/recv take CPU tensors;
    one GPU shared by two ranks runs gloo, notebook 08's gpu profile on one device)."""
    return t.cpu() if t.is_cuda and dist.get_backend() == "gloo" else t


def stream_ready(device: torch.device) -> None:
    """Block the host until the current stream has done its work: on CUDA the current stream alone (a device
    synchronize would also wait for this rank's sends still outstanding on NCCL's stream, i.e. for its neighbour to
    post their receives); elsewhere helpers.timing.sync."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    else:
        timing.sync(device)


def inputs_from(actions, stage: int, stages: int, chunks: int) -> list[int | None]:
    """Per action, the rank its input comes from (None: token ids, or its own loss)."""
    return [(dep[0] if (dep := upstream(stage, k, i, c, stages, chunks)) else None) for k, i, c in actions]


def p2p_posts(lines: list[list], stage: int, chunks: int) -> list:
    """What run_schedule posts and waits for on `stage`, in order, given every rank's actions: "take" where a pass
    waits for its input, else a batch_isend_irecv group (("send", to) | ("recv", frm), ...). A pass's send goes
    alone unless the next receive not yet posted comes from the same rank and that rank sends it before receiving
    this send: then both cross, and go in one group (posted ahead of the pass that needs the receive). A receive no
    send took along is posted alone when its pass needs it."""
    p, mine = len(lines), lines[stage]
    order = [{action: j for j, action in enumerate(line)} for line in lines]
    sources = inputs_from(mine, stage, p, chunks)
    recvs = [(j, src) for j, src in enumerate(sources) if src is not None]  # (my pass, the rank it receives from)
    out, posted, taken = [], 0, 0
    for j, (kind, i, c) in enumerate(mine):
        if sources[j] is not None:
            if taken == posted:
                out.append((("recv", sources[j]),))
                posted += 1
            out.append("take")
            taken += 1
        to = downstream(stage, kind, i, c, p, chunks)
        if to is None:
            continue
        group = (("send", to[0]),)
        frm = upstream(stage, *mine[recvs[posted][0]], p, chunks) if posted < len(recvs) else None
        if frm is not None and (recvs[posted][0] == j + 1 or _cross(order, to, frm)):
            group += (("recv", recvs[posted][1]),)
            posted += 1
        out.append(group)
    return out


def _cross(order: list, to: tuple, frm: tuple) -> bool:
    """Whether the pass `frm` that sends a receive runs on the rank `to` sends to, before the pass `to` receives."""
    return frm[0] == to[0] and order[to[0]][frm[1:]] < order[to[0]][to[1:]]


class _Channel:
    """send/recv between neighbouring stages: sends non-blocking (kept until the step ends), receives waited on.

    NCCL's pairing rule: NCCL runs a rank's point-to-point operations in order on one stream, and a send completes
    only once its peer's matching receive runs; two ranks that each posted a send and behind it a receive of the
    other's send wait forever (1F1B's steady state at p = 2; interleaved 1F1B's warm-up). So every operation goes
    through batch_isend_irecv (one communicator) and each send is posted in one group with the next receive not yet
    posted, even one a later pass needs (as Megatron-LM's send_forward_recv_backward, posted ahead): a rank's
    stream never holds a lone send ahead of a receive its peer is waiting to match. p2p_posts lists the groups."""

    def __init__(self, plan: list, shape, dtype, device):
        self.plan, self.at, self.shape, self.dtype, self.device = plan, 0, shape, dtype, device
        self.posted, self.taken, self.pending = [], 0, []  # posted receives [work, buf, got, flight]; sends

    def _post(self, ops: list, sent: InFlight | None) -> None:
        """batch_isend_irecv `ops` (a send first, if any): gloo gives a work per op, NCCL one for the group."""
        works = dist.batch_isend_irecv(ops)
        if sent is not None:
            self.pending.append((works[0], sent))
        for item in self.posted[len(self.posted) - sum(op.op is not dist.isend for op in ops) :]:
            item[0] = works[-1]
        del works

    def _recv_op(self, frm: int) -> dist.P2POp:
        got = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        buf, flight = staged(got), InFlight()
        flight.launching(buf)
        self.posted.append([None, buf, got, flight])
        return dist.P2POp(dist.irecv, buf, frm)

    def send(self, t: Tensor, to: int) -> None:
        """Post `t` to rank `to`, with the receives the plan puts beside it."""
        self._let_go(lambda h: h.is_completed())  # delivered buffers go, once gloo's threads let go of them too
        step, self.at = self.plan[self.at], self.at + 1
        if step[0] != ("send", to):
            raise ValueError(f"the plan posts {step} here, not a send to {to}: p2p_posts and run_schedule disagree")
        t, sent = staged(t).contiguous(), InFlight()
        sent.launching(t)
        self._post([dist.P2POp(dist.isend, t, to)] + [self._recv_op(frm) for _, frm in step[1:]], sent)

    def take(self) -> Tensor:
        """The next received tensor, in order (posted alone now where the plan says so): its data is on the
        stream, not necessarily on the host's clock (stamp after stream_ready)."""
        step, self.at = self.plan[self.at], self.at + 1
        if step != "take":  # a receive posted alone, then taken
            self._post([self._recv_op(frm) for _, frm in step], None)
            self.at += 1
        item = self.posted[self.taken]
        self.posted[self.taken], self.taken = None, self.taken + 1
        wait_all([item[0]])  # on NCCL the stream waits, not the host
        buf, got, flight = item[1:]
        del item  # and with it the work: no name keeps it (or its buffer) alive
        flight.settle()
        return got.copy_(buf) if buf is not got else got

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

    def finish(self) -> None:
        self._let_go(lambda h: True)


def run_schedule(
    stage: PipelineStage, actions, x: Tensor, y: Tensor, micro_batches: int, width: int, lines=None
) -> list:
    """Run one step's `actions` on this rank's stage; x, y are the whole batch (b·m, T). Returns this rank's compute
    timeline [(kind, micro_batch, chunk, start_s, end_s)], receives excluded (they are the waiting), on
    time.perf_counter's clock: CLOCK_MONOTONIC, one clock for every process of a machine (not across nodes).

    A pass starts when its input is on this rank's stream and ends when the stream has run its kernels: the host
    waits for the stream (stream_ready) before each stamp. On NCCL, dist.recv and Work.wait() return as soon as the
    stream is ordered after the receive, before the data has arrived; a stamp taken then would count the wait as
    compute and shrink the bubble. Sends and receives are grouped as p2p_posts says (NCCL's pairing rule), from
    every rank's actions: `lines`, or gathered here."""
    xs, ys = x.chunk(micro_batches), y.chunk(micro_batches)
    act_shape = (xs[0].shape[0], xs[0].shape[1], width)
    p, v = stage.stages, stage.chunks
    before, after = (stage.stage - 1) % p, (stage.stage + 1) % p  # neighbours on the ring of virtual stages
    if lines is None:
        lines = [None] * p
        dist.all_gather_object(lines, list(actions))
    plan = p2p_posts([list(line) for line in lines], stage.stage, v)
    chan, held, timeline = _Channel(plan, act_shape, torch.float32, x.device), {}, []
    dist.barrier()
    for kind, i, c in actions:
        if kind == "F":
            inp = xs[i] if stage.takes_ids(c) else chan.take().requires_grad_()
            stream_ready(x.device)
            start = time.perf_counter()
            out = stage(inp, c)
            if stage.gives_logits(c):
                out = lm_loss(out, ys[i]) / micro_batches  # the whole batch's mean, summed over micro-batches
            held[i, c], send = (inp, out), None if stage.gives_logits(c) else (out.detach(), after)
        else:
            grad = None if stage.gives_logits(c) else chan.take()
            stream_ready(x.device)
            start = time.perf_counter()
            inp, out = held.pop((i, c))
            out.backward(grad)
            send = None if stage.takes_ids(c) else (inp.grad, before)
        stream_ready(x.device)
        timeline.append((kind, i, c, start, time.perf_counter()))  # stamped before the send: a neighbour starts after
        if send is not None:
            chan.send(*send)
    chan.finish()
    return timeline


def _chunks_of(timelines: list[list]) -> int:
    """Chunks per rank in these timelines (1 + the largest chunk index)."""
    return 1 + max(c for line in timelines for _, _, c, _, _ in line)


def replay(timelines: list[list], durations=None, latency: float = 0.0) -> list[list]:
    """The timelines the schedules give by their dependencies alone: each rank's passes in its own order, each
    starting when its rank is free and its input has arrived, `latency` seconds after it was sent (a forward after
    the virtual stage before finished it, a backward after the one after: `upstream`), lasting what it took (or
    durations[kind] seconds: equal passes, where every rank's idle share is (p − 1)/(v·m + p − 1))."""
    p, v = len(timelines), _chunks_of(timelines)
    out, ends, pos = [[] for _ in range(p)], {}, [0] * p
    while any(pos[r] < len(timelines[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pos[r] < len(timelines[r]):
                k, i, c, s, e = timelines[r][pos[r]]
                dep = upstream(r, k, i, c, p, v)
                if dep is not None and dep not in ends:
                    break
                start = max(out[r][-1][4] if out[r] else 0.0, ends[dep] + latency if dep is not None else 0.0)
                end = start + (durations[k] if durations else e - s)
                out[r].append((k, i, c, start, end))
                ends[(r, k, i, c)], pos[r], moved = end, pos[r] + 1, True
        if not moved:
            raise ValueError("the timelines' passes wait on each other: not a pipeline schedule")
    return out


def handoff_latency(timelines: list[list]) -> float:
    """Median seconds from a neighbour finishing a pass to this rank starting the one that receives its output,
    over the handoffs where this rank was idle waiting for it: send, receive and waking up (0.0 when there is
    none)."""
    p, v = len(timelines), _chunks_of(timelines)
    ends = {(r, k, i, c): e for r, t in enumerate(timelines) for k, i, c, _, e in t}
    waits = []
    for rank, line in enumerate(timelines):
        for j, (k, i, c, s, _) in enumerate(line):
            dep = upstream(rank, k, i, c, p, v)
            if dep is not None:
                ready = max(ends[dep], line[j - 1][4] if j else -float("inf"))
                if ready == ends[dep]:
                    waits.append(s - ready)
    return float(sorted(waits)[len(waits) // 2]) if waits else 0.0


def bubble_of(timelines: list[list]) -> list[float]:
    """Each rank's idle share of the step: 1 − its compute time / the step's span (first start to last end over
    every rank)."""
    span = max(t[-1][4] for t in timelines) - min(t[0][3] for t in timelines)
    return [1 - sum(e - s for *_, s, e in t) / span for t in timelines]
