"""`yours` for the distributed topics: a student's DDP (each flavour), sharded optimizer and FSDP, checked against one
process, accounted (memory, bytes) against the formulas, and timed beside ours and PyTorch's.

    result = run_ddp("path/to/tests/adapters.py", Options())       # TopicResult: checks + side-by-side rows
    result = run_sharding(path, Options()); result = run_fsdp(path, Options(repeat=3))

The student's code runs only in ranks started by helpers.launch (2 ranks, gloo, CPU); each rank imports the adapters
file itself. A crashed rank (signal named), a hung collective (after Options.timeout_s) or an exception in the
student's code becomes an "error" check naming file:line, and the topic's other implementations are then run in
launches of their own, so one broken flavour never hides the others. The checks are the experiments' own (helpers.
experiments.ddp / sharding / fsdp), called with the student's implementation in place of ours.
"""
from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers import formulas as F
from helpers import launch as L
from helpers import memory as M
from helpers.comm import count_collectives
from helpers.course.yours import Options
from helpers.course.yours import adapters as A
from helpers.course.yours.report import ERROR, FAIL, NOT_IMPLEMENTED, PASS, SKIPPED, Check, TopicResult
from helpers.ddp import wrap
from helpers.experiments import ddp as XD
from helpers.experiments import fsdp as XF
from helpers.experiments import sharding as XS
from helpers.experiments.common import cpu_state, make_batches, make_model, rank_rows, rank_share, slowest_rank, \
    train_step
from helpers.formulas import MiB
from helpers.fsdp import bytes_sent, fsdp_bytes_per_step
from helpers.timing import paired_ratio, ratio_columns, verdict

WORLD = 2
TOY = dict(steps=3, batch_size=8, context_length=6)  # DDP and sharding equivalence: the toy model (tied, frozen, unused)
SPEED = dict(model="small/cpu", batch_size=8, context_length=32)  # side-by-side timing, small CPU shapes
FSDP_CHECK = dict(model="small/cpu", n_layers=None, steps=2, batch_size=4, context_length=16)
FSDP_DTYPES = ("fp32", "bf16")  # without and with a compute dtype
FSDP_BYTES_TOL = 0.02  # bytes per step vs the formula, relative: another padding or sharded norm gains move ~0.1 %
FSDP_MEMORY_TOL = 0.10  # after init and the forward/backward peak vs the formulas (XF.PEAK_TOL: the tracker's drift)


class Unusable(Exception):
    """An implementation that cannot be checked: an adapter not implemented, missing, or returning the wrong kind.
    Raised alike on every rank (no collective is left waiting), so the worker reports it and goes on."""

    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


# ---- in a rank: the student's adapters, loaded once per process ----

_LOADED: dict = {}


def _adapter_fns(path: str, topic: str, impl: str) -> dict:
    """The callables of one implementation; Unusable(SKIPPED) when the file names none of them (another edition)."""
    if path not in _LOADED:
        _LOADED[path] = A.load(path)
    adapter = next(a for a in A.implementations(_LOADED[path], topic) if a.impl == impl)
    if not adapter.ok:
        raise Unusable(SKIPPED, f"no {', '.join(A.ADAPTERS[topic][impl])} in the file (another edition's names)")
    return adapter.fns


def _required(fns: dict, name: str) -> callable:
    if name not in fns:
        raise Unusable(ERROR, f"{name} is missing from the adapters file (its flavour's other adapters are there)")
    return fns[name]


def _called(fn, *args, expect=None, what: str = "", **kwargs):
    """A student's adapter called: NotImplementedError -> Unusable(NOT_IMPLEMENTED), a wrong return kind -> Unusable."""
    out = A.call(fn, *args, **kwargs)
    if isinstance(out, str) and out == A.NOT_IMPLEMENTED:
        raise Unusable(NOT_IMPLEMENTED, f"{fn.__name__} raises NotImplementedError")
    if expect is not None and not isinstance(out, expect):
        raise Unusable(ERROR, f"{fn.__name__} returned {type(out).__name__}, expected {what}")
    return out


def _outcome(fn) -> dict:
    """fn()'s dict with status "ok", or the Unusable's status and detail (other exceptions propagate: a rank error)."""
    try:
        return {"status": "ok", **fn()}
    except Unusable as exc:
        return {"status": exc.status, "detail": exc.detail}


def _digest(state: dict) -> dict:
    """name -> sha1 of the tensor's bytes: equality across ranks without sending the tensors back."""
    return {k: hashlib.sha1(v.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest() for k, v in state.items()}


def _sent(log, world: int) -> float:
    return sum(F.wire_factor(op, world) * b for op, b in log)


def _one_step_bytes_and_peak(model, grad_sync, opt, x, y, track=M.track) -> tuple[float, float]:
    """Bytes this rank sends in one training step (helpers.comm counting) and the step's peak above its start."""
    with count_collectives() as log:
        trace = track(lambda: XF.step(model, grad_sync, opt, x, y), existing=M.model_state(model, opt, x, y))
    return _sent(log, dist.get_world_size()), float(trace.peak_bytes - trace.baseline_bytes)


# ---- in the parent: launches that never crash the driver ----

def _where_in(text: str, path: str) -> str:
    """file:line of the deepest frame of the student's assignment in a traceback's text (else the deepest frame)."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', text or "")
    root = str(A.assignment_root(Path(path)))
    mine = [f for f in frames if f[0].startswith(root)] or frames
    return f"{mine[-1][0]}:{mine[-1][1]}" if mine else "?"


def _failure_detail(exc: BaseException, path: str) -> str:
    """One paragraph for a launch that failed: the rank and its error (signal, timeout) and where in the student's code."""
    if isinstance(exc, TimeoutError):
        return (f"hung: {str(exc).split(' and was stopped')[0]} - a rank is waiting in a collective another rank never "
                "entered (same calls, same order, on every rank?)")
    first = str(exc).split("\n")[0]
    tb = getattr(exc, "remote_traceback", None)
    return f"{first} (at {_where_in(tb, path)})" if tb else first


def _launch_each(worker, path: str, impls: list[str], opts: Options) -> dict:
    """impl -> the worker's per-rank results, or the exception that stopped its launch. All implementations in one
    launch; if it fails, each in a launch of its own, so a crash or hang is pinned on the implementation that caused it."""
    def launch(names):
        return L.launch(functools.partial(worker, path, names, opts), WORLD, backend="gloo", device="cpu",
                        timeout_s=opts.timeout_s)
    try:
        per_rank = launch(impls)
        return {impl: [r[impl] for r in per_rank] for impl in impls}
    except (L.RankError, TimeoutError) as exc:
        if len(impls) == 1:
            return {impls[0]: exc}
    out = {}
    for impl in impls:
        try:
            out[impl] = [r[impl] for r in launch([impl])]
        except (L.RankError, TimeoutError) as exc:
            out[impl] = exc
    return out


def _status_checks(topic: str, impl: str, got, path: str) -> list[Check] | None:
    """The one check for an implementation that could not run (launch failure, not implemented, skipped, wrong kind),
    else None."""
    if isinstance(got, BaseException):
        return [Check(topic, impl, "runs on 2 ranks", ERROR, _failure_detail(got, path))]
    first = got[0]
    if first["status"] != "ok":
        return [Check(topic, impl, "adapters", first["status"], first["detail"])]
    return None


def _timing_rows(topic: str, impl: str, samples_per_rank: list[dict], labels: dict, unit_scale=1e3) -> list[dict]:
    """Median step time per label (slowest rank), and yours / each other label as a paired ratio with its interval."""
    slow = {k: slowest_rank([r[k] for r in samples_per_rank]) for k in samples_per_rank[0]}
    rows = [{"topic": topic, "impl": impl, "measure": "step time", "who": labels.get(k, k), "label": k,
             "value": float(np.median(v)) * unit_scale, "unit": "ms"} for k, v in slow.items()]
    for k in slow:
        if k != "yours" and "yours" in slow:
            r = paired_ratio(slow["yours"], slow[k])
            rows.append({"topic": topic, "impl": impl, "measure": f"step time, yours / {labels.get(k, k)}",
                         "who": "yours", "label": k, "value": r.median, "unit": "x", **ratio_columns(r),
                         "verdict": verdict("yours", labels.get(k, k), r, "step time")})
    return rows


# ======================================= DDP =======================================

DDP_OURS = {"individual": ("per_parameter", None), "bucketed": ("bucketed", 1.0), "ddp": ("bucketed", 1.0)}
SPEED_BUCKET_MB = 1.0


def ddp_bucket_sizes() -> list[float]:
    """Bucket sizes (MB) the bucketed flavour is checked at on the toy model: one tensor per bucket, two buckets (ours'
    plan), everything in one bucket."""
    return [1e-5, XD.bucket_mb_for(2), 100.0]


class StudentDDP:
    """A student's DDP flavour behind the gradient-sync protocol of train_step and gradient_checks (.module, call,
    on_train_batch_start, finish_gradient_synchronization), its hooks called with (ddp_model, optimizer) as the
    course's tests call them; the synced gradients of every step are kept for the cross-rank check."""

    def __init__(self, fns: dict, impl: str, module: nn.Module, bucket_mb: float | None = None):
        names = A.ADAPTERS["ddp"][impl]
        ctor = _required(fns, names[0])
        self.after = _required(fns, names[1])
        self.start = _required(fns, names[2]) if len(names) > 2 else None
        args = (module, bucket_mb) if impl == "bucketed" else (module,)
        self.ddp = _called(ctor, *args, expect=nn.Module, what="a torch.nn.Module wrapping the model")
        self.module, self.optimizer, self.synced = module, None, []
        self.keep = True  # keep each step's synced gradients (not while timing or measuring memory)

    def parameters(self):
        return self.ddp.parameters()

    def bind_optimizer(self, optimizer) -> None:
        """The optimizer the hooks are called with (bench_worker makes it after the wrapper)."""
        self.optimizer = optimizer

    def __call__(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def on_train_batch_start(self) -> None:
        if self.start is not None:
            _called(self.start, self.ddp, self.optimizer)

    def finish_gradient_synchronization(self) -> None:
        _called(self.after, self.ddp, self.optimizer)
        if self.keep:
            self.synced.append({n: None if p.grad is None else p.grad.detach().clone()
                                for n, p in self.module.named_parameters() if p.requires_grad})

    def close(self) -> None:
        """Nothing to remove: the student's wrapper owns its hooks."""


def _ddp_config(fns, impl: str, bucket_mb) -> dict:
    """One equivalence run of the student's flavour on the toy model (rank-seeded: the broadcast must fix it)."""
    rank = dist.get_rank()
    net = make_model("toy", rank)
    shim = StudentDDP(fns, impl, net, bucket_mb)
    start = make_model("toy", 0).state_dict()
    start_diff = [k for k, v in net.state_dict().items() if not torch.equal(v, start[k])]
    shim.optimizer = opt = XD.make_optimizer(shim.parameters(), "sgd")
    got = XD.gradient_checks("toy", shim, opt, make_batches("toy", **TOY), 0, "sgd")
    return {"bucket_mb": bucket_mb, "start_diff": start_diff, "steps": got["steps"],
            "weight_ratio": got["weight_ratio"], "state": got["state"], "synced": shim.synced}


def _ddp_speed(fns, impl: str, opts: Options) -> dict:
    """Yours, ours (the same flavour) and torch DDP from the same weights, timed interleaved; then one more step each
    for bytes sent and the step's peak."""
    kind, mb = DDP_OURS[impl]
    wrappers = {"yours": lambda m: _untracked(StudentDDP(fns, impl, m, SPEED_BUCKET_MB)),
                "ours": lambda m: wrap(kind, m, mb), "pytorch": lambda m: wrap("torch_ddp", m, SPEED_BUCKET_MB)}
    built = {}

    def keep(label):
        def make(m):
            built[label] = w = wrappers[label](m)
            return w
        return make
    run = XD.bench_worker(model=SPEED["model"], bucket_mb=SPEED_BUCKET_MB, steps=opts.steps, warmup=opts.warmup,
                          batch_size=SPEED["batch_size"], context_length=SPEED["context_length"],
                          wrappers={k: keep(k) for k in wrappers})
    x, y = rank_share(make_batches(SPEED["model"], 1, SPEED["batch_size"], SPEED["context_length"], 1)[0])
    sent, peak = {}, {}
    for label, w in built.items():
        opt = w.optimizer if isinstance(w, StudentDDP) else XD.make_optimizer(w.parameters(), "sgd")
        sent[label], peak[label] = _one_step_bytes_and_peak(w.module, w, opt, x, y)
    for w in built.values():
        w.close()
    return {"samples": run.step, "same_weights": run.same_weights, "sent": sent, "peak": peak,
            "grad_bytes": 4 * sum(p.numel() for p in make_model(SPEED["model"], 0).parameters() if p.requires_grad)}


def _untracked(shim: StudentDDP) -> StudentDDP:
    shim.keep = False
    return shim


def ddp_worker(path: str, impls: list[str], opts: Options) -> dict:
    """In each rank: per DDP flavour, equivalence runs on the toy model (each bucket size for the bucketed one) and
    the side-by-side timing; {impl: outcome}."""
    out = {}
    for impl in impls:
        def run(impl=impl):
            fns = _adapter_fns(path, "ddp", impl)
            sizes = ddp_bucket_sizes() if impl == "bucketed" else [None]
            configs = [_ddp_config(fns, impl, mb) for mb in sizes]
            return {"configs": configs, "speed": _ddp_speed(fns, impl, opts) if opts.steps else None}
        out[impl] = _outcome(run)
    return out


def _ddp_config_checks(impl: str, label: str, per_rank: list[dict]) -> list[Check]:
    """Broadcast at construction, gradients vs one process (with the likely mistake), same weights on every rank."""
    checks = []
    diff = sorted({k for r in per_rank for k in r["start_diff"]})
    checks.append(Check("ddp", impl, f"rank 0's weights at construction, {label}", FAIL if diff else PASS,
                        f"after construction, rank(s) {[i for i, r in enumerate(per_rank) if r['start_diff']]} still "
                        f"hold their own {', '.join(diff[:4])}{' ...' if len(diff) > 4 else ''} (parameters differ at "
                        "step 0: not broadcast from rank 0)" if diff else "every rank starts from rank 0's weights"))
    steps = [(rank, s) for rank, r in enumerate(per_rank) for s in r["steps"]]
    bad = [(rank, s) for rank, s in steps if not s.finite or not s.max_ratio <= 1]
    if not bad:
        worst = max(steps, key=lambda t: t[1].max_ratio)[1]
        checks.append(Check("ddp", impl, f"gradients vs one process, {label}", PASS,
                            f"{len(per_rank[0]['steps'])} steps, worst |diff| / float32 bound {worst.max_ratio:.3g} "
                            f"at {worst.worst}"))
    else:
        rank, s = min(bad, key=lambda t: (t[1].step, t[0]))
        unsynced = _unsynced(per_rank, s.step)
        if not s.finite:
            why = "non-finite (NaN/inf) gradient"
        elif diff:
            why = "likely because the ranks did not start from rank 0's weights"
        elif s.summed_ratio <= 1:
            why = f"gradients exactly {WORLD}x one process's: summed over ranks, not averaged (divide by the world size)"
        elif unsynced:
            why = (f"{', '.join(unsynced[:4])}'s gradient differs between ranks: not synchronized (a frozen, unused or "
                   "tied parameter's handling, or a bucket never all-reduced)")
        else:
            why = "the synced gradient is not the mean of the ranks' gradients"
        checks.append(Check("ddp", impl, f"gradients vs one process, {label}", FAIL,
                            f"step {s.step}, rank {rank}: {s.where}; |diff| / float32 bound {s.max_ratio:.3g} - {why}"))
    states = [r["state"] for r in per_rank]
    differ = [k for k in states[0] if not all(torch.equal(states[0][k], st[k]) for st in states[1:])]
    checks.append(Check("ddp", impl, f"same weights on every rank after {len(per_rank[0]['steps'])} steps, {label}",
                        FAIL if differ else PASS,
                        f"ranks end with different {', '.join(differ[:4])}" if differ else "bitwise equal"))
    return checks


def _unsynced(per_rank: list[dict], step: int) -> list[str]:
    """Parameters whose synced gradient at `step` is not bitwise the same on every rank."""
    grads = [r["synced"][step] for r in per_rank if len(r["synced"]) > step]
    if len(grads) < 2:
        return []
    same = lambda a, b: (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))  # noqa: E731
    return [n for n in grads[0] if not all(same(grads[0][n], g.get(n)) for g in grads[1:])]


def _ddp_rows(impl: str, speed_per_rank: list[dict]) -> list[dict]:
    labels = {"yours": "yours", "ours": "ours", "pytorch": "pytorch"}
    rows = _timing_rows("ddp", impl, [s["samples"] for s in speed_per_rank], labels)
    first = speed_per_rank[0]
    for label in first["sent"]:
        hidden = label == "pytorch"  # torch DDP's C++ reducer calls the process group directly: nothing to count
        rows.append({"topic": "ddp", "impl": impl, "measure": "bytes sent per step (rank 0)", "who": label,
                     "value": float("nan") if hidden else first["sent"][label] / MiB, "unit": "MiB",
                     **({"note": "not counted: torch DDP's reducer calls the process group from C++"} if hidden else {})})
        rows.append({"topic": "ddp", "impl": impl, "measure": "peak of a step, worst rank", "who": label,
                     "value": max(s["peak"][label] for s in speed_per_rank) / MiB, "unit": "MiB"})
    rows.append({"topic": "ddp", "impl": impl, "measure": "bytes sent per step (rank 0)", "who": "formula",
                 "value": F.wire_factor("all_reduce", WORLD) * first["grad_bytes"] / MiB, "unit": "MiB"})
    return rows


def run_ddp(adapters_path: str, opts: Options) -> TopicResult:
    """Every DDP flavour the file has (individual, bucketed, 2026's get_ddp): equivalence with one process on the toy
    model (tied, frozen, unused parameters; the bucketed one at several bucket sizes), then yours vs ours vs torch DDP."""
    result = TopicResult("ddp")
    got = _launch_each(ddp_worker, str(adapters_path), list(A.ADAPTERS["ddp"]), opts)
    for impl, per_rank in got.items():
        early = _status_checks("ddp", impl, per_rank, str(adapters_path))
        if early:
            result.checks += early
            continue
        for k, configs in enumerate(zip(*[r["configs"] for r in per_rank])):
            mb = configs[0]["bucket_mb"]
            label = "toy model" + (f", bucket {mb:.3g} MB" if mb is not None else "")
            result.checks += _ddp_config_checks(impl, label, list(configs))
        if per_rank[0]["speed"]:
            result.rows += _ddp_rows(impl, [r["speed"] for r in per_rank])
            same = all(r["speed"]["same_weights"] for r in per_rank)
            result.rows.append({"topic": "ddp", "impl": impl, "measure": "same weights as ours and torch DDP after "
                                "the timed steps", "who": "yours", "value": same, "unit": ""})
    return result
