"""`yours` for the distributed topics: a student's DDP (each flavour), sharded optimizer and FSDP, checked against one
process, accounted (memory, bytes) against the formulas, and timed beside ours and PyTorch's.

    result = run_ddp("path/to/tests/adapters.py", Options())       # TopicResult: checks + side-by-side rows
    result = run_sharding(path, Options()); result = run_fsdp(path, Options(repeat=3))

The student's code runs only in ranks started by helpers.launch (2 ranks, gloo, CPU); each rank imports the adapters
file itself. A crashed rank (signal named), a hung collective (after Options.timeout_s) or an exception in the
student's code becomes an "error" check naming file:line, and the topic's other implementations are then run in
launches of their own, so one broken flavour never hides the others. Two kinds of check (report.Check.beyond):
- within the handout's contract (they decide the exit status): the course's own test models and procedures
  (course_models: ToyModel and ToyModelWithTiedWeights built with a seed per rank for DDP, one seed for the sharded
  optimizer, the cs336_basics layers with one seed for FSDP), with the tolerances the course's tests assert;
- beyond it (reported, never in the exit status): our toy with tied, frozen and unused parameters and a per-rank
  buffer, torch.nn layers seeded per rank, memory and bytes against the formulas, the timings; these are the
  experiments' own checks (helpers.experiments.ddp / sharding / fsdp) with the student's implementation in place of ours.
Each phase (a check, the timing, the memory and bytes) runs apart: an exception in one is its own error row, located at
the deepest frame in the student's files.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import re
import sysconfig
import traceback
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
from helpers.course.yours import course_models as CM
from helpers.course.yours.report import (CHECK_COLUMNS, ERROR, FAIL, NOT_IMPLEMENTED, PASS, SKIPPED, Check,
                                         TopicResult)
from helpers.ddp import wrap
from helpers.experiments import ddp as XD
from helpers.experiments import fsdp as XF
from helpers.experiments import sharding as XS
from helpers.experiments.common import make_batches, make_model, rank_rows, rank_share, slowest_rank
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
    except A.AdaptersError as exc:  # the file failed to import: the same on every rank, its file:line in the message
        return {"status": ERROR, "detail": str(exc)}


_OUTSIDE = ("site-packages", "dist-packages", "/.venv/", sysconfig.get_paths()["stdlib"],
            str(Path(torch.__file__).parent), str(Path(__file__).parents[2]))  # installed packages (a .venv inside the
#                                    repository too), the standard library, torch, the companion: never the student's


def _student_frame(frames: list[tuple[str, str]], path: str) -> str:
    """file:line of the deepest frame in the student's files: under the assignment root and outside installed
    packages (a .venv inside the repository included); else the deepest frame outside those; else the deepest."""
    root = str(A.assignment_root(Path(path)))
    theirs = [f for f in frames if not any(o in f[0] for o in _OUTSIDE)]
    mine = [f for f in theirs if f[0].startswith(root)] or theirs or frames
    return f"{mine[-1][0]}:{mine[-1][1]}" if mine else "?"


def _phase(path: str, fn) -> dict:
    """fn()'s dict with status "ok", or its exception as {"status": ERROR, "detail": "Type: message (at file:line)"}:
    one phase's failure kept apart from the others. Unusable (the implementation cannot be checked at all) propagates."""
    try:
        return {"status": "ok", **fn()}
    except (Unusable, A.AdaptersError):
        raise
    except Exception as exc:  # noqa: BLE001 - a student's exception is a result, not a crash of the checker
        frames = [(f.filename, str(f.lineno)) for f in traceback.extract_tb(exc.__traceback__)]
        return {"status": ERROR, "detail": f"{type(exc).__name__}: {exc} (at {_student_frame(frames, path)})"}


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
    """file:line of the deepest frame of the student's files in a traceback's text (_student_frame)."""
    return _student_frame(re.findall(r'File "([^"]+)", line (\d+)', text or ""), path)


def _failure_detail(exc: BaseException, path: str) -> str:
    """One paragraph for a launch that failed: the rank and its error (signal, timeout) and where in the student's code."""
    if isinstance(exc, TimeoutError):
        return (f"hung: {str(exc).split(' and was stopped')[0]} - a rank is waiting in a collective another rank never "
                "entered (same calls, same order, on every rank?)")
    first = str(exc).split("\n")[0]
    if " before or outside the worker's Python code" in first:  # no Python traceback: a signal or os._exit
        return (first.split(" before or outside")[0] + " while running the student's adapters: a crash outside Python "
                "(a segfault in native code, out of memory, os._exit), not an exception")
    tb = getattr(exc, "remote_traceback", None)
    return f"{first} (at {_where_in(tb, path)})" if tb else first


PARTS = ("course", "beyond")  # a worker's two parts: the checks within the handout's contract, and the probes beyond it


def _launch_each(worker, path: str, impls: list[str], opts: Options) -> dict:
    """impl -> the worker's per-rank results, or the exception that stopped its launch. All implementations in one
    launch; if it fails, each in a launch of its own, so a crash or hang is pinned on the implementation that caused
    it; if that fails too, the course's checks alone, then the probes beyond them alone: a crash or hang beyond the
    handout keeps the contract's results (each rank's dict then has "beyond_failed", what stopped the probes)."""
    def launch(names, parts=PARTS):
        return L.launch(functools.partial(worker, path, names, opts, parts), WORLD, backend="gloo", device="cpu",
                        timeout_s=opts.timeout_s)
    try:
        per_rank = launch(impls)
        return {impl: [r[impl] for r in per_rank] for impl in impls}
    except (L.RankError, TimeoutError) as exc:
        first = exc
    out = {}
    for impl in impls:
        try:
            if len(impls) > 1:
                out[impl] = [r[impl] for r in launch([impl])]
                continue
        except (L.RankError, TimeoutError) as exc:
            first = exc
        try:
            course = [r[impl] for r in launch([impl], ("course",))]
        except (L.RankError, TimeoutError):
            out[impl] = first  # the contract's part fails alone too: the implementation's error
            continue
        try:
            beyond = [r[impl] for r in launch([impl], ("beyond",))]
            out[impl] = [{**b, **{k: v for k, v in c.items() if v is not None}} for c, b in zip(course, beyond)]
        except (L.RankError, TimeoutError) as exc:
            out[impl] = [{**c, "beyond_failed": _failure_detail(exc, path)} for c in course]
    return out


def _beyond_failed(topic: str, impl: str, per_rank: list[dict]) -> list[Check]:
    """The ERROR row for probes beyond the handout whose launch crashed or hung (the contract's checks stand)."""
    if not isinstance(per_rank[0], dict) or "beyond_failed" not in per_rank[0]:
        return []
    return [Check(topic, impl, "beyond the handout: the probes run on 2 ranks", ERROR, per_rank[0]["beyond_failed"],
                  beyond=True)]


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
        self.ddp = _callable_wrapper(_called(ctor, *args), ctor)
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


def _callable_wrapper(out, ctor):
    """The student's wrapper as the course's tests use it: called on the inputs, .parameters() and .named_parameters()
    read (an nn.Module, or a plain class with __call__ and __getattr__ delegating to the model); Unusable otherwise."""
    if not callable(out) or not callable(getattr(out, "parameters", None)):
        raise Unusable(ERROR, f"{ctor.__name__} returned {type(out).__name__}, expected a wrapper the course's tests "
                              "can call on the inputs and read .parameters() / .named_parameters() of")
    return out


def _by_position(model: nn.Module, wrapper) -> dict:
    """The wrapper's parameters under the model's names, paired in order as the course's tests pair them (zip of
    named_parameters()): any prefix the wrapper adds ("module.", "model.") is fine; Unusable when the counts differ."""
    mine = list(wrapper.parameters())
    names = [n for n, _ in model.named_parameters()]
    if len(mine) != len(names):
        raise Unusable(ERROR, f"the wrapper's parameters() yields {len(mine)} tensors, the model has {len(names)}: the "
                              "course's tests read the model's parameters through the wrapper, in the model's order")
    return dict(zip(names, mine))


# ---- DDP within the handout's contract: the course's test (2025/2026 tests/test_ddp.py; 2024 test_ddp_*.py) ----

COURSE_BUCKETS_MB = (0.0016, 0.0001, 0.01)  # the 2024 bucketed test's sizes: two buckets, one per tensor, one bucket
ALLCLOSE = dict(rtol=1e-5, atol=1e-8)  # the DDP tests compare with torch.allclose's defaults after every step


def _close_ratio(got: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> tuple[float, tuple]:
    """max |got - ref| / (atol + rtol |ref|) (allclose passes at <= 1) and where; inf where got is not finite."""
    r = torch.nan_to_num((got - ref).abs() / (atol + rtol * ref.abs()), nan=float("inf"))
    i = tuple(int(k) for k in np.unravel_index(int(r.argmax()), tuple(r.shape))) if r.numel() else ()
    return (float(r.max()) if r.numel() else 0.0), i


def course_ddp_run(fns, impl: str, model: str, bucket_mb) -> dict:
    """The course's DDP test on this rank: the model seeded by the rank, a deepcopy wrapped (the broadcast must give
    rank 0's parameters), 5 SGD steps (lr 0.1, MSE) on this rank's 10 of 20 rows with the adapters' hooks, each step
    compared (allclose, the test's tolerance) with rank 0's model trained in one process on all 20 rows."""
    rank, cls = dist.get_rank(), CM.MODELS[model]
    torch.manual_seed(rank)
    local = cls()
    torch.manual_seed(0)
    ref = cls()  # rank 0's model: the one-process reference on every rank
    shim = StudentDDP(fns, impl, copy.deepcopy(local), bucket_mb)
    mine = _by_position(ref, shim.ddp)
    start_diff = [n for n, p in ref.named_parameters() if not torch.equal(mine[n].detach(), p.detach())]
    shim.optimizer = opt = torch.optim.SGD(shim.ddp.parameters(), lr=CM.DDP_LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=CM.DDP_LR)
    x, y = CM.ddp_data()
    rows, steps = rank_rows(x.shape[0], rank, WORLD), []
    for i in range(CM.DDP_STEPS):
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        g_ref = {n: p.grad.detach().clone() for n, p in ref.named_parameters() if p.grad is not None}
        ref_opt.step()
        opt.zero_grad()
        shim.on_train_batch_start()
        nn.functional.mse_loss(shim(x[rows]), y[rows]).backward()
        shim.finish_gradient_synchronization()
        grads = {n: p.grad.detach().clone() for n, p in mine.items() if p.grad is not None}
        opt.step()
        ratios = {n: _close_ratio(mine[n].detach(), p.detach(), **ALLCLOSE) for n, p in ref.named_parameters()}
        worst = max(ratios, key=lambda n: ratios[n][0])
        i_w = ratios[worst][1]
        steps.append({
            "ratio": ratios[worst][0],
            "where": (f"{worst}[{', '.join(map(str, i_w))}]: yours {float(mine[worst].detach()[i_w]):.6g}, one process "
                      f"{float(dict(ref.named_parameters())[worst].detach()[i_w]):.6g}"),
            "finite": all(bool(torch.isfinite(g).all()) for g in grads.values()),
            "summed": bool(g_ref) and all(n in grads and torch.allclose(grads[n], WORLD * g, **ALLCLOSE)
                                          and not torch.allclose(grads[n], g, **ALLCLOSE) for n, g in g_ref.items()),
            "zeros": sorted(n for n, g in g_ref.items() if bool(g.any()) and (n not in grads or not grads[n].any())),
            "grads": _digest(grads)})
        x, y = CM.shuffled(i, x, y)
    return {"start_diff": start_diff, "steps": steps, "final": _digest({n: p for n, p in mine.items()})}


def _course_ddp_checks(impl: str, label: str, per_rank: list[dict]) -> list[Check]:
    """The course test's two assertions, on every rank: rank 0's parameters after construction; after each step the
    parameters allclose to one process's. A diagnosis only when its whole signature is there."""
    after = A.ADAPTERS["ddp"][impl][1]
    diff = sorted({n for r in per_rank for n in r["start_diff"]})
    ranks = [i for i, r in enumerate(per_rank) if r["start_diff"]]
    checks = [Check("ddp", impl, f"{label}: rank 0's parameters after construction", FAIL if diff else PASS,
                    f"rank(s) {ranks} still hold their own {', '.join(diff[:4])} after construction: not broadcast from "
                    "rank 0" if diff else "every rank starts from rank 0's parameters")]
    bad = [(s, rank) for rank, r in enumerate(per_rank) for s, st in enumerate(r["steps"]) if not st["ratio"] <= 1]
    prop = f"{label}: {CM.DDP_STEPS} SGD steps vs one process (allclose)"
    if not bad:
        worst = max(st["ratio"] for r in per_rank for st in r["steps"])
        checks.append(Check("ddp", impl, prop, PASS, f"every step on every rank; worst |diff| / (atol + rtol |w|) "
                                                     f"{worst:.3g}"))
        return checks
    s, rank = min(bad)
    st = per_rank[rank]["steps"][s]
    digests = [r["steps"][s]["grads"] for r in per_rank]
    unsynced = sorted({n for d in digests[1:] for n in set(d) | set(digests[0]) if d.get(n) != digests[0].get(n)})
    why = ""
    if not st["finite"]:
        why = " - a gradient is not finite (NaN/inf) after " + after
    elif diff:
        why = " - the ranks did not start from rank 0's parameters (the check above)"
    elif all(r["steps"][s]["summed"] for r in per_rank):
        why = f" - every gradient is {WORLD}x one process's: summed over ranks, not averaged (divide by the world size)"
    elif unsynced:
        why = (f" - {', '.join(unsynced[:4])}'s gradient is not the same on every rank after {after}: not all-reduced "
               "before the optimizer step")
    elif st["zeros"] and all(r["steps"][s]["zeros"] == st["zeros"] for r in per_rank):
        why = (f" - {', '.join(st['zeros'][:4])}'s gradient is all zeros after {after} on every rank, one process's is "
               "not: what was all-reduced and copied back was not this gradient (read before backward produced it?)")
    checks.append(Check("ddp", impl, prop, FAIL, f"step {s}, rank {rank}: {st['where']}; |diff| / (atol + rtol |w|) "
                                                 f"{st['ratio']:.3g}, allclose's bound 1{why}"))
    return checks


def _course_ddp_configs(impl: str) -> list[tuple[str, float | None]]:
    """(model, bucket size) pairs the course's tests run a flavour on: both toy models, each bucket size for bucketed."""
    sizes = COURSE_BUCKETS_MB if impl == "bucketed" else (None,)
    return [(m, mb) for m in CM.MODELS for mb in sizes]


# ---- DDP beyond the handout: our toy (tied, frozen, unused parameters, a per-rank buffer), gradients vs float64 ----
# Beyond: the course's toy models have no unused parameter that requires a gradient and no buffer, and the handout
# asks for the parameters to be broadcast (2024-2026 DDP problems); a float64-derived bound is ours, not the tests'.

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


def ddp_worker(path: str, impls: list[str], opts: Options, parts=PARTS) -> dict:
    """In each rank, per DDP flavour: the course's test on its models (each bucket size for the bucketed one), then
    beyond the handout our toy model at several bucket sizes, then the side-by-side timing; each in a phase of its
    own (an exception in one is its error, the others still run). {impl: outcome}."""
    out = {}
    for impl in impls:
        def run(impl=impl):
            fns = _adapter_fns(path, "ddp", impl)
            course = beyond = speed = None
            if "course" in parts:
                course = [_phase(path, functools.partial(course_ddp_run, fns, impl, m, mb))
                          for m, mb in _course_ddp_configs(impl)]
            if "beyond" in parts:
                sizes = ddp_bucket_sizes() if impl == "bucketed" else [None]
                beyond = [_phase(path, functools.partial(_ddp_config, fns, impl, mb)) for mb in sizes]
                speed = _phase(path, lambda: _ddp_speed(fns, impl, opts)) if opts.timed and opts.steps else None
            return {"course": course, "configs": beyond, "speed": speed}
        out[impl] = _outcome(run)
    return out


def _phase_error(topic: str, impl: str, prop: str, per_rank: list[dict], beyond: bool) -> Check | None:
    """An ERROR check when a phase raised on some rank (its first rank's message), else None."""
    bad = [(rank, r) for rank, r in enumerate(per_rank) if r["status"] != "ok"]
    if not bad:
        return None
    rank, r = bad[0]
    return Check(topic, impl, prop, r["status"], f"rank {rank}: {r['detail']}", beyond=beyond)


def _ddp_config_checks(impl: str, label: str, per_rank: list[dict]) -> list[Check]:
    """Broadcast at construction, gradients vs one process (with the likely mistake), same weights on every rank."""
    checks = []
    diff = sorted({k for r in per_rank for k in r["start_diff"]})
    buffers = {n for n, _ in make_model("toy", 0).named_buffers()}
    checks.append(Check("ddp", impl, f"rank 0's weights at construction, {label}", FAIL if diff else PASS,
                        f"after construction, rank(s) {[i for i, r in enumerate(per_rank) if r['start_diff']]} still "
                        f"hold their own {', '.join(diff[:4])}{' ...' if len(diff) > 4 else ''} ("
                        + ("buffers only: the parameters were broadcast, the buffers not; the handout asks for the "
                           "parameters, and the course's models have no buffer)" if set(diff) <= buffers else
                           "not broadcast from rank 0)") if diff else "every rank starts from rank 0's weights"))
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
            why = "the ranks did not start from rank 0's weights (the check above)"
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
    """Every DDP flavour the file has (individual, bucketed, 2026's get_ddp): the course's test on its two toy models
    (at the 2024 test's bucket sizes), then beyond the handout our toy (tied, frozen and unused parameters, a buffer)
    at several bucket sizes, then yours vs ours vs torch DDP."""
    result = TopicResult("ddp")
    got = _launch_each(ddp_worker, str(adapters_path), list(A.ADAPTERS["ddp"]), opts)
    for impl, per_rank in got.items():
        early = _status_checks("ddp", impl, per_rank, str(adapters_path))
        if early:
            result.checks += early
            continue
        for k, (model, mb) in enumerate(_course_ddp_configs(impl)):
            label = model + (f", bucket {mb:g} MB" if mb is not None else "")
            runs = [r["course"][k] for r in per_rank]
            error = _phase_error("ddp", impl, f"{label}: the course's DDP test runs", runs, beyond=False)
            result.checks += [error] if error else _course_ddp_checks(impl, label, runs)
        if _beyond_failed("ddp", impl, per_rank):
            result.checks += _beyond_failed("ddp", impl, per_rank)
            continue
        for configs in zip(*[r["configs"] for r in per_rank]):
            configs = list(configs)
            error = _phase_error("ddp", impl, "beyond the handout: our toy model (tied, frozen, unused, buffer) runs",
                                 configs, beyond=True)
            if error:
                result.checks.append(error)
                continue
            mb = configs[0]["bucket_mb"]
            label = "our toy model (tied, frozen, unused, buffer)" + (f", bucket {mb:.3g} MB" if mb is not None else "")
            for c in _ddp_config_checks(impl, label, configs):
                c.beyond, c.prop = True, f"beyond the handout: {c.prop}"
                result.checks.append(c)
        speed = [r["speed"] for r in per_rank]
        if speed[0] is not None:
            error = _phase_error("ddp", impl, "beyond the handout: timing, bytes and peak on small/cpu", speed, True)
            if error:
                result.checks.append(error)
                continue
            result.rows += _ddp_rows(impl, speed)
            same = all(r["same_weights"] for r in speed)
            result.rows.append({"topic": "ddp", "impl": impl, "measure": "same weights as ours and torch DDP after "
                                "the timed steps", "who": "yours", "value": same, "unit": ""})
    return result


# ======================================= sharded optimizer =======================================

SHARDING_MEMORY = dict(model="small/cpu", batch_size=2, context_length=16)  # state bytes: a model with a formula


def _student_optimizer(fns: dict):
    """The student's get_sharded_optimizer as build()'s `impl` (params, optimizer_cls, **kwargs) -> Optimizer."""
    ctor = _required(fns, "get_sharded_optimizer")

    def make(params, optimizer_cls, **kwargs):  # the course's test calls zero_grad() and step(): nothing else asked
        opt = _called(ctor, params, optimizer_cls, **kwargs)
        if not all(callable(getattr(opt, m, None)) for m in ("zero_grad", "step")):
            raise Unusable(ERROR, f"get_sharded_optimizer returned {type(opt).__name__}, expected an optimizer (the "
                                  "course's test calls its zero_grad() and step())")
        return opt
    return make


def course_sharding_run(make, model: str) -> dict:
    """The course's sharded-optimizer test (2025/2026 tests/test_sharded_optimizer.py) on this rank: one seed on every
    rank, the model deep-copied, AdamW (lr 0.1, weight decay 0.1) unsharded beside yours, 10 steps of a summed squared
    error on the same 32 rows on every rank; both models' final weights."""
    cls = CM.MODELS[model]
    torch.manual_seed(42)
    ref = cls()
    mine = copy.deepcopy(ref)
    ref_opt = torch.optim.AdamW(ref.parameters(), **CM.SHARDING_ADAMW)
    opt = make(mine.parameters(), torch.optim.AdamW, **CM.SHARDING_ADAMW)
    gen = torch.Generator().manual_seed(0)
    for _ in range(CM.SHARDING_STEPS):
        x, y = torch.rand(CM.SHARDING_ROWS, 10, generator=gen), torch.rand(CM.SHARDING_ROWS, 5, generator=gen)
        for net, o in ((ref, ref_opt), (mine, opt)):
            o.zero_grad()
            ((y - net(x)) ** 2).sum().backward()
            o.step()
    return {"ref": _cpu_params(ref), "mine": _cpu_params(mine)}


def _cpu_params(net: nn.Module) -> dict:
    return {n: p.detach().cpu().clone() for n, p in net.named_parameters()}


def course_state_growth(make) -> dict:
    """Bytes of tensors the first optimizer step leaves alive (the optimizer state it creates) on this rank, unsharded
    AdamW's and yours, on the course's ToyModel; and the smallest trainable tensor's state (2 moments, float32)."""
    out = {}
    for who, build in (("unsharded", lambda ps: torch.optim.AdamW(ps, **CM.SHARDING_ADAMW)),
                       ("yours", lambda ps: make(ps, torch.optim.AdamW, **CM.SHARDING_ADAMW))):
        torch.manual_seed(42)
        net = CM.ToyModel()
        opt = build(net.parameters())
        x = torch.rand(CM.SHARDING_ROWS, 10, generator=torch.Generator().manual_seed(0))
        net(x).pow(2).sum().backward()
        trace = M.track(lambda: (opt.step(), dist.barrier()),  # the barrier: the backend lets go of a broadcast's buffer
                        existing=list(net.parameters()) + [p.grad for p in net.parameters() if p.grad is not None])
        out[who] = trace.current_bytes - trace.baseline_bytes
    out["smallest"] = 2 * 4 * min(p.numel() for p in CM.ToyModel().parameters() if p.requires_grad)
    return out


def sharding_worker(path: str, impls: list[str], opts: Options, parts=PARTS) -> dict:
    """In each rank, per implementation, each phase apart: the course's test on its two models and the state each
    rank keeps (within the handout); beyond it, unsharded AdamW, ours and yours on our toy model (bitwise), the state
    after one step of small/cpu vs the formula, and the three timed interleaved with torch's ZeRO."""
    out = {}
    for impl in impls:
        def run():
            make = _student_optimizer(_adapter_fns(path, "sharding", impl))
            course = partition = None
            if "course" in parts:
                course = [_phase(path, functools.partial(course_sharding_run, make, m)) for m in CM.MODELS]
                partition = _phase(path, lambda: course_state_growth(make))

            def beyond():  # bitwise (ours), on our toy (buffer, unused parameter): past the test's allclose
                runs = XS.equivalence_worker(model="toy", kinds=["unsharded", "sharded", "yours"], optimizer="adamw",
                                             impls={"yours": make}, **TOY)
                return {"runs": {k: {"weights": _digest(r.weights) if dist.get_rank() else r.weights,
                                     "same_grads": r.same_grads, "collectives": r.collectives[-1]}
                                 for k, r in runs.items()}}

            def memory():  # a balanced partition (1/N + a tensor) on small/cpu: the handout asks for a partition
                mem = XS.memory_worker(kinds=["unsharded", "sharded", "torch_zero", "yours"], impls={"yours": make},
                                       steps=1, **SHARDING_MEMORY)
                return {"growth": {k: _after(r, "after step") - _after(r, "before step") for k, r in mem.items()},
                        "peak": {k: max(p.peak for p in r.points) for k, r in mem.items()}}

            def timed():
                speed = XS.speed_worker(kinds=["unsharded", "sharded", "torch_zero", "yours"], steps=opts.steps,
                                        warmup=opts.warmup, impls={"yours": make}, **SPEED)
                return {"samples": {k: [s["fwd_bwd"] + s["step"] for s in v] for k, v in speed.samples.items()},
                        "same_weights": speed.same_weights}
            if "beyond" not in parts:
                return {"course": course, "partition": partition, "beyond": None, "memory": None, "speed": None}
            return {"course": course, "partition": partition, "beyond": _phase(path, beyond),
                    "memory": _phase(path, memory),
                    "speed": _phase(path, timed) if opts.timed and opts.steps else None}
        out[impl] = _outcome(run)
    return out


def _after(run, point: str) -> int:
    return next(p.live for p in run.points if p.point == point and p.step == 1)


def run_sharding(adapters_path: str, opts: Options) -> TopicResult:
    """The sharded optimizer: within the handout, the course's test (allclose to unsharded AdamW on ToyModel and
    ToyModelWithTiedWeights) and each rank keeping only part of the state; beyond it, bitwise equality on our toy,
    each rank's state at most 1/N of the total plus its largest tensor on small/cpu, and yours vs ours vs torch's
    ZeroRedundancyOptimizer."""
    result = TopicResult("sharding")
    for impl, per_rank in _launch_each(sharding_worker, str(adapters_path), list(A.ADAPTERS["sharding"]), opts).items():
        early = _status_checks("sharding", impl, per_rank, str(adapters_path))
        if early:
            result.checks += early
            continue
        for k, model in enumerate(CM.MODELS):
            runs = [r["course"][k] for r in per_rank]
            error = _phase_error("sharding", impl, f"{model}: the course's sharded-optimizer test runs", runs, False)
            result.checks += [error] if error else _course_sharding_checks(impl, model, runs)
        parts = [r["partition"] for r in per_rank]
        error = _phase_error("sharding", impl, "ToyModel: optimizer state partitioned over ranks", parts, False)
        result.checks += [error] if error else [_partition_check(impl, parts)]
        if _beyond_failed("sharding", impl, per_rank):
            result.checks += _beyond_failed("sharding", impl, per_rank)
            continue
        beyond = [r["beyond"] for r in per_rank]
        error = _phase_error("sharding", impl, "beyond the handout: our toy model runs", beyond, True)
        result.checks += [error] if error else _sharding_checks(impl, beyond)
        memory = [r["memory"] for r in per_rank]
        error = _phase_error("sharding", impl, "beyond the handout: state per rank on small/cpu runs", memory, True)
        result.checks += [error] if error else [_state_check(impl, memory)]
        speed = [r["speed"] for r in per_rank] if per_rank[0]["speed"] is not None else None
        error = speed and _phase_error("sharding", impl, "beyond the handout: timing on small/cpu", speed, True)
        if error:
            result.checks.append(error)
        result.rows += _sharding_rows(impl, beyond, memory, None if error else speed)
    return result


def _course_sharding_checks(impl: str, model: str, per_rank: list[dict]) -> list[Check]:
    """Final weights vs unsharded AdamW's on every rank, with the test's numpy.testing.assert_allclose (rtol 1e-7)."""
    worst = None
    for rank, r in enumerate(per_rank):
        for n, ref in r["ref"].items():
            ratio, i = _close_ratio(r["mine"][n], ref, rtol=1e-7, atol=0.0)
            if worst is None or ratio > worst[0]:
                worst = (ratio, rank, n, i, float(r["mine"][n][i]), float(ref[i]))
    ratio, rank, n, i, got, want = worst
    prop = f"{model}: {CM.SHARDING_STEPS} AdamW steps vs unsharded (allclose, rtol 1e-7)"
    detail = (f"worst rank {rank}, {n}[{', '.join(map(str, i))}]: yours {got:.8g}, unsharded {want:.8g}; |diff| / "
              f"(rtol |w|) {ratio:.3g}")
    return [Check("sharding", impl, prop, PASS if ratio <= 1 else FAIL, detail)]


def _partition_check(impl: str, per_rank: list[dict]) -> Check:
    """Each rank keeps state for only part of the parameters (the handout: each rank updates the ones it owns): the
    state the first step leaves on every rank is below unsharded AdamW's by at least the smallest tensor's moments."""
    full, least = per_rank[0]["unsharded"], per_rank[0]["smallest"]
    worst = max(range(len(per_rank)), key=lambda i: per_rank[i]["yours"])
    held = per_rank[worst]["yours"]
    ok = held <= full - least
    detail = (f"rank {worst} keeps {held} B of optimizer state after the first step, unsharded AdamW {full} B; "
              f"partitioned, no rank keeps the state of every parameter (bound {full} - {least} B, the smallest "
              "tensor's two moments)")
    if not ok and held >= full:
        detail += " - every rank keeps the whole state: not partitioned (step only the parameters this rank owns)"
    return Check("sharding", impl, "ToyModel: optimizer state partitioned over ranks", PASS if ok else FAIL, detail)


def _sharding_checks(impl: str, per_rank: list[dict]) -> list[Check]:
    checks, steps = [], TOY["steps"]
    ref, mine = per_rank[0]["runs"]["unsharded"]["weights"], per_rank[0]["runs"]["yours"]["weights"]
    differ = [k for k in ref if not torch.equal(ref[k], mine[k])]
    if differ:
        k = max(differ, key=lambda k: float((ref[k] - mine[k]).abs().max()))
        d = (mine[k] - ref[k]).abs()
        index = tuple(int(i) for i in np.unravel_index(int(torch.nan_to_num(d, nan=float("inf")).argmax()), d.shape))
        why = ("" if all(per_rank[0]["runs"]["yours"]["same_grads"]) else
               "; the averaged gradients it read already differed (does it change .grad?)")
        checks.append(Check("sharding", impl, f"bitwise equal to unsharded AdamW after {steps} steps (toy model)", FAIL,
                            f"{len(differ)} of {len(ref)} tensors differ on rank 0, most {k}[{', '.join(map(str, index))}]"
                            f": yours {float(mine[k][index]):.6g}, unsharded {float(ref[k][index]):.6g} (|diff| "
                            f"{float(d[index]):.3g}, bound 0: the same arithmetic in the same order){why}"))
    else:
        checks.append(Check("sharding", impl, f"bitwise equal to unsharded AdamW after {steps} steps (toy model)", PASS,
                            f"all {len(ref)} tensors bitwise equal on rank 0"))
    digests = [_digest(mine)] + [r["runs"]["yours"]["weights"] for r in per_rank[1:]]
    split = [k for k in digests[0] if any(d[k] != digests[0][k] for d in digests[1:])]
    checks.append(Check("sharding", impl, "same weights on every rank", FAIL if split else PASS,
                        f"ranks hold different {', '.join(split[:4])}: an owner's update not broadcast" if split
                        else "bitwise equal on every rank"))
    return [Check(c.topic, c.impl, "beyond the handout: " + c.prop, c.status, c.detail, beyond=True) for c in checks]


def _state_check(impl: str, per_rank: list[dict]) -> Check:
    """Beyond the handout: each rank's state after one step of small/cpu at most 1/N of the whole + its largest
    tensor (a balanced partition by whole tensors)."""
    full = max(r["growth"]["unsharded"] for r in per_rank)
    slack = XS.whole_tensor_slack(SHARDING_MEMORY["model"])
    limit = full / WORLD + slack
    worst = max(range(len(per_rank)), key=lambda i: per_rank[i]["growth"]["yours"])
    held = per_rank[worst]["growth"]["yours"]
    detail = (f"rank {worst} holds {held / MiB:.3f} MiB of optimizer state after the first step ({held / full:.0%} of "
              f"unsharded AdamW's {full / MiB:.3f} MiB); bound 1/{WORLD} + its largest tensor = {limit / MiB:.3f} MiB")
    if held > limit:
        detail += (" - each rank holds all the state: sharded state not partitioned (step only the parameters this "
                   "rank owns)" if held >= 0.9 * full else " - the partition is unbalanced")
    return Check("sharding", impl, f"beyond the handout: state per rank <= 1/{WORLD} + largest tensor (small/cpu)",
                 FAIL if held > limit else PASS, detail, beyond=True)


def _sharding_rows(impl: str, beyond: list[dict], memory: list[dict], speed: list[dict] | None) -> list[dict]:
    labels = {"yours": "yours", "sharded": "ours", "torch_zero": "pytorch", "unsharded": "unsharded AdamW"}
    rows = []
    per_rank = memory
    for kind in ("yours", "sharded", "torch_zero", "unsharded") if memory[0]["status"] == "ok" else ():
        rows.append({"topic": "sharding", "impl": impl, "measure": "optimizer state per rank, worst rank",
                     "who": labels[kind], "value": max(r["growth"][kind] for r in per_rank) / MiB, "unit": "MiB"})
        rows.append({"topic": "sharding", "impl": impl, "measure": "peak over a step, worst rank", "who": labels[kind],
                     "value": max(r["peak"][kind] for r in per_rank) / MiB, "unit": "MiB"})
    rows.append({"topic": "sharding", "impl": impl, "measure": "optimizer state per rank, worst rank", "who": "formula",
                 "value": max(F.state_bytes("sharded", SHARDING_MEMORY["model"], WORLD, r) for r in range(WORLD)) / MiB,
                 "unit": "MiB"})
    # the optimizer's own collectives: the all-reduce is the shared DDPBucketed's
    for kind in ("yours", "sharded") if beyond[0]["status"] == "ok" else ():
        log = [(op, b) for op, b in beyond[0]["runs"][kind]["collectives"] if op != "all_reduce"]
        rows.append({"topic": "sharding", "impl": impl, "measure": "bytes sent by step() (rank 0, toy model)",
                     "who": labels[kind], "value": _sent(log, WORLD) / MiB, "unit": "MiB"})
    if speed:
        rows += _timing_rows("sharding", impl, [r["samples"] for r in speed], labels)
        rows.append({"topic": "sharding", "impl": impl, "measure": "same weights as unsharded after the timed steps",
                     "who": "yours", "value": all(r["same_weights"]["yours"] for r in speed), "unit": ""})
    return rows


# ======================================= FSDP =======================================

def _student_fsdp(fns: dict) -> XF.FsdpImpl:
    """The student's get_fsdp / fsdp_on_after_backward / fsdp_gather_full_params as an FsdpImpl (get_fsdp called with
    compute_dtype= as the 2026 test calls it), return kinds checked."""
    ctor, after, gather = (_required(fns, n) for n in A.ADAPTERS["fsdp"]["fsdp"])

    def gathered(model):
        out = _called(gather, model, expect=dict, what="a dict {parameter name: full tensor}")
        return {k: v.detach().float().cpu().clone() for k, v in out.items()}
    return XF.FsdpImpl(wrap=lambda module, dtype: _callable_wrapper(_called(ctor, module, compute_dtype=dtype), ctor),
                       on_after_backward=lambda model, opt: _called(after, model, opt),
                       gather_full_params=gathered)


# ---- FSDP within the handout's contract: the 2026 test (tests/test_fsdp.py) on the cs336_basics layers ----

class _NotAsked(Exception):
    """The launch asked for the probes beyond the handout only."""


COURSE_FSDP_DTYPES = ("fp32", "fp16")  # the 2026 test: compute_dtype None and torch.float16
COURSE_FSDP_TOL = {"fp32": dict(atol=1e-6, rtol=1e-4), "fp16": dict(atol=1e-4, rtol=1e-4)}  # its allclose per dtype
COURSE_FSDP_GRAD_TOL = dict(atol=1e-4, rtol=1e-4)  # its replicated gradients across ranks


def _course_layers():
    """The student's cs336_basics.model (the 2026 FSDP test builds its model from it) and its sharded layer types."""
    import importlib

    layers = importlib.import_module("cs336_basics.model")
    return layers, (layers.Linear, layers.Embedding)


def course_fsdp_run(impl: XF.FsdpImpl, dtype: str) -> dict:
    """The 2026 FSDP correctness test on this rank: one seed (42) on every rank, get_fsdp(deepcopy(model),
    compute_dtype), 3 SGD steps (lr 0.01, cross-entropy on the last position) on this rank's 10 of 20 rows, after each
    fsdp_gather_full_params vs one process on all rows (with the same mixed precision); max |diff| / (atol + rtol |w|)."""
    layers, shard_types = _course_layers()
    rank, cdt = dist.get_rank(), XF.DTYPES[dtype]
    torch.manual_seed(42)
    base = CM.FSDPToyModel(layers)
    ref = copy.deepcopy(base)
    model = impl.wrap(copy.deepcopy(base), cdt)
    opt = torch.optim.SGD(model.parameters(), lr=CM.FSDP_LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=CM.FSDP_LR)
    ids, labels = CM.fsdp_data()
    rows, names, steps = rank_rows(ids.shape[0], rank, WORLD), [n for n, _ in ref.named_parameters()], []
    for s in range(CM.FSDP_STEPS):
        ref_opt.zero_grad(set_to_none=True)
        CM.reference_loss(ref, ids, labels, cdt, shard_types).backward()
        ref_opt.step()
        opt.zero_grad(set_to_none=True)
        CM.last_position_loss(model(ids[rows]), labels[rows]).backward()
        impl.on_after_backward(model, opt)
        opt.step()
        full = _aligned(impl.gather_full_params(model), names)
        ratios = {n: _close_ratio(full[n], p.detach().cpu(), **COURSE_FSDP_TOL[dtype]) for n, p in ref.named_parameters()}
        n = max(ratios, key=lambda k: ratios[k][0])
        i = ratios[n][1]
        want = float(dict(ref.named_parameters())[n].detach()[i])
        steps.append({"ratio": ratios[n][0],
                      "where": f"{n}[{', '.join(map(str, i))}]: yours {float(full[n][i]):.6g}, one process {want:.6g}"})
        ids, labels = CM.shuffled(s, ids, labels)
    return {"steps": steps}


def course_fsdp_grads(impl: XF.FsdpImpl, dtype: str) -> dict:
    """The 2026 gradient test on this rank: one seed, each rank its own 4 x 8 ids, loss = logits.sum(); after
    fsdp_on_after_backward, .module's parameters that need one have a gradient of their data's shape and dtype; the
    replicated ones' gradients (not Linear/Embedding) are returned for the cross-rank comparison."""
    layers, shard_types = _course_layers()
    torch.manual_seed(42)
    model = impl.wrap(CM.FSDPToyModel(layers), XF.DTYPES[dtype])
    ids = torch.randint(0, CM.FSDP_VOCAB, (4, CM.FSDP_SEQ), generator=torch.Generator().manual_seed(dist.get_rank()))
    opt = torch.optim.SGD(model.parameters(), lr=CM.FSDP_LR)
    model(ids).sum().backward()
    impl.on_after_backward(model, opt)
    inner = getattr(model, "module", model)
    modules, bad, replicated = dict(inner.named_modules()), [], {}
    for name, p in inner.named_parameters():
        if not p.requires_grad:
            continue
        g = p.grad
        if g is None or g.shape != p.data.shape or g.dtype != p.data.dtype:
            bad.append(f"{name}: " + ("no gradient" if g is None else f"gradient {tuple(g.shape)} {g.dtype}, data "
                                      f"{tuple(p.data.shape)} {p.data.dtype}"))
        elif not isinstance(modules[name.rsplit(".", 1)[0]] if "." in name else inner, shard_types):
            replicated[name] = g.detach().float().cpu().clone()
    return {"bad": bad, "replicated": replicated}


def course_fsdp_memory(impl: XF.FsdpImpl) -> dict:
    """Bytes live on this rank once get_fsdp has returned (the model built inside the tracked call), beside the
    model's full bytes, this rank's share of the sharded ones and the largest sharded tensor."""
    layers, shard_types = _course_layers()
    torch.manual_seed(42)
    trace = M.track_resizing(lambda: (impl.wrap(CM.FSDPToyModel(layers), None), dist.barrier()), device=L.device())
    trace.result = None
    sizes = {id(p): (p.numel(), isinstance(m, shard_types)) for m in CM.FSDPToyModel(layers).modules()
             for p in m.parameters(recurse=False)}
    sharded = [n for n, s in sizes.values() if s]
    return {"live": trace.current_bytes, "full": 4 * sum(n for n, _ in sizes.values()),
            "share": 4 * (sum(-(-n // WORLD) for n in sharded) + sum(n for n, s in sizes.values() if not s)),
            "largest": 4 * max(sharded)}


def _course_fsdp_checks(impl: str, course: dict) -> list[Check]:
    """The 2026 test's assertions from each rank's results (course[part] = per-rank phase results)."""
    checks = []
    for dtype in COURSE_FSDP_DTYPES:
        runs, prop = course[f"run {dtype}"], f"{CM.FSDP_STEPS} SGD steps vs one process ({dtype}, allclose)"
        error = _phase_error("fsdp", impl, prop, runs, beyond=False)
        if error:
            checks.append(error)
        else:
            tol = COURSE_FSDP_TOL[dtype]
            (ratio, s, rank), where = max(((st["ratio"], s, rank), st["where"]) for rank, r in enumerate(runs)
                                          for s, st in enumerate(r["steps"]))
            checks.append(Check("fsdp", impl, prop, PASS if ratio <= 1 else FAIL,
                                f"worst: step {s}, rank {rank}, {where}; |diff| / (atol {tol['atol']:g} + rtol "
                                f"{tol['rtol']:g} |w|) {ratio:.3g}"))
        grads, prop = course[f"grads {dtype}"], f"gradients after fsdp_on_after_backward ({dtype})"
        error = _phase_error("fsdp", impl, prop, grads, beyond=False)
        if error:
            checks.append(error)
            continue
        bad = [(rank, b) for rank, r in enumerate(grads) for b in r["bad"]]
        first = grads[0]["replicated"]
        split = [n for r in grads[1:] for n in first if n not in r["replicated"]
                 or not torch.allclose(first[n], r["replicated"][n], **COURSE_FSDP_GRAD_TOL)]
        detail = (f"rank {bad[0][0]}: {bad[0][1]} (every parameter that requires a gradient needs one of its data's "
                  "shape and dtype)" if bad else f"replicated {', '.join(split[:3])}'s gradient differs between ranks: "
                  "not all-reduced" if split else
                  f"shapes and dtypes of the data; {len(first)} replicated gradients equal on every rank")
        checks.append(Check("fsdp", impl, prop, FAIL if bad or split else PASS, detail))
    mem = course["memory"]
    error = _phase_error("fsdp", impl, "a shard per rank after get_fsdp", mem, beyond=False)
    if error:
        return checks + [error]
    rank = max(range(len(mem)), key=lambda i: mem[i]["live"])
    m = mem[rank]
    bound = (1 + FSDP_MEMORY_TOL) * m["share"] + m["largest"]
    detail = (f"rank {rank} holds {m['live']} B after get_fsdp; its shard (1/{WORLD} of the Linear and Embedding "
              f"weights, norm gains whole) {m['share']} B, bound that + {FSDP_MEMORY_TOL:.0%} + the largest weight "
              f"{m['largest']} B = {bound:.0f} B; the full model {m['full']} B")
    if m["live"] > bound and m["live"] >= m["full"]:
        detail += " - the full weights are still live: not sharded at init (keep only this rank's shard)"
    checks.append(Check("fsdp", impl, "a shard per rank after get_fsdp", PASS if m["live"] <= bound else FAIL, detail))
    return checks


def _fsdp_step_bytes(kind: str, impl) -> tuple[list, float]:
    """One fp32 AdamW step of a fresh model (yours or ours): the collectives it called and its peak above its start."""
    cfg = FSDP_CHECK
    net, grad_sync, opt = XF.build_kind(kind, cfg["model"], impl=impl)
    x, y = rank_share(make_batches(cfg["model"], 1, cfg["batch_size"], cfg["context_length"], 0)[0])
    XF.step(net, grad_sync, opt, x, y)  # the first step records call orders, makes optimizer state
    with count_collectives() as log:
        XF.step(net, grad_sync, opt, x, y)
    return list(log)


def fsdp_worker(path: str, impls: list[str], opts: Options, parts=PARTS) -> dict:
    """In each rank, each phase apart: the 2026 test on the cs336_basics model (fp32 and fp16; when the student's
    cs336_basics imports) and the memory after get_fsdp; beyond the handout, our TransformerLM seeded per rank with SGD
    without and with bf16 compute (opts.repeat times), memory and bytes vs the formulas, and the timing."""
    out, cfg, rank = {}, FSDP_CHECK, dist.get_rank()
    for impl_name in impls:
        def run():
            impl = _student_fsdp(_adapter_fns(path, "fsdp", impl_name))
            course = None
            try:
                if "course" not in parts:
                    raise _NotAsked
                _course_layers()
                course = {}
                for dtype in COURSE_FSDP_DTYPES:
                    course[f"run {dtype}"] = _phase(path, functools.partial(course_fsdp_run, impl, dtype))
                    course[f"grads {dtype}"] = _phase(path, functools.partial(course_fsdp_grads, impl, dtype))
                course["memory"] = _phase(path, functools.partial(course_fsdp_memory, impl))
            except _NotAsked:
                pass
            except Exception as exc:  # noqa: BLE001 - no cs336_basics: the course's test cannot run either
                course = {"missing": f"{type(exc).__name__}: {exc}"}

            # Beyond the 2026 handout: torch.nn layers seeded per rank (the test uses cs336_basics with one seed),
            # bf16, exact peaks and bytes against the formulas (it promises shards, not a peak), races over repeats.
            def equivalence():
                repeats = []
                for r in range(max(1, opts.repeat)):
                    runs = XF.equivalence_worker(model=cfg["model"], n_layers=cfg["n_layers"], dtypes=list(FSDP_DTYPES),
                                                 steps=cfg["steps"], batch_size=cfg["batch_size"],
                                                 context_length=cfg["context_length"], impl=impl)
                    full = rank == 0 and r == 0
                    repeats.append({d: [w if full else _digest(w) for w in run.weights] for d, run in runs.items()})
                return {"repeats": repeats}

            def memory():
                return {"memory": {k: XF.fsdp_memory(model=cfg["model"], batch_size=cfg["batch_size"],
                                                      context_length=cfg["context_length"], steps=1, impl=i)
                                   for k, i in (("yours", impl), ("ours", None))}}

            def logs():
                return {"logs": {"yours": _fsdp_step_bytes("yours", impl), "ours": _fsdp_step_bytes("fsdp", None)}}

            def timed():
                return {"samples": XF.measure_worker(kinds=("yours", "fsdp", "torch_fsdp"), steps=opts.steps,
                                                     warmup=opts.warmup, memory=False, trace=False,
                                                     impls={"yours": impl}, **SPEED).samples}
            if "beyond" not in parts:
                return {"course": course, "equivalence": None, "memory": None, "logs": None, "speed": None}
            return {"course": course, "equivalence": _phase(path, equivalence), "memory": _phase(path, memory),
                    "logs": _phase(path, logs), "speed": _phase(path, timed) if opts.timed and opts.steps else None}
        out[impl_name] = _outcome(run)
    return out


def _aligned(weights: dict, names: list[str]) -> dict:
    """The gathered weights keyed as the model names its parameters (a "module." prefix dropped); ValueError naming
    the missing and extra keys otherwise."""
    for strip in ("", "module.", "_fsdp_wrapped_module."):
        got = {k[len(strip):] if k.startswith(strip) else k: v for k, v in weights.items()}
        if set(names) <= set(got):
            return {n: got[n] for n in names}
    missing, extra = sorted(set(names) - set(weights)), sorted(set(weights) - set(names))
    raise ValueError(f"fsdp_gather_full_params' keys are not the model's parameter names: missing "
                     f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; extra {', '.join(extra[:3])}")


def _update_check(before: dict, after: dict, x, y, dtype: str) -> tuple[float, float, str]:
    """One SGD step from `before` vs one process's: max |w_after - (w - lr g_ref)| / bound, the same against N x g_ref
    (a sum, not a mean), and the worst element. Bound: lr x the gradient bound (XF.bound) + one rounding of each of
    w and lr g (float32)."""
    cfg, eps = FSDP_CHECK, torch.finfo(torch.float32).eps
    load = functools.partial(XF.loaded, cfg["model"], cfg["n_layers"], before)
    if dtype == "fp32":
        ref = XF.reference_grads(load(), x, y, dtype)
    else:
        shares = [(x[r], y[r]) for r in (rank_rows(x.shape[0], k, WORLD) for k in range(WORLD))]
        ref = XF.ranks_reference(load, shares, dtype)
    lim = {n: v.detach() for n, v in XF.bound(load(), x, y, dtype).items()}
    worst, summed, where = 0.0, 0.0, ""
    for n, w in before.items():
        g = ref[n].detach()
        round_ = 2 * eps * (w.abs() + XF.LR * g.abs())
        diff = (after[n] - (w - XF.LR * g)).abs()
        ratio = torch.nan_to_num(diff / (XF.LR * lim[n] + round_).clamp_min(1e-30), nan=float("inf"))
        s = (after[n] - (w - WORLD * XF.LR * g)).abs() / (WORLD * XF.LR * lim[n] + round_).clamp_min(1e-30)
        summed = max(summed, float(torch.nan_to_num(s, nan=float("inf")).max()))
        if float(ratio.max()) > worst or not where:
            i = tuple(int(k) for k in np.unravel_index(int(ratio.argmax()), tuple(w.shape)))
            worst = float(ratio.max())
            where = ("non-finite weights after the step (NaN/inf); " if not bool(torch.isfinite(after[n]).all())
                     else "") + (f"{n}[{', '.join(map(str, i))}]: yours {float(after[n][i]):.6g}, one process "
                     f"{float(w[i] - XF.LR * g[i]):.6g} (|diff| {float(diff[i]):.3g}, bound "
                     f"{float(XF.LR * lim[n][i] + round_[i]):.3g})")
    return worst, summed, where


def _fsdp_equivalence_checks(impl: str, per_rank: list[dict], repeat: int) -> list[Check]:
    cfg, checks = FSDP_CHECK, []
    names = [n for n, _ in XF.build(cfg["model"], cfg["n_layers"], seed=0).named_parameters()]
    first = per_rank[0]["repeats"][0]
    try:
        full = {d: [_aligned(w, names) for w in ws] for d, ws in first.items()}
    except ValueError as exc:
        return [Check("fsdp", impl, "fsdp_gather_full_params returns the full weights", FAIL, str(exc))]
    start = {n: p.detach().cpu() for n, p in XF.build(cfg["model"], cfg["n_layers"], seed=0).named_parameters()}
    w0 = full["fp32"][0]
    bad = [n for n in names if w0[n].shape != start[n].shape or not torch.equal(w0[n], start[n])]
    checks.append(Check("fsdp", impl, "fsdp_gather_full_params after construction is rank 0's model",
                        FAIL if bad else PASS,
                        f"{len(bad)} of {len(names)} parameters differ from rank 0's, e.g. {bad[0]} (shape "
                        f"{tuple(w0[bad[0]].shape)} vs {tuple(start[bad[0]].shape)}): not broadcast from rank 0, or not "
                        "the full weights" if bad else f"all {len(names)} parameters, full shapes, rank 0's values"))
    batches = make_batches(cfg["model"], cfg["steps"], cfg["batch_size"], cfg["context_length"], 0)
    for dtype, ws in full.items():
        label = "fp32" if dtype == "fp32" else f"compute dtype {dtype}"
        results = [(s, *_update_check(ws[s], ws[s + 1], *batches[s], dtype)) for s in range(cfg["steps"])]
        fails = [r for r in results if not r[1] <= 1]
        if fails:
            s, ratio, summed, where = fails[0]
            why = (f" - gradients exactly {WORLD}x one process's: summed over ranks, not averaged" if summed <= 1
                   else "")
            checks.append(Check("fsdp", impl, f"SGD steps vs one process ({label})", FAIL,
                                f"step {s}: {where}; |diff| / bound {ratio:.3g}{why}"))
        else:
            checks.append(Check("fsdp", impl, f"SGD steps vs one process ({label})", PASS,
                                f"{cfg['steps']} steps, worst |diff| / bound {max(r[1] for r in results):.3g}"))
    digests = {d: [_digest(w) for w in ws] for d, ws in first.items()}
    split = [(d, s, k) for r in per_rank[1:] for d, ws in r["repeats"][0].items() for s, w in enumerate(ws)
             for k in w if w[k] != digests[d][s].get(k)]
    checks.append(Check("fsdp", impl, "every rank gathers the same weights", FAIL if split else PASS,
                        f"{split[0][0]}, step {split[0][1]}: rank 1's {split[0][2]} differs from rank 0's" if split
                        else "bitwise equal on every rank"))
    races = [(i, d, s, k) for rank, r in enumerate(per_rank) for i, rep in enumerate(r["repeats"][1:], 1)
             for d, ws in rep.items() for s, w in enumerate(ws)
             for k in w if w[k] != (digests if rank == 0 else r["repeats"][0])[d][s].get(k)]
    if repeat > 1:
        checks.append(Check("fsdp", impl, f"{repeat} repeats bitwise equal (no races)", FAIL if races else PASS,
                            f"repeat {races[0][0]} ({races[0][1]}, step {races[0][2]}) differs at {races[0][3]}: a race "
                            "(a buffer read before its async collective finished?)" if races else
                            f"all {repeat} repeats bitwise equal"))
    return checks


def _fsdp_memory_checks(impl: str, per_rank: list[dict]) -> tuple[list[Check], list[dict]]:
    cfg, checks, rows = FSDP_CHECK, [], []
    model, b, t = cfg["model"], cfg["batch_size"] // WORLD, cfg["context_length"]
    init_formula = sum(F.fsdp_live_bytes(model, WORLD, b, t, "after init").values())
    full_params = 4 * F.meta_numel(model) + F.buffer_bytes(model)
    rank, mem = max(enumerate(per_rank), key=lambda r: r[1]["memory"]["yours"].points[0].live)
    live = mem["memory"]["yours"].points[0].live
    ok = live <= (1 + FSDP_MEMORY_TOL) * init_formula
    detail = (f"rank {rank} holds {live / MiB:.3f} MiB after get_fsdp; formula (1/{WORLD} of the weights, padded, "
              f"norm gains whole) {init_formula / MiB:.3f} MiB, tolerance {FSDP_MEMORY_TOL:.0%}")
    if not ok:
        detail += (" - the full weights are still live: not sharded at init (keep only this rank's shard)"
                   if live >= 0.9 * full_params else " - more than a shard per rank")
    checks.append(Check("fsdp", impl, "memory per rank after init vs formula", PASS if ok else FAIL, detail))
    acts = sum(F.activation_bytes(model, b, t).values()) + F.loss_grad_bytes(model, b, t)
    gathered_all = F.fsdp_shard_elements(model, WORLD)["sharded"] * WORLD * 4
    own = F.fsdp_shard_elements(model, WORLD)
    # + this rank's fp32 gradient shards and gains, made in this first backward, and the full-size fp32 inputs of the
    # reduce-scatters still in flight (an async reduce-scatter keeps its input until it is done: all of them, at most)
    formula = (acts + F.fsdp_gathered_peak_bytes(model, WORLD, modules=2) + 4 * (own["sharded"] + own["replicated"])
               + gathered_all)
    worst = max(range(len(per_rank)), key=lambda i: _fb_peak(per_rank[i]["memory"]["yours"]))
    peak = _fb_peak(per_rank[worst]["memory"]["yours"])
    ok = peak <= (1 + FSDP_MEMORY_TOL) * formula
    detail = (f"rank {worst}: forward/backward peak {peak / MiB:.3f} MiB above the step's start; formula "
              f"(activations + loss gradients + 2 modules' gathered weights + gradient shards + reduce-scatter inputs "
              f"in flight) {formula / MiB:.3f} MiB, tolerance "
              f"{FSDP_MEMORY_TOL:.0%}")
    if not ok:
        detail += (f" - {(peak - formula) / MiB:.3f} MiB more, {(peak - formula) / gathered_all:.0%} of all gathered "
                   f"weights ({gathered_all / MiB:.3f} MiB): gathered weights never freed (the peak grows by a "
                   "layer's weights per layer)")
    checks.append(Check("fsdp", impl, "forward/backward peak vs formula (gathered weights freed)",
                        PASS if ok else FAIL, detail))
    for who in ("yours", "ours"):
        rows.append({"topic": "fsdp", "impl": impl, "measure": "live after init, worst rank", "who": who,
                     "value": max(r["memory"][who].points[0].live for r in per_rank) / MiB, "unit": "MiB"})
        rows.append({"topic": "fsdp", "impl": impl, "measure": "forward/backward peak, worst rank", "who": who,
                     "value": max(_fb_peak(r["memory"][who]) for r in per_rank) / MiB, "unit": "MiB"})
    rows.append({"topic": "fsdp", "impl": impl, "measure": "live after init, worst rank", "who": "formula",
                 "value": init_formula / MiB, "unit": "MiB"})
    for measure in ("live after init, worst rank", "forward/backward peak, worst rank"):
        rows.append({"topic": "fsdp", "impl": impl, "measure": measure, "who": "pytorch", "value": float("nan"),
                     "unit": "MiB", "note": "not measured: fully_shard's DTensor storages are opaque to helpers.memory's "
                                            "tracker on CPU (on a GPU the allocator's peak would do)"})
    rows.append({"topic": "fsdp", "impl": impl, "measure": "forward/backward peak, worst rank", "who": "formula",
                 "value": formula / MiB, "unit": "MiB"})
    return checks, rows


def _fb_peak(run) -> int:
    p = next(p for p in run.points if p.point == "before step")
    return p.phase_peak - p.phase_start


def _fsdp_bytes_checks(impl: str, per_rank: list[dict]) -> tuple[list[Check], list[dict]]:
    e = F.fsdp_shard_elements(FSDP_CHECK["model"], WORLD)
    formula = fsdp_bytes_per_step(e["sharded"] * WORLD, WORLD, 4, 4, e["replicated"])
    sent = {who: bytes_sent(per_rank[0]["logs"][who], WORLD) for who in ("yours", "ours")}
    rows = [{"topic": "fsdp", "impl": impl, "measure": "bytes sent per step (rank 0)", "who": who, "value": v / MiB,
             "unit": "MiB"} for who, v in {**sent, "formula": formula}.items()]
    if not sent["yours"]:
        return [Check("fsdp", impl, "bytes per step vs formula", SKIPPED,
                      "no collective seen: calls must go through torch.distributed's functions to be counted")], rows
    ok = abs(sent["yours"] - formula) <= FSDP_BYTES_TOL * formula
    ops = {}
    for op, nbytes in per_rank[0]["logs"]["yours"]:
        ops[op] = ops.get(op, 0) + nbytes
    detail = (f"{sent['yours'] / MiB:.3f} MiB sent per step by rank 0 vs formula 3(N-1)/N x Psi x 4 B + the norm gains' "
              f"all-reduce = {formula / MiB:.3f} MiB (tolerance {FSDP_BYTES_TOL:.0%}); by collective: "
              + ", ".join(f"{op} {b / MiB:.3f} MiB" for op, b in ops.items()))
    if not ok:
        detail += (" - more than the formula: gradients all-reduced instead of reduce-scattered, or weights gathered "
                   "more than twice" if sent["yours"] > formula else
                   " - less than the formula: weights not gathered again for backward (kept from forward?)")
    return [Check("fsdp", impl, "bytes per step vs formula (fp32)", PASS if ok else FAIL, detail)], rows


def run_fsdp(adapters_path: str, opts: Options) -> TopicResult:
    """FSDP: within the handout, the 2026 test on the cs336_basics model (fp32 and fp16 steps vs one process,
    gradients' shapes and dtypes, replicated gradients equal) and a shard per rank after get_fsdp; beyond it, our
    TransformerLM seeded per rank (rank 0's weights, fp32 and bf16 steps within the derived bound, opts.repeat
    times), memory and bytes vs the formulas, and yours vs ours vs torch's fully_shard."""
    result = TopicResult("fsdp")
    for impl, per_rank in _launch_each(fsdp_worker, str(adapters_path), list(A.ADAPTERS["fsdp"]), opts).items():
        early = _status_checks("fsdp", impl, per_rank, str(adapters_path))
        if early:
            result.checks += early
            continue
        if "missing" in per_rank[0]["course"]:  # the course's test cannot run without it either
            result.checks.append(Check("fsdp", impl, "the 2026 test's model (cs336_basics.model)", SKIPPED,
                                       f"cs336_basics.model does not import ({per_rank[0]['course']['missing']}): the "
                                       "course's FSDP test builds its model from it; put your cs336-basics on the path"))
        else:
            result.checks += _course_fsdp_checks(impl, {k: [r["course"][k] for r in per_rank]
                                                        for k in per_rank[0]["course"]})
        if _beyond_failed("fsdp", impl, per_rank):
            result.checks += _beyond_failed("fsdp", impl, per_rank)
            continue
        beyond = []
        phases = (("equivalence", lambda ph: _fsdp_equivalence_checks(impl, ph, max(1, opts.repeat)), "runs"),
                  ("memory", lambda ph: _rows_into(result, _fsdp_memory_checks(impl, ph)), "memory"),
                  ("logs", lambda ph: _rows_into(result, _fsdp_bytes_checks(impl, ph)), "bytes per step"))
        for key, checks_of, what in phases:
            ph = [r[key] for r in per_rank]
            error = _phase_error("fsdp", impl, f"our TransformerLM ({what})", ph, beyond=True)
            beyond += [error] if error else checks_of(ph)
        speed = [r["speed"] for r in per_rank] if per_rank[0]["speed"] is not None else None
        error = speed and _phase_error("fsdp", impl, "timing on small/cpu", speed, beyond=True)
        if error:
            beyond.append(error)
        elif speed:
            labels = {"yours": "yours", "fsdp": "ours", "torch_fsdp": "pytorch"}
            result.rows += _timing_rows("fsdp", impl, [r["samples"] for r in speed], labels)
        for c in beyond:
            c.beyond, c.prop = True, c.prop if c.prop.startswith("beyond") else f"beyond the handout: {c.prop}"
        result.checks += beyond
    return result


def _rows_into(result: TopicResult, checks_rows: tuple[list[Check], list[dict]]) -> list[Check]:
    checks, rows = checks_rows
    result.rows += rows
    return checks



# ======================================= notebooks 04, 05, 07 =======================================

RUNS = {"ddp": run_ddp, "sharding": run_sharding, "fsdp": run_fsdp}


def notebook_tables(topic: str, adapters_path: str, opts: Options | None = None):
    """A notebook's "yours" section (when its ADAPTERS parameter is set): (checks, side_by_side, ratios) DataFrames
    (checks with a "beyond" column: True for the probes past the handout, which never count);
    side_by_side has one column per who (yours, ours, pytorch, formula) for each measure, ratios the paired step-time
    ratios of yours to the others with their intervals and verdicts."""
    import pandas as pd

    result = RUNS[topic](str(adapters_path), opts or Options())
    checks = pd.DataFrame(result.as_rows(), columns=CHECK_COLUMNS)  # "beyond": a probe past the handout
    rows = pd.DataFrame(result.rows, columns=sorted({k for r in result.rows for k in r} | {"measure", "who", "value"}))
    is_ratio = rows["measure"].astype(str).str.contains(" / ")
    side = (rows[~is_ratio].assign(value=lambda d: d["value"].astype(object))
            .pivot_table(index=["impl", "measure", "unit"], columns="who", values="value", aggfunc="first", sort=False)
            if (~is_ratio).any() else pd.DataFrame())
    ratios = rows[is_ratio].reindex(columns=["impl", "measure", "ratio", "ratio_low", "ratio_high", "pairs", "verdict"])
    return checks, side, ratios
