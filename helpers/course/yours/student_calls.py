"""Calling a student's adapters from inside a launched rank without trusting them (helpers.course.yours.distributed
and .contract): the adapters file loaded once per process, each adapter called with NotImplementedError and wrong
return kinds turned into `Unusable`, the wrappers behind the protocol our experiments use (StudentDDP, the sharded
optimizer's and FSDP's callables), one phase's exception kept as its result with the student's file:line, and the
small comparisons the checks share (digests, allclose ratios, parameters paired by position)."""

from __future__ import annotations

import hashlib
import sysconfig
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

import helpers.course.yours.adapters as A
from helpers.course.yours.report import ERROR, NEEDS_ENV, NOT_IMPLEMENTED, SKIPPED, Check
from helpers.experiments import fsdp as XF

WORLD = 2  # ranks the distributed checks run on (the course's tests use 2); DDP on the course's LM: ddp_lm.LM_WORLD


class Unusable(Exception):
    """An implementation that cannot be checked: an adapter not implemented, missing, or returning the wrong kind.
    Raised alike on every rank (no collective is left waiting), so the worker reports it and goes on."""

    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


# ---- in a rank: the student's adapters, loaded once per process ----

_LOADED: dict = {}


def adapter_fns(path: str, topic: str, impl: str) -> dict:
    """The callables of one implementation; Unusable(SKIPPED) when the file names none of them (another edition)."""
    if path not in _LOADED:
        _LOADED[path] = A.load(path)
    adapter = next(a for a in A.implementations(_LOADED[path], topic) if a.impl == impl)
    if not adapter.ok:
        raise Unusable(SKIPPED, f"no {', '.join(A.ADAPTERS[topic][impl])} in the file (another edition's names)")
    return adapter.fns


def required(fns: dict, name: str) -> callable:
    if name not in fns:
        raise Unusable(ERROR, f"{name} is missing from the adapters file (its flavour's other adapters are there)")
    return fns[name]


def called(fn, *args, expect=None, what: str = "", **kwargs):
    """A student's adapter called: NotImplementedError -> Unusable(NOT_IMPLEMENTED), a wrong return kind -> Unusable."""
    out = A.call(fn, *args, **kwargs)
    if isinstance(out, str) and out == A.NOT_IMPLEMENTED:
        raise Unusable(NOT_IMPLEMENTED, f"{fn.__name__} raises NotImplementedError")
    if expect is not None and not isinstance(out, expect):
        raise Unusable(ERROR, f"{fn.__name__} returned {type(out).__name__}, expected {what}")
    return out


def outcome(fn) -> dict:
    """fn()'s dict with status "ok", or the Unusable's status and detail (other exceptions propagate: a rank error)."""
    try:
        return {"status": "ok", **fn()}
    except Unusable as exc:
        return {"status": exc.status, "detail": exc.detail}
    except A.AdaptersError as exc:  # the file failed to import: the same on every rank, its file:line in the message
        return {"status": ERROR, "detail": str(exc)}


_OUTSIDE = (
    "site-packages",
    "dist-packages",
    "/.venv/",
    sysconfig.get_paths()["stdlib"],
    str(Path(torch.__file__).parent),
    str(Path(__file__).parents[2]),
)  # installed packages (a .venv inside the
#                                    repository too), the standard library, torch, the companion: never the student's


def student_frame(frames: list[tuple[str, str]], path: str) -> str:
    """file:line of the deepest frame in the student's files: under the assignment root and outside installed
    packages (a .venv inside the repository included); else the deepest frame outside those; else the deepest."""
    root = str(A.assignment_root(Path(path)))
    theirs = [f for f in frames if not any(o in f[0] for o in _OUTSIDE)]
    mine = [f for f in theirs if f[0].startswith(root)] or theirs or frames
    return f"{mine[-1][0]}:{mine[-1][1]}" if mine else "?"


def phase(path: str, fn) -> dict:
    """fn()'s dict with status "ok", or its exception as {"status": ERROR, "detail": "Type: message (at file:line)"}:
    one phase's failure kept apart from the others; a module the student's code imports that this Python (not the
    assignment's own .venv) lacks is NEEDS_ENV, with the fix. Unusable (the implementation cannot be checked at all)
    propagates."""
    try:
        return {"status": "ok", **fn()}
    except (Unusable, A.AdaptersError):
        raise
    except Exception as exc:  # noqa: BLE001 - a student's exception is a result, not a crash of the checker
        frames = [(f.filename, str(f.lineno)) for f in traceback.extract_tb(exc.__traceback__)]
        detail = f"{type(exc).__name__}: {exc} (at {student_frame(frames, path)})"
        root = A.assignment_root(Path(path))
        if isinstance(exc, ModuleNotFoundError) and not A.own_environment(root):  # this Python's, not the student's
            fix = A.fix_for(exc, root, Path(path))
            return {"status": NEEDS_ENV, "detail": f"{detail}: not importable where the check ran. To fix: {fix}"}
        return {"status": ERROR, "detail": detail}


def digest(state: dict) -> dict:
    """name -> sha1 of the tensor's bytes: equality across ranks without sending the tensors back."""
    return {
        k: hashlib.sha1(v.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest() for k, v in state.items()
    }


class StudentDDP:
    """A student's DDP flavour behind the gradient-sync protocol of train_step and gradient_checks (.module, call,
    on_train_batch_start, finish_gradient_synchronization), its hooks called with (ddp_model, optimizer) as the
    course's tests call them; the synced gradients of every step are kept for the cross-rank check."""

    def __init__(self, fns: dict, impl: str, module: nn.Module, bucket_mb: float | None = None):
        names = A.ADAPTERS["ddp"][impl]
        ctor = required(fns, names[0])
        self.after = required(fns, names[1])
        self.start = required(fns, names[2]) if len(names) > 2 else None
        args = (module, bucket_mb) if impl == "bucketed" else (module,)
        self.ddp = callable_wrapper(called(ctor, *args), ctor)
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
            called(self.start, self.ddp, self.optimizer)

    def finish_gradient_synchronization(self) -> None:
        called(self.after, self.ddp, self.optimizer)
        if self.keep:
            self.synced.append(
                {
                    n: None if p.grad is None else p.grad.detach().clone()
                    for n, p in self.module.named_parameters()
                    if p.requires_grad
                }
            )

    def close(self) -> None:
        """Nothing to remove: the student's wrapper owns its hooks."""


def callable_wrapper(out, ctor):
    """The student's wrapper as the course's tests use it: called on the inputs, .parameters() and .named_parameters()
    read (an nn.Module, or a plain class with __call__ and __getattr__ delegating to the model); Unusable otherwise."""
    if not callable(out) or not callable(getattr(out, "parameters", None)):
        raise Unusable(
            ERROR,
            f"{ctor.__name__} returned {type(out).__name__}, expected a wrapper the course's tests "
            "can call on the inputs and read .parameters() / .named_parameters() of",
        )
    return out


def by_position(model: nn.Module, wrapper) -> dict:
    """The wrapper's parameters under the model's names, paired in order as the course's tests pair them (zip of
    named_parameters()): any prefix the wrapper adds ("module.", "model.") is fine; Unusable when the counts differ."""
    mine = list(wrapper.parameters())
    names = [n for n, _ in model.named_parameters()]
    if len(mine) != len(names):
        raise Unusable(
            ERROR,
            f"the wrapper's parameters() yields {len(mine)} tensors, the model has {len(names)}: the "
            "course's tests read the model's parameters through the wrapper, in the model's order",
        )
    return dict(zip(names, mine, strict=True))


def close_ratio(got: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> tuple[float, tuple]:
    """max |got - ref| / (atol + rtol |ref|) (allclose passes at <= 1) and where; inf where got is not finite."""
    r = torch.nan_to_num((got - ref).abs() / (atol + rtol * ref.abs()), nan=float("inf"))
    i = tuple(int(k) for k in np.unravel_index(int(r.argmax()), tuple(r.shape))) if r.numel() else ()
    return (float(r.max()) if r.numel() else 0.0), i


def phase_error(topic: str, impl: str, prop: str, per_rank: list[dict], beyond: bool) -> Check | None:
    """An ERROR check when a phase raised on some rank (its first rank's message), else None."""
    bad = [(rank, r) for rank, r in enumerate(per_rank) if r["status"] != "ok"]
    if not bad:
        return None
    rank, r = bad[0]
    return Check(topic, impl, prop, r["status"], f"rank {rank}: {r['detail']}", beyond=beyond)


def student_optimizer(fns: dict):
    """The student's get_sharded_optimizer as build()'s `impl` (params, optimizer_cls, **kwargs) -> Optimizer."""
    ctor = required(fns, "get_sharded_optimizer")

    def make(params, optimizer_cls, **kwargs):  # the course's test calls zero_grad() and step(): nothing else asked
        opt = called(ctor, params, optimizer_cls, **kwargs)
        if not all(callable(getattr(opt, m, None)) for m in ("zero_grad", "step")):
            raise Unusable(
                ERROR,
                f"get_sharded_optimizer returned {type(opt).__name__}, expected an optimizer (the "
                "course's test calls its zero_grad() and step())",
            )
        return opt

    return make


def student_fsdp(fns: dict) -> XF.FsdpImpl:
    """The student's get_fsdp / fsdp_on_after_backward / fsdp_gather_full_params as an FsdpImpl (get_fsdp called with
    compute_dtype= as the 2026 test calls it), return kinds checked."""
    ctor, after, gather = (required(fns, n) for n in A.ADAPTERS["fsdp"]["fsdp"])

    def gathered(model):
        out = called(gather, model, expect=dict, what="a dict {parameter name: full tensor}")
        return {k: v.detach().float().cpu().clone() for k, v in out.items()}

    return XF.FsdpImpl(
        wrap=lambda module, dtype: callable_wrapper(called(ctor, module, compute_dtype=dtype), ctor),
        on_after_backward=lambda model, opt: called(after, model, opt),
        gather_full_params=gathered,
    )


def aligned(weights: dict, names: list[str]) -> dict:
    """The gathered weights keyed as the model names its parameters (a "module." prefix dropped); ValueError naming
    the missing and extra keys otherwise."""
    for strip in ("", "module.", "_fsdp_wrapped_module."):
        got = {k[len(strip) :] if k.startswith(strip) else k: v for k, v in weights.items()}
        if set(names) <= set(got):
            return {n: got[n] for n in names}
    missing, extra = sorted(set(names) - set(weights)), sorted(set(weights) - set(names))
    raise ValueError(
        f"fsdp_gather_full_params' keys are not the model's parameter names: missing "
        f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; extra {', '.join(extra[:3])}"
    )
