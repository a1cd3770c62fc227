"""The kernel topics of `yours`: a student's RMSNorm and FlashAttention-2 checked (norm_checks, attn_checks, with
the numerics of numerics.py), judged only where this environment can run them (triton_runtime), and timed beside
ours and PyTorch's (kernel_timing). One launched rank runs one implementation's checks, or the timing.

What counts is what each edition's handout and tests promise (../shared/curricula.md, "The contract"): RMSNorm in fp32
on (..., H) with eps 1e-5, at the benchmark's widths up to 8192; FlashAttention-2 on 3-D (batch, N, d) with N and d
powers of two, at least 16, N_q and N_k possibly different, the PyTorch version in fp32 and free to ignore is_causal,
the Triton version also causal and in bf16, at the benchmark's sizes on a GPU. Everything else (bf16 for the others,
non-contiguous views, lengths that are not tile multiples, 4-D inputs, an enforced causal mask in the PyTorch
version) is a probe "beyond the handout": reported, never in the exit status. A Triton case this environment cannot
run (no GPU for a wrapper that needs CUDA, a Triton without block pointers, a case the companion's own kernel fails
in the interpreter) is "needs a GPU" or "needs another Triton", not a failure.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict
from pathlib import Path

import torch

import helpers.course.yours.adapters as A
from helpers.course.yours.kernels.attention import ATTN_PROPERTIES, check_attn_function  # noqa: F401
from helpers.course.yours.kernels.numerics import EPS, BackwardMissing, ShapeError  # noqa: F401
from helpers.course.yours.kernels.rmsnorm import (  # noqa: F401
    NORM_CONTRACT,
    NORM_LAYOUTS,
    NormCase,
    check_norm_backward,
    check_norm_function,
    norm_inputs,
)
from helpers.course.yours.kernels.suites import (  # noqa: F401
    NotALayoutBug,
    Suite,
    attention_suites,
    backward_property,
    norm_suites,
    property_names,
)
from helpers.course.yours.kernels.timing import TimingFault, attn_timing, norm_timing
from helpers.course.yours.kernels.triton_runtime import (  # noqa: F401
    NotHere,
    Poisoned,
    TritonRuntime,
    asserts_is_cuda,
    block_pointer_probe,
    causes,
    cuda_broken,
    is_cuda_error,
    out_of_bounds,
    triton_runtime,
    unrunnable,
)
from helpers.course.yours.options import Options
from helpers.course.yours.report import (
    ERROR,
    FAIL,
    NEEDS_GPU,
    NOT_IMPLEMENTED,
    PASS,
    SKIPPED,
    Check,
    TopicResult,
    passed,
)

# ---- running the checks: inside a launched worker (student code never runs in the driver) -----------------------

_PROGRESS: str | None = None  # a file the driver reads after this process died: each property as it starts, each
#                               check as it ends (JSON lines), so the crash is pinned on one property


def _note(**entry) -> None:
    if _PROGRESS:
        with open(_PROGRESS, "a") as f:
            f.write(json.dumps(entry) + "\n")


def read_progress(path) -> tuple[list[Check], str | None]:
    """(the checks a dead process finished, the property it was in when it died, or None)."""
    checks, started = [], None
    for line in Path(path).read_text().splitlines() if Path(path).exists() else []:
        entry = json.loads(line)
        if "start" in entry:
            started = entry["start"]
        else:
            checks.append(Check(**entry["check"]))
            started = None
    return checks, started


def _function_class(adapter: A.Adapter, name: str):
    """What an adapter returns when it has an .apply (the course's tests call nothing else: a Function subclass, or
    anything that behaves like one), NOT_IMPLEMENTED, or ShapeError naming what came back."""
    cls = A.call(adapter.fns[name])
    if cls is A.NOT_IMPLEMENTED:
        return cls
    if not callable(getattr(cls, "apply", None)):
        raise ShapeError(
            f"{name}() returned {cls!r}, which has no .apply: expected a torch.autograd.Function subclass (the "
            "course's tests call its .apply)"
        )
    return cls


def _function_checks(
    adapter: A.Adapter, suites: list[Suite], runtime: TritonRuntime | None = None, props=None
) -> tuple[object, list[Check], bool]:
    """An adapter that returns an autograd.Function: (its apply or None, the checks, poisoned); a wrong return kind
    is an ERROR, NotImplementedError 'not implemented'. runtime: judge a Triton implementation only where ours runs.
    props: only these properties. poisoned: a CUDA error stopped the checks (the last check names it)."""
    topic, impl = adapter.topic, adapter.impl
    try:
        cls = _function_class(adapter, A.ADAPTERS[topic][impl][0])
    except Exception as exc:  # noqa: BLE001 - the student's getter raised or returned the wrong kind
        return None, [Check(topic, impl, "returns an autograd.Function", ERROR, str(exc))], False
    if cls is A.NOT_IMPLEMENTED:
        return None, [Check(topic, impl, "implemented", NOT_IMPLEMENTED)], False
    kind = A.function_type(cls)  # judged through .apply; the type is information
    typed = [Check(topic, impl, FUNCTION_TYPE, FAIL, f"returned {kind}: its .apply was checked", True, ONLY_APPLY)]
    device = runtime.device if runtime else "cpu"
    checks, poisoned = (typed if kind and props is None else []), False
    for suite in suites:
        chosen = {p: cs for p, cs in suite.properties.items() if props is None or p in props}
        try:
            checks += _run_properties(
                topic,
                impl,
                chosen,
                lambda case, check=suite.check: check(cls.apply, case, device),
                beyond=suite.beyond,
                runtime=runtime,
                refusable=suite.refusable,
            )
        except Poisoned as stop:
            checks += stop.checks
            poisoned = True
            break
    if any(c.detail == FORWARD_ONLY for c in checks):  # a student part-way through: the forward still counts
        checks.append(
            Check(
                topic,
                impl,
                "backward implemented",
                NOT_IMPLEMENTED,
                "backward raises NotImplementedError: the gradients were not checked",
            )
        )
    return cls.apply, checks, poisoned


FUNCTION_TYPE = "a torch.autograd.Function subclass (the type the adapter's docstring names)"
ONLY_APPLY = "the course's tests call only its .apply"  # why the type is information, not a rule
FORWARD_ONLY = "forward only: the backward is not implemented"
BACKWARD_MISSING = "backward missing"  # _one_case's status for a forward within its bounds and no backward


def hit_recompile_limit(exc: BaseException) -> bool:
    """Whether torch.compile stopped because a function ran out of recompiles (torch._dynamo's recompile_limit, 8
    guards' worth of shapes, dtypes and strides), here or in what caused it."""
    limits = ("FailOnRecompileLimitHit", "RecompileLimitExceeded", "CacheLimitExceeded")
    return any(type(e).__name__ in limits for e in causes(exc))


class CudaFault(Exception):
    """A case raised a CUDA error (the message says which and where)."""


REFUSED = "refused"  # _one_case's status for a clear error on a layout the handout lets a wrapper refuse
REFUSAL = (
    "a clear refusal, which the handout allows (its own example asserts contiguous inputs): information; a silently "
    "wrong answer would fail"
)


def _one_case(
    check, case, runtime: TritonRuntime | None, refusable: bool = False, reset: bool = True
) -> tuple[str, str]:
    """(status, detail) of one case: PASS, FAIL, ERROR, BACKWARD_MISSING, or NEEDS_GPU / NEEDS_TRITON where this
    environment cannot run it; REFUSED for an error that is not an access outside a tensor where `refusable`.
    CudaFault when the student's code left a CUDA error (the process is unusable). A torch.compile'd student function
    that ran out of recompiles (fullgraph=True raises then) was used up by our many shapes, not by this case: run
    again once after torch._dynamo.reset()."""
    try:
        with runtime.running() if runtime else contextlib.nullcontext():
            detail = check(case)
        return (FAIL if detail else PASS), detail
    except ShapeError as exc:
        return FAIL, f"{case}: {exc}"
    except BackwardMissing as exc:
        return BACKWARD_MISSING, str(exc)
    except NotALayoutBug as exc:
        return REFUSED, str(exc)
    except NotHere as exc:
        return NEEDS_GPU, str(exc)
    except Exception as exc:  # noqa: BLE001 - the student's code raised: say what and where
        oob = out_of_bounds(exc)
        raised = f"{case}: {oob}" if oob else f"{case}: raised {type(exc).__name__}: {exc} (at {A.where(exc)})"
        if runtime and (is_cuda_error(exc) or (runtime.device == "cuda" and cuda_broken())):
            raise CudaFault(
                f"{raised}: a CUDA error, which leaves this process unusable (the checks after it ran in a fresh "
                "process; CUDA_LAUNCH_BLOCKING=1 pins an asynchronous one on the kernel that made it)"
            ) from None
        if runtime and runtime.device == "cpu" and not runtime.pretend_cuda and asserts_is_cuda(exc):
            runtime.pretend_cuda = True  # the handout's example asserts is_cuda: the interpreter runs it on CPU
            return _one_case(check, case, runtime, refusable, reset)
        if reset and hit_recompile_limit(exc):
            torch._dynamo.reset()  # every compiled function of the process starts afresh: slower, never wrong
            return _one_case(check, case, runtime, refusable, reset=False)
        why = unrunnable(exc, runtime) if runtime else None
        if not why and refusable and not oob:
            return REFUSED, f"{raised} - {REFUSAL}"
        return why if why else (ERROR, raised)


def _run_properties(
    topic: str,
    impl: str,
    properties: dict,
    check,
    *,
    beyond: bool = False,
    runtime: TritonRuntime | None = None,
    refusable: bool = False,
) -> list[Check]:
    """One Check per property: the first failing case's detail, or pass; an exception in student code is ERROR;
    a case this environment cannot run (runtime) makes the property NEEDS_GPU / NEEDS_TRITON, not a failure.
    Poisoned (carrying the checks so far) when a case left a CUDA error."""
    out, forward_only = [], ""
    for prop, cases in properties.items():
        _note(start=prop)
        failed, cannot, refused = None, None, None  # (status, detail): the first that fails, cannot run, refused
        for case in cases:
            try:
                status, detail = _one_case(check, case, runtime, refusable)
            except CudaFault as fault:
                out.append(Check(topic, impl, prop, ERROR, str(fault), beyond=beyond))
                _note(check=asdict(out[-1]))
                raise Poisoned(out) from None
            if status == BACKWARD_MISSING:
                status, forward_only = PASS, detail
            if status == REFUSED:  # information: the other cases of the property still run
                refused = refused or (SKIPPED, detail)
                continue
            if status not in (PASS, FAIL, ERROR):  # NEEDS_GPU / NEEDS_TRITON
                cannot = cannot or (status, detail)
                continue
            why = runtime.cannot_run(case) if runtime and status != PASS else ""  # judged only where ours runs
            if why:
                cannot = cannot or (
                    NEEDS_GPU,
                    f"{case}: needs a GPU: this environment cannot run it (the companion's "
                    f"own Triton kernel fails it here too: {why[:300]})",
                )
                continue
            if status != PASS:
                failed = (status, detail)
                break
        status, detail = failed or cannot or refused or (PASS, FORWARD_ONLY if forward_only else "")
        out.append(Check(topic, impl, prop, status, detail, beyond=beyond))
        _note(check=asdict(out[-1]))
    return out


def _named(module, topic: str, res: TopicResult, only=None):
    """(adapter, its constructor's name) for each implementation of `topic` the file names (those in `only`, when
    given); a SKIPPED check in `res` for each it does not (another edition's)."""
    for adapter in A.implementations(module, topic):
        if only is not None and adapter.impl not in only:
            continue
        name = A.ADAPTERS[topic][adapter.impl][0]
        if not adapter.ok or name not in adapter.fns:
            res.checks.append(
                Check(topic, adapter.impl, "adapter present", SKIPPED, f"no {name} in the file (another edition's)")
            )
        else:
            yield adapter, name


def _timed(res: TopicResult, timing) -> None:
    """Add timing(errors)'s rows to res; a row whose call raised is its own error row, beside the other rows and the
    checks already made (the timing shapes go past the handout's: it never changes the exit status); a CUDA error
    marks res.timing_fault (run_kernel_topic times the rest in a fresh process)."""
    errors: list = []
    try:
        res.rows += timing(errors)
    except TimingFault as fault:
        res.timing_fault = fault.label
        errors.append((fault.label, fault.why + " (a CUDA error: the other rows were timed in a fresh process)"))
    except Exception as exc:  # noqa: BLE001 - one failure hides nothing else
        errors.append(("-", f"raised {type(exc).__name__}: {exc} (at {A.where(exc)})"))
    for label, why in errors:
        res.checks.append(Check(res.topic, label, "timing runs", ERROR, why, beyond=True))


def _applies(module, topic: str, impls) -> dict:
    """{impl: Function.apply} of the named implementations (already checked in another launch), for timing."""
    out = {}
    for adapter in A.implementations(module, topic):
        name = A.ADAPTERS[topic][adapter.impl][0]
        if adapter.impl in impls and adapter.ok and name.startswith("get_"):  # not the 2024 backward functions
            cls = _function_class(adapter, name)
            out[adapter.impl] = cls.apply
    return out


def _checked(res: TopicResult, adapter: A.Adapter, suites: list[Suite], props, yours: dict) -> bool:
    """One implementation's checks added to res (its apply to `yours` when all passed); False once a CUDA error
    poisoned this process (the caller stops: what is left runs in a fresh one)."""
    runtime = triton_runtime(adapter.topic) if adapter.impl == "triton" else None
    apply, checks, poisoned = _function_checks(adapter, suites, runtime, props)
    res.checks += checks
    if apply is not None and passed(checks, adapter.impl) and props is None:
        yours[adapter.impl] = apply
    res.poisoned = res.poisoned or poisoned
    return not poisoned


def rmsnorm_worker(
    adapters_path: str, opts: Options, impls=None, timed_impls=None, props=None, progress=None
) -> TopicResult:
    """The file's RMSNorm implementations checked (those in `impls`; None: all; only the properties in `props` when
    given), then, when opts.timed, timed beside ours and PyTorch's: those that passed here, or `timed_impls` when
    given (checked in another launch). progress: a file to note each property in (read_progress). A launched rank:
    student code never runs in the driver."""
    from helpers.rmsnorm import RMSNormPyTorchFunction, RMSNormTritonFunction

    global _PROGRESS
    _PROGRESS = progress
    module, res, yours = A.load(adapters_path), TopicResult("rmsnorm"), {}
    for adapter, name in _named(module, "rmsnorm", res, impls):
        if adapter.impl in ("backward_g", "backward_x"):
            res.checks += _backward_checks(adapter, name)
        elif not _checked(res, adapter, norm_suites(adapter.impl, opts), props, yours):
            return res
    if timed_impls is not None:
        yours = _applies(module, "rmsnorm", timed_impls)
    rows, H = (1024, 1024) if opts.profile == "cpu" else (50_000, 4096)
    dtype = torch.float32 if opts.profile == "cpu" else torch.bfloat16
    if opts.timed:
        ours = {"pytorch": RMSNormPyTorchFunction.apply, "triton": RMSNormTritonFunction.apply}
        _timed(res, lambda e: norm_timing(yours, rows=rows, H=H, dtype=dtype, opts=opts, ours=ours, errors=e))
    return res


def _backward_checks(adapter: A.Adapter, name: str) -> list[Check]:
    """The 2024 edition's rmsnorm_backward_g/x_pytorch(dy, x, g) against float64 on the tests' shapes."""
    which = "dg" if adapter.impl == "backward_g" else "dx"
    fn = adapter.fns[name]
    probe = _probe(lambda: fn(*_tiny_norm_args()))
    if probe:
        return [Check("rmsnorm", adapter.impl, "implemented", *probe)]
    cases = next(iter(NORM_CONTRACT.values()))
    return _run_properties(
        "rmsnorm",
        adapter.impl,
        {backward_property(adapter.impl): cases},
        lambda c: check_norm_backward(fn, which, c),
    )


def _tiny_norm_args():
    x, g, dy = norm_inputs(NormCase((2, 8)))
    return dy, x.detach(), g.detach()


def _probe(fn) -> tuple[str, str] | None:
    """(status, detail) when calling fn says 'not implemented' or raises; None when it returns."""
    try:
        return (NOT_IMPLEMENTED, "") if A.call(fn) is A.NOT_IMPLEMENTED else None
    except Exception as exc:  # noqa: BLE001
        return ERROR, f"raised {type(exc).__name__}: {exc} (at {A.where(exc)})"


def attention_worker(
    adapters_path: str, opts: Options, impls=None, timed_impls=None, props=None, progress=None
) -> TopicResult:
    """The file's FlashAttention-2 implementations checked (those in `impls`; None: all; only the properties in
    `props` when given), then, when opts.timed, timed beside ours and SDPA (those that passed, or `timed_impls`).
    progress: a file to note each property in (read_progress). A launched rank."""
    from helpers.attention import FlashAttentionPyTorch, FlashAttentionTriton

    global _PROGRESS
    _PROGRESS = progress
    module, res, yours = A.load(adapters_path), TopicResult("attention"), {}
    for adapter, _name in _named(module, "attention", res, impls):
        if not _checked(res, adapter, attention_suites(adapter.impl, opts), props, yours):
            return res
    if timed_impls is not None:
        yours = _applies(module, "attention", timed_impls)
    ours = {"pytorch": FlashAttentionPyTorch.apply, "triton": FlashAttentionTriton.apply}
    if opts.timed:
        _timed(res, lambda e: attn_timing(yours, opts=opts, ours=ours, errors=e))
    return res
