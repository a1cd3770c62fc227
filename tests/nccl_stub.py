"""NCCL's semantics on a CPU, for tests (issue 47): gloo underneath, NCCL's timing and ordering on top.

    with NcclStub(delay_s=0.02) as stub:      # inside a rank started by helpers.launch.launch (gloo, CPU)
        timeline = run_schedule(...)           # any code that uses torch.distributed and helpers.timing.sync
    stub.landed                                # [(op, peer, ready_s)]: when each received tensor's data landed
    stub.races                                 # what read or wrote a communication's tensor before its wait()
    # leaving the block checks NCCL's pairing rule over every rank's posts: NcclDeadlock names the stuck ones

What it models, and how:
- dist.recv, dist.irecv(...).wait(), batch_isend_irecv(...) waits, dist.all_reduce, dist.broadcast,
  all_gather_into_tensor / all_gather_single and reduce_scatter_tensor / reduce_scatter_single (sync or async_op)
  return to the host before the data has arrived (NCCL orders the stream, not the host): the stub posts gloo's
  operation on buffers of its own and returns at once. The data lands in the caller's tensor `delay_s`
  (+ nbytes / beta_Bps) after gloo delivered it, and only when the stream needs it: at the device sync
  (helpers.timing.sync, every reference to it patched), at the first op that reads or writes the tensor after
  the work's wait() (a dispatch mode: kernels queued behind the receive run after it), or at a send or collective
  posted on it (NCCL's stream runs them in order). A host stamp taken between
  the return and the sync is earlier than `landed`'s ready_s. Views and ops that read only a tensor's shape
  (empty_like, ...) neither land data nor count as a use.
- Work.wait() is what orders the compute stream after NCCL's: an op (not a view) that touches a receive's or a
  collective's output before its work was waited on (any work of a batch_isend_irecv group: NCCL gives the group
  one), or writes a tensor a send or collective is still reading, is a race on NCCL. The stub records it in
  `races` and fills the output with NaN first (what it reads is undefined there); the data still lands later.
  Waiting on a later operation also orders the earlier ones (one queue, below: true of one process group's
  collectives, which share an NCCL stream; PyTorch's point-to-point between a pair has its own, so a race across
  the two goes unseen). A device sync ends every race. A tensor a send or collective reads is held until its wait()
  (NCCL's recordStream: its memory is not reused meanwhile).
- Work.get_future() completes when its data lands (what helpers.ddp's CUDA events record on NCCL: NCCL's own
  future completes at enqueue, which is why the wrappers do not use it there); a send's, at once.
- A tensor freed meanwhile (FSDP's storage resized to 0) gets nothing: the data lands where nothing reads it.
- Every host sync costs `sync_s` (a GPU's synchronize latency), so a timing that syncs per call is biased by it.
- NCCL runs a rank's point-to-point operations in posting order and a send completes only when its peer's
  matching receive runs (large messages: no eager buffer). Each rank logs its posts (groups from
  batch_isend_irecv as one unit, collectives, host syncs); on exit the logs are gathered and replayed by
  `deadlock`, which names the operations that would wait on each other forever. It serializes every operation of
  a rank on one queue: stricter than PyTorch, whose lone sends and receives use a communicator per pair.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

from helpers import timing
from helpers.comm import InFlight

PATCHED = ("isend", "irecv", "send", "recv", "batch_isend_irecv", "P2POp", "all_reduce", "barrier", "broadcast")
GATHERS = ("all_gather_into_tensor", "all_gather_single")  # (output, input, group=None, async_op=False)
SCATTERS = ("reduce_scatter_tensor", "reduce_scatter_single")  # (output, input, op=SUM, group=None, async_op=False)
_aten = torch.ops.aten
SHAPE_ONLY = {  # ops that read a tensor's shape, not its data: no use of a receive buffer
    _aten.empty_like, _aten.zeros_like, _aten.ones_like, _aten.full_like, _aten.new_empty, _aten.new_zeros,
    _aten.new_ones, _aten.new_full, _aten.new_empty_strided, _aten.sym_size, _aten.sym_stride, _aten.sym_numel,
    _aten.sym_storage_offset, _aten.is_same_size,
}  # fmt: skip


class NcclDeadlock(RuntimeError):
    """NCCL would hang: operations that wait on each other (NCCL's pairing rule)."""


@dataclass
class P2POp:
    """dist.P2POp's fields, without its check that `op` is torch's own isend/irecv."""

    op: object
    tensor: torch.Tensor
    peer: int
    group: object = None
    tag: int = 0


@dataclass
class _Landing:
    """A receive (or collective) whose data is not yet in the caller's tensor."""

    dst: torch.Tensor
    buf: torch.Tensor
    work: object
    flight: InFlight
    what: tuple  # (op, peer)
    post: int  # its post in the log: a wait() on any work of that post orders the stream after it
    waited: bool = False
    poisoned: bool = False
    futures: list = field(default_factory=list)  # get_future()s completed when it lands


class _Work:
    """NCCL's Work: wait() orders the stream and returns at once; is_completed() when gloo's is; get_future() when
    the data landed."""

    def __init__(self, stub, real, post: int, landing: _Landing | None = None):
        self.stub, self.real, self.post, self.landing = stub, real, post, landing

    def wait(self, timeout=None) -> bool:
        self.stub.log.append(("wait", self.post))
        self.stub.waited(self.post)
        return True

    def is_completed(self) -> bool:
        return self.real.is_completed()

    def get_future(self) -> torch.futures.Future:
        future = torch.futures.Future()
        if self.landing is None or self.landing.work is None:  # a send, or landed already
            future.set_result(None)
        else:
            self.landing.futures.append(future)
        return future


class _StreamOrder(TorchDispatchMode):
    """Kernels run after the receives queued before them: an op that touches a tensor still waiting for its data
    lands that data first (or, before the work's wait(), records a race)."""

    def __init__(self, stub):
        super().__init__()
        self.stub = stub

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.stub.kernel(func, args, kwargs or {})
        return func(*args, **(kwargs or {}))


@dataclass
class NcclStub:
    """Patch torch.distributed's point-to-point calls, the collectives helpers uses (all_reduce, broadcast,
    all_gather_into_tensor, reduce_scatter_tensor and their *_single names), barrier and helpers.timing.sync with
    NCCL's semantics (module docstring) while the block runs."""

    delay_s: float = 0.02  # from gloo's delivery to the data landing in the caller's tensor
    beta_Bps: float = float("inf")  # plus nbytes / beta_Bps
    sync_s: float = 0.0  # what each host sync costs
    check_pairing: bool = True  # on exit: gather every rank's posts and raise NcclDeadlock where NCCL would hang
    log: list = field(default_factory=list)  # ("post", n, ops) | ("wait", n) | ("sync",)
    landed: list = field(default_factory=list)  # (op, peer, ready_s)
    races: list = field(default_factory=list)  # sentences: an op that used a communication's tensor before wait()
    pending: list = field(default_factory=list)
    reading: list = field(default_factory=list)  # (tensor, post, op): what a send or collective still reads (held,
    # as NCCL's recordStream holds its memory: a freed one's storage is not reused meanwhile)
    settling: list = field(default_factory=list)  # landed receives' buffers, until gloo lets go of them
    sending: list = field(default_factory=list)  # (gloo's work, its buffer's InFlight) until the send is done

    # ---- entering and leaving ----

    def __enter__(self):
        names = [n for n in PATCHED + GATHERS + SCATTERS if hasattr(dist, n)]
        self.real = {name: getattr(dist, name) for name in names}
        self.real_sync = timing.sync
        for name in names:
            setattr(dist, name, self._gather(name) if name in GATHERS else self._scatter(name) if name in SCATTERS
                    else getattr(self, name))  # fmt: skip
        self.synced = [(m, a) for m, a in _references(timing.sync)]
        for module, attr in self.synced:
            setattr(module, attr, self.sync)
        self.mode = _StreamOrder(self)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        self.land_all()
        self.reading = []
        self._reap(lambda work: work.wait())
        for flight in self.settling:
            flight.settle()
        self.settling = []
        for name, fn in self.real.items():
            setattr(dist, name, fn)
        for module, attr in self.synced:
            setattr(module, attr, self.real_sync)
        if exc[0] is None and self.check_pairing:
            logs = [None] * dist.get_world_size()
            dist.all_gather_object(logs, self.log)
            if (stuck := deadlock(logs)) is not None:
                raise NcclDeadlock(stuck)
        return False

    # ---- landing data ----

    def land_for(self, tensors) -> None:
        """NCCL's own stream (a send or collective posted on these tensors): land every pending receive up to the
        last one whose tensor shares storage with one of `tensors`, waited on or not."""
        if not self.pending:
            return
        keys = _keys(tensors)
        last = max((j for j, p in enumerate(self.pending) if _key(p.dst) in keys), default=-1)
        self._land(last + 1)

    def kernel(self, func, args, kwargs) -> None:
        """Before a kernel on the compute stream: races on tensors whose communication it was not ordered after
        (no wait()), then land every pending receive up to the last waited one it touches."""
        if not self.pending and not self.reading:
            return
        if getattr(func, "is_view", False) or getattr(func, "overloadpacket", None) in SHAPE_ONLY:
            return
        keys = _keys(tree_leaves((args, kwargs)))
        if self.reading:
            written = _keys(_written(func, args, kwargs))
            for t, post, op in self.reading:
                if _key(t) in written:
                    self.races.append(f"{func} wrote a tensor the {op} posted {post} still reads (no wait())")
        last = -1
        for j, p in enumerate(self.pending):
            if _key(p.dst) not in keys:
                continue
            if p.waited:
                last = j
            elif not p.poisoned:
                self.races.append(f"{func} used the {p.what[0]} posted {p.post}'s tensor before its wait()")
                p.poisoned = True
                if p.dst.is_floating_point() and _fits(p.dst):
                    with _disable_current_modes(), torch.no_grad():
                        p.dst.fill_(float("nan"))
        self._land(last + 1)

    def waited(self, post: int) -> None:
        """A wait() on a work of `post`: the compute stream is now ordered after it."""
        for p in self.pending:
            if p.post == post:
                p.waited = True
        self.reading = [r for r in self.reading if r[1] != post]

    def land_all(self) -> None:
        self._land(len(self.pending))

    def _land(self, n: int) -> None:
        for p in self.pending[:n]:
            with _disable_current_modes(), torch.no_grad():
                p.work.wait()
                time.sleep(self.delay_s + p.buf.nbytes / self.beta_Bps)
                if _fits(p.dst):  # else freed meanwhile: nothing reads it
                    p.dst.copy_(p.buf)
            p.work = None
            self.settling.append(p.flight)  # settled on leaving: the caller may still hold the work, and it the buffer
            self.landed.append((*p.what, time.perf_counter()))
            for future in p.futures:
                future.set_result([p.dst])
        del self.pending[:n]

    def sync(self, device=None) -> None:
        """The device sync: every pending receive lands, every send and collective is done; costs sync_s."""
        self.log.append(("sync",))
        self.land_all()
        self.reading = []
        time.sleep(self.sync_s)
        self.real_sync(torch.device(device) if device is not None else torch.device("cpu"))

    # ---- torch.distributed's calls ----

    def _post(self, ops: list) -> int:
        self.log.append(("post", len(self.log), tuple(ops)))
        return len(self.log) - 1

    def _reap(self, done) -> None:
        """Drop the sends `done` says are finished (it may wait), then wait until gloo let go of their buffers."""
        flags = [bool(done(work)) for work, _ in self.sending]
        flights = [f for (_, f), flag in zip(self.sending, flags, strict=True) if flag]
        self.sending = [item for item, flag in zip(self.sending, flags, strict=True) if not flag]
        for flight in flights:
            flight.settle()

    def isend(self, tensor, dst=None, group=None, tag=0, **kwargs):
        self.land_for([tensor])  # a send queued behind a receive into its buffer sends the received data
        n = self._post([("send", _peer(dst, group, kwargs), tensor.nbytes)])
        work = self._send(tensor, lambda buf: self.real["isend"](buf, **_to(dst, group, tag, kwargs)), n)
        return _Work(self, work, n)

    def _send(self, tensor, launch, post: int):
        """gloo's send of a copy (NCCL's Work lets go of the caller's tensor when dropped), kept until it is done;
        the caller's tensor is read until the post's wait()."""
        self._reap(lambda work: work.is_completed())
        with _disable_current_modes():
            buf = tensor.detach().clone()
            flight = InFlight()
            flight.launching(buf)
            work = launch(buf)
        self.sending.append((work, flight))
        self.reading.append((tensor, post, "send"))
        return work

    def _receive(self, tensor, launch, what: tuple, post: int) -> _Landing:
        """gloo's receive (or collective) `launch(buf)` into the stub's buffer; the data lands in `tensor` later."""
        buf, flight = _empty_like(tensor), InFlight()
        flight.launching(buf)
        with _disable_current_modes():
            work = launch(buf)
        self.pending.append(_Landing(tensor, buf, work, flight, what, post))
        return self.pending[-1]

    def irecv(self, tensor, src=None, group=None, tag=0, **kwargs):
        peer = _peer(src, group, kwargs, key="group_src")
        n = self._post([("recv", peer, tensor.nbytes)])
        landing = self._receive(
            tensor, lambda buf: self.real["irecv"](buf, **_from(src, group, tag, kwargs)), ("recv", peer), n
        )
        return _Work(self, landing.work, n, landing)

    def send(self, tensor, dst=None, group=None, tag=0, **kwargs):
        self.isend(tensor, dst, group, tag, **kwargs).wait()

    def recv(self, tensor, src=None, group=None, tag=0, **kwargs):
        self.irecv(tensor, src, group, tag, **kwargs).wait()
        return src

    def P2POp(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):  # noqa: N802 (torch's name)
        return P2POp(op, tensor, peer if peer is not None else group_peer, group, tag)

    def batch_isend_irecv(self, ops: list) -> list:
        """One NCCL group: one post in the log; a work per op (gloo's shape), all waiting on the group."""
        n = self._post([("send" if op.op == self.isend else "recv", op.peer, op.tensor.nbytes) for op in ops])
        works = []
        for op in ops:
            if op.op == self.isend:
                self.land_for([op.tensor])
                send = self._send(op.tensor, lambda buf, op=op: self.real["isend"](buf, op.peer, op.group, op.tag), n)
                works.append(_Work(self, send, n))
            else:
                landing = self._receive(
                    op.tensor,
                    lambda buf, op=op: self.real["irecv"](buf, op.peer, op.group, op.tag),
                    ("recv", op.peer),
                    n,
                )
                works.append(_Work(self, landing.work, n, landing))
        return works

    def _collective(self, name: str, out, inp, launch, async_op: bool):
        """A collective writing `out` (in place when `inp` is None: out is read too), reading `inp`: gloo's on the
        stub's buffers, its data landing in `out` later."""
        self.land_for([out] if inp is None else [out, inp])
        n = self._post([("collective", name, out.nbytes)])
        with _disable_current_modes():
            src = out.detach().clone() if inp is None else inp.detach().clone()
        flight = InFlight()
        flight.launching(src)
        self.settling.append(flight)
        if inp is None:
            landing = self._receive(out, lambda _: launch(src, None), (name, None), n)
            landing.buf = src  # in place: gloo's result is in the copy
        else:
            landing = self._receive(out, lambda buf: launch(buf, src), (name, None), n)
            self.reading.append((inp, n, name))
        work = _Work(self, landing.work, n, landing)
        return work if async_op else work.wait() and None

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        real = self.real["all_reduce"]
        return self._collective(
            "all_reduce", tensor, None, lambda buf, _: real(buf, op=op, group=group, async_op=True), async_op
        )

    def broadcast(self, tensor, src=None, group=None, async_op=False, **kwargs):
        real = self.real["broadcast"]
        return self._collective(
            "broadcast", tensor, None, lambda buf, _: real(buf, src=src, group=group, async_op=True, **kwargs), async_op
        )

    def _gather(self, name: str):
        real = self.real[name]

        def all_gather(output_tensor, input_tensor, group=None, async_op=False):
            return self._collective(
                "all_gather",
                output_tensor,
                input_tensor,
                lambda buf, src: real(buf, src, group=group, async_op=True),
                async_op,
            )

        return all_gather

    def _scatter(self, name: str):
        real = self.real[name]

        def reduce_scatter(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
            return self._collective(
                "reduce_scatter",
                output,
                input,
                lambda buf, src: real(buf, src, op=op, group=group, async_op=True),
                async_op,
            )

        return reduce_scatter

    def barrier(self, group=None, **kwargs):
        """NCCL's barrier: an all-reduce the host waits for (a sync)."""
        self._post([("collective", "barrier", 4)])
        self.land_all()
        self.reading = []
        with _disable_current_modes():
            self.real["barrier"](group=group, **kwargs)
        self.log.append(("sync",))


def _empty_like(t: torch.Tensor) -> torch.Tensor:
    with _disable_current_modes():
        return torch.full_like(t, float("nan")) if t.is_floating_point() else torch.empty_like(t)


def _key(t: torch.Tensor) -> int:
    """The tensor's storage (the same through views, .data and FSDP's resize_ of it)."""
    return t.untyped_storage()._cdata


def _keys(leaves) -> set:
    return {_key(t) for t in leaves if isinstance(t, torch.Tensor) and t.layout == torch.strided}


def _fits(t: torch.Tensor) -> bool:
    """Whether the tensor's storage still holds all its elements (FSDP frees a gathered buffer by resizing it to 0)."""
    if t.numel() == 0:
        return True
    extent = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1
    return t.untyped_storage().nbytes() >= extent * t.element_size()


def _written(func, args, kwargs) -> list:
    """The tensors an op writes: its arguments the schema marks Tensor(a!) (in place, out=)."""
    out, schema = [], getattr(func, "_schema", None)
    for i, arg in enumerate(schema.arguments if schema is not None else []):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
            out += [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
    return out


def _peer(rank, group, kwargs, key="group_dst") -> int:
    if rank is None:
        rank = dist.get_global_rank(group, kwargs[key]) if group is not None else kwargs[key]
    return rank


def _to(dst, group, tag, kwargs) -> dict:
    return dict(dst=dst, group=group, tag=tag, **kwargs)


def _from(src, group, tag, kwargs) -> dict:
    return dict(src=src, group=group, tag=tag, **kwargs)


def _references(fn) -> list:
    """Every (helpers module, attribute) bound to `fn` (`from helpers.timing import sync` copies the name)."""
    return [
        (module, attr)
        for name, module in list(sys.modules.items())
        if name.startswith("helpers") and module is not None
        for attr, value in list(vars(module).items())
        if value is fn
    ]


# ---- NCCL's pairing rule, replayed over every rank's posts ----


def deadlock(logs: list[list]) -> str | None:
    """Replay every rank's posts with NCCL's rules: a rank's posts run one after another; a send and its receive
    (the k-th from a to b matches the k-th at b from a) complete together, once both are running; a collective
    completes once every rank runs its k-th; a post completes when all its operations have; a host sync holds the
    rank's later posts until every post it waited on (wait(), or a collective) has completed. None when everything
    completes, else a sentence naming what each stuck rank waits on."""
    world = len(logs)
    posts = [[e for e in log if e[0] == "post"] for log in logs]
    keys = [_op_keys(p, r) for r, p in enumerate(posts)]  # per rank, per post: the keys its operations match on
    head = [0] * world  # the post now running on each rank's queue
    issued = [_issued(log) for log in logs]  # per rank: how many posts the host has issued before each sync
    done, matched = [set() for _ in range(world)], set()  # posts completed per rank; operations matched

    def active(r: int) -> bool:
        return head[r] < len(posts[r]) and head[r] < issued[r](done[r])

    while True:
        running = [k for r in range(world) if active(r) for k in keys[r][head[r]]]
        matched |= {k[:-1] for k in running if _matched(k, running, world)}
        moved = False
        for r in range(world):
            if active(r) and all(k[:-1] in matched for k in keys[r][head[r]]):
                done[r].add(posts[r][head[r]][1])
                head[r] += 1
                moved = True
        if not moved:
            break
    stuck = [f"rank {r} at {posts[r][head[r]][2]}" for r in range(world) if head[r] < len(posts[r])]
    return None if not stuck else "NCCL would hang: " + "; ".join(stuck) + " (each waits for a peer's post)"


def _op_keys(posts: list, rank: int) -> list[list]:
    """Per post, its operations' match keys: ("p2p", src, dst, k) or ("collective", k)."""
    counts, out = {}, []
    for _, _, ops in posts:
        keys = []
        for kind, peer, _ in ops:
            if kind == "collective":
                key = ("collective",)
            else:
                key = ("p2p", rank, peer) if kind == "send" else ("p2p", peer, rank)
            counts[key] = counts.get(key, 0) + 1
            keys.append((*key, counts[key], kind))
        out.append(keys)
    return out


def _matched(key: tuple, running: list, world: int) -> bool:
    """Whether the operation `key` can complete with what runs now on every rank."""
    if key[0] == "collective":
        return running.count(key) == world
    _, src, dst, k, kind = key
    return ("p2p", src, dst, k, "recv" if kind == "send" else "send") in running


def _issued(log: list):
    """A function: given the posts completed so far, how many posts this rank's host has issued (it stops at a sync
    until every post waited on before it has completed)."""
    gates, waited, n = [], set(), 0  # gates: (posts issued before the sync, posts that must complete first)
    for e in log:
        if e[0] == "post":
            n += 1
            if e[2][0][0] == "collective":
                waited.add(e[1])
        elif e[0] == "wait":
            waited.add(e[1])
        elif e[0] == "sync":
            gates.append((n, frozenset(waited)))

    def issued(done: set) -> int:
        for n_before, need in gates:
            if not need <= done:
                return n_before
        return n

    return issued
