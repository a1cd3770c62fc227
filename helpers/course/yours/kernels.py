"""The kernel topics of `yours`: a student's RMSNorm and FlashAttention-2 checked (norm_checks, attn_checks, with
the numerics of numerics.py), judged only where this environment can run them (triton_runtime), and timed beside
ours and PyTorch's. One launched rank runs one implementation's checks, or the timing.

What counts is what each edition's handout and tests promise (../shared/curricula.md, "The contract"): RMSNorm in fp32
on (..., H) with eps 1e-5; FlashAttention-2 in fp32 on 3-D (batch, T, d) with T and d powers of two, at least 16, N_q
and N_k possibly different; the PyTorch version may ignore is_causal. Everything else (bf16, non-contiguous views,
lengths that are not tile multiples, 4-D inputs, an enforced causal mask in the PyTorch version) is a probe "beyond
the handout": reported, never in the exit status. A Triton case this environment cannot run (no GPU for a wrapper
that asks for CUDA, a Triton without block pointers, a case the companion's own kernel fails here) is "needs a GPU" or
"needs another Triton", not a failure.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from helpers.course.yours import Options
from helpers.course.yours import adapters as A
from helpers.course.yours.attn_checks import (
    ATTN_BEYOND,
    ATTN_CAUSAL_RUNS,
    ATTN_PROPERTIES,  # noqa: F401
    ATTN_PYTORCH_BEYOND,
    ATTN_PYTORCH_CONTRACT,
    ATTN_TRITON_CONTRACT,
    LSE_CASE,
    AttnCase,
    attn_inputs,
    check_attn_function,
    check_lse_saved,
    check_nothing_square_saved,
)
from helpers.course.yours.norm_checks import (
    NORM_BEYOND,
    NORM_CONTRACT,
    NormCase,  # noqa: F401
    check_norm_backward,
    check_norm_function,
    norm_inputs,
)
from helpers.course.yours.numerics import EPS, BackwardMissing, ShapeError, saved_tensors, short  # noqa: F401
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
from helpers.course.yours.triton_runtime import TritonRuntime, block_pointer_probe, triton_runtime, unrunnable  # noqa: F401
from helpers.timing import MIN_PAIRS, compare, ratio_columns, verdict

# ---- running a topic: inside a launched worker (student code never runs in the driver) ---------------------------


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


@dataclass
class Suite:
    """Properties ({name: cases}) checked by check(apply, case, device); beyond: past the handout's promises."""

    properties: dict
    check: object
    beyond: bool = False


def _function_checks(
    adapter: A.Adapter, suites: list[Suite], runtime: TritonRuntime | None = None, parts=("course", "beyond")
) -> tuple[object, list[Check]]:
    """An adapter that returns an autograd.Function: (its apply or None, the checks); a wrong return kind is an
    ERROR, NotImplementedError 'not implemented'. runtime: judge a Triton implementation only where ours runs.
    parts: the suites within the handout ("course"), those beyond it ("beyond"), or both (Options.parts)."""
    topic, impl = adapter.topic, adapter.impl
    suites = [s for s in suites if ("beyond" if s.beyond else "course") in parts]
    try:
        cls = _function_class(adapter, A.ADAPTERS[topic][impl][0])
    except Exception as exc:  # noqa: BLE001 - the student's getter raised or returned the wrong kind
        return None, [Check(topic, impl, "returns an autograd.Function", ERROR, str(exc))]
    if cls is A.NOT_IMPLEMENTED:
        return None, [Check(topic, impl, "implemented", NOT_IMPLEMENTED)]
    kind = A.function_type(cls)  # judged through .apply; the type is information
    typed = [Check(topic, impl, FUNCTION_TYPE, FAIL, f"returned {kind}: its .apply was checked", True, ONLY_APPLY)]
    device = runtime.device if runtime else "cpu"
    checks = [
        c
        for suite in suites
        for c in _run_properties(
            topic,
            impl,
            suite.properties,
            lambda case, check=suite.check: check(cls.apply, case, device),
            beyond=suite.beyond,
            runtime=runtime,
        )
    ]
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
    return cls.apply, checks + (typed if kind and "beyond" in parts else [])


FUNCTION_TYPE = "a torch.autograd.Function subclass (the type the adapter's docstring names)"
ONLY_APPLY = "the course's tests call only its .apply"  # why the type is information, not a rule


def _run_properties(
    topic: str, impl: str, properties: dict, check, *, beyond: bool = False, runtime: TritonRuntime | None = None
) -> list[Check]:
    """One Check per property: the first failing case's detail, or pass; an exception in student code is ERROR;
    a case this environment cannot run (runtime) makes the property NEEDS_GPU / NEEDS_TRITON, not a failure."""
    out, forward_only = [], ""
    for prop, cases in properties.items():
        failed, cannot = None, None  # (status, detail): the first case that fails; the first that cannot run here
        for case in cases:
            try:
                detail = check(case)
                status = FAIL if detail else PASS
            except ShapeError as exc:
                status, detail = FAIL, f"{case}: {exc}"
            except BackwardMissing as exc:
                status, detail = PASS, ""
                forward_only = str(exc)
            except Exception as exc:  # noqa: BLE001 - the student's code raised: say what and where
                why = unrunnable(exc, runtime) if runtime else None
                if why:
                    cannot = cannot or (why[0], f"{case}: {why[1]}")
                    continue
                status, detail = ERROR, f"{case}: raised {type(exc).__name__}: {exc} (at {A.where(exc)})"
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
        status, detail = failed or cannot or (PASS, FORWARD_ONLY if forward_only else "")
        out.append(Check(topic, impl, prop, status, detail, beyond=beyond))
    return out


FORWARD_ONLY = "forward only: the backward is not implemented"


def _named(module, topic: str, res: TopicResult, only=None):
    """(adapter, its constructor's name) for each implementation of `topic` the file names (those in `only`, when
    given); a SKIPPED check in `res` for each it does not (another edition's)."""
    for adapter in A.implementations(module, topic):
        if only is not None and adapter.impl not in only:
            continue
        name = A.ADAPTERS[topic][adapter.impl][0]
        absent = _absent_or_missing(topic, adapter, name)
        if absent:
            res.checks.append(absent)
        else:
            yield adapter, name


def _absent_or_missing(topic: str, adapter: A.Adapter, name: str) -> Check | None:
    if not adapter.ok or name not in adapter.fns:
        return Check(topic, adapter.impl, "adapter present", SKIPPED, f"no {name} in the file (another edition's)")
    return None


def _fwd_bwd(apply, *inputs, grad_out):
    """A callable: apply(*inputs) and its backward with grad_out (what every timing row measures)."""
    leaves = [t for t in inputs if isinstance(t, Tensor) and t.requires_grad]
    return lambda: torch.autograd.grad(apply(*inputs), leaves, grad_out)


def timing_rows(topic: str, calls: dict, *, baseline: str, opts: Options, shape: str) -> list[dict]:
    """Every call timed in ONE interleaved loop; a row each: median, the paired ratio to `baseline`, the verdict."""
    comp = compare(calls, steps=max(opts.steps, MIN_PAIRS), warmup=opts.warmup, baseline=baseline)
    rows = []
    for label, samples in comp.samples.items():
        who, impl = label.split(":", 1)
        r = comp.ratio(label)
        rows.append(
            {
                "topic": topic,
                "measure": "fwd+bwd time",
                "who": who,
                "impl": impl,
                "shape": shape,
                "value": float(torch.tensor(samples).median()),
                "unit": "s",
                "device": comp.device,
                "baseline": baseline,
                **ratio_columns(r),
                "verdict": "" if label == baseline else verdict(label, baseline, r),
            }
        )
    return rows


def saved_bytes(fn, inputs) -> int:
    """Bytes autograd keeps for fn(*inputs)'s backward beyond the inputs themselves (unique storages)."""
    _, saved = saved_tensors(lambda: fn(*inputs))
    own = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, Tensor)}
    kept = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}
    return sum(n for ptr, n in kept.items() if ptr not in own)


def memory_rows(topic: str, fns: dict, inputs, *, shape: str, formula: int | None) -> list[dict]:
    """Bytes each implementation saves for backward beyond its inputs, beside the closed form (FlashAttention: O, L)."""
    rows = [
        {
            "topic": topic,
            "measure": "saved for backward",
            "who": label.split(":", 1)[0],
            "impl": label.split(":", 1)[1],
            "shape": shape,
            "value": saved_bytes(f, inputs),
            "unit": "B",
        }
        for label, f in fns.items()
    ]
    if formula is not None:
        rows.append(
            {
                "topic": topic,
                "measure": "saved for backward",
                "who": "formula",
                "impl": "FlashAttention-2: O and L",
                "shape": shape,
                "value": formula,
                "unit": "B",
            }
        )
    return rows


def _timed(res: TopicResult, timing) -> None:
    """Add timing()'s rows to res; an exception while timing is its own row, beside the checks already made (the
    timing shapes go past the handout's: it never changes the exit status)."""
    try:
        res.rows += timing()
    except Exception as exc:  # noqa: BLE001 - one failure hides nothing else
        res.checks.append(
            Check(
                res.topic,
                "-",
                "timing runs",
                ERROR,
                f"raised {type(exc).__name__}: {exc} (at {A.where(exc)})",
                beyond=True,
            )
        )


def _applies(module, topic: str, impls) -> dict:
    """{impl: Function.apply} of the named implementations (already checked in another launch), for timing."""
    out = {}
    for adapter in A.implementations(module, topic):
        name = A.ADAPTERS[topic][adapter.impl][0]
        if adapter.impl in impls and adapter.ok and name.startswith("get_"):  # not the 2024 backward functions
            cls = _function_class(adapter, name)
            out[adapter.impl] = cls.apply
    return out


def rmsnorm_worker(adapters_path: str, opts: Options, impls=None, timed_impls=None) -> TopicResult:
    """The file's RMSNorm implementations checked (those in `impls`; None: all), then, when opts.timed, timed beside
    ours and PyTorch's: those that passed here, or `timed_impls` when given (checked in another launch). A launched
    rank: student code never runs in the driver."""
    from helpers.rmsnorm import RMSNormPyTorchFunction, RMSNormTritonFunction

    module, res, yours = A.load(adapters_path), TopicResult("rmsnorm"), {}
    suites = [Suite(NORM_CONTRACT, check_norm_function), Suite(NORM_BEYOND, check_norm_function, beyond=True)]
    for adapter, name in _named(module, "rmsnorm", res, impls):
        if adapter.impl in ("backward_g", "backward_x"):
            res.checks += _backward_checks(adapter, name)
            continue
        runtime = triton_runtime("rmsnorm") if adapter.impl == "triton" else None
        apply, checks = _function_checks(adapter, suites, runtime, opts.parts)
        res.checks += checks
        if apply is not None and passed(checks, adapter.impl):
            yours[adapter.impl] = apply
    if timed_impls is not None:
        yours = _applies(module, "rmsnorm", timed_impls)
    rows, H = (1024, 1024) if opts.profile == "cpu" else (50_000, 4096)
    dtype = torch.float32 if opts.profile == "cpu" else torch.bfloat16
    if opts.timed:
        ours = {"pytorch": RMSNormPyTorchFunction.apply, "triton": RMSNormTritonFunction.apply}
        _timed(res, lambda: norm_timing(yours, rows=rows, H=H, dtype=dtype, opts=opts, ours=ours))
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
        {f"{which} vs float64, fp32 (..., H)": cases},
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


def norm_timing(yours: dict, *, rows: int, H: int, dtype, opts: Options, ours: dict) -> list[dict]:
    """fwd+bwd of yours, ours and PyTorch's (F.rms_norm; compiled when opts.compiled) on (rows, H), interleaved.
    Triton implementations are timed on a GPU only (the CPU's interpreter measures Python, not the kernel)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, H, generator=gen).to(device, dtype).requires_grad_()  # (rows, H)
    g = (1 + 0.1 * torch.randn(H, generator=gen)).to(device, dtype).requires_grad_()  # (H,)
    dy = torch.randn(rows, H, generator=gen).to(device, dtype)  # (rows, H)
    fns = {f"ours:{k}": f for k, f in ours.items()}
    fns.update({f"yours:{k}": f for k, f in yours.items()})
    fns["pytorch:F.rms_norm"] = lambda x, g: F.rms_norm(x, (x.shape[-1],), g, EPS)
    if opts.compiled:
        fns["pytorch:compiled"] = torch.compile(lambda x, g: F.rms_norm(x, (x.shape[-1],), g, EPS), dynamic=False)
    if device == "cpu":
        fns = {k: f for k, f in fns.items() if not k.endswith("triton")}
    calls = {k: _fwd_bwd(f, x, g, grad_out=dy) for k, f in fns.items()}
    shape = f"{short(dtype)} {rows}x{H}"
    eager = {k: f for k, f in fns.items() if not k.endswith("compiled")}
    return timing_rows("rmsnorm", calls, baseline="ours:pytorch", opts=opts, shape=shape) + memory_rows(
        "rmsnorm", eager, (x, g), shape=shape, formula=None
    )


def attention_worker(adapters_path: str, opts: Options, impls=None, timed_impls=None) -> TopicResult:
    """The file's FlashAttention-2 implementations checked (those in `impls`; None: all), then, when opts.timed,
    timed beside ours and SDPA (those that passed, or `timed_impls`). A launched rank."""
    from helpers.attention import FlashAttentionPyTorch, FlashAttentionTriton

    module, res, yours = A.load(adapters_path), TopicResult("attention"), {}
    lse = Suite({"exactly one (batch, N_q) logsumexp saved for backward": [LSE_CASE]}, check_lse_saved)
    square = Suite({"nothing N_q x N_k saved for backward": [LSE_CASE]}, check_nothing_square_saved, beyond=True)
    for adapter, _name in _named(module, "attention", res, impls):
        if adapter.impl == "triton":
            suites = [
                Suite(ATTN_TRITON_CONTRACT, check_attn_function),
                lse,
                Suite(ATTN_BEYOND, check_attn_function, beyond=True),
                square,
            ]
        else:
            runs = functools.partial(check_attn_function, mask_optional=True)
            suites = [
                Suite(ATTN_PYTORCH_CONTRACT, check_attn_function),
                Suite(ATTN_CAUSAL_RUNS, runs),
                lse,
                Suite(ATTN_PYTORCH_BEYOND, check_attn_function, beyond=True),
                square,
            ]
        runtime = triton_runtime("attention") if adapter.impl == "triton" else None
        apply, checks = _function_checks(adapter, suites, runtime, opts.parts)
        res.checks += checks
        if apply is not None and passed(checks, adapter.impl):
            yours[adapter.impl] = apply
    if timed_impls is not None:
        yours = _applies(module, "attention", timed_impls)
    ours = {"pytorch": FlashAttentionPyTorch.apply, "triton": FlashAttentionTriton.apply}
    if opts.timed:
        _timed(res, lambda: attn_timing(yours, opts=opts, ours=ours))
    return res


def attn_timing(yours: dict, *, opts: Options, ours: dict) -> list[dict]:
    """fwd+bwd of yours, ours and SDPA, interleaved, on 3-D inputs as the handout's skeleton takes them: on a GPU at
    the 2025 leaderboard's work (bf16, causal, 16 heads x 16384 x 64, the heads as the batch) without the tiled
    PyTorch versions (a million eager launches each: minutes), baseline our Triton; on a CPU a small fp32 shape
    without Triton (the interpreter times Python), baseline our PyTorch version."""
    gpu = torch.cuda.is_available() and opts.profile == "gpu"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    case = (
        AttnCase(16384, 16384, 64, True, torch.bfloat16, batch=16)
        if gpu
        else AttnCase(128, 128, 64, False, torch.float32, batch=4)
    )  # the PyTorch version may ignore is_causal
    q, k, v, do = attn_inputs(case, device=device)
    fns = {f"ours:{k_}": f for k_, f in ours.items()}
    fns.update({f"yours:{k_}": f for k_, f in yours.items()})
    fns["pytorch:sdpa"] = lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c)
    drop = "pytorch" if gpu else "triton" if device == "cpu" else None
    fns = {k_: f for k_, f in fns.items() if not (drop and k_.endswith(drop))}
    calls = {k_: _fwd_bwd(f, q, k, v, case.is_causal, grad_out=do) for k_, f in fns.items()}
    formula = case.batch * case.Tq * case.d * case.dtype.itemsize + case.batch * case.Tq * 4  # O, and L in fp32
    baseline = "ours:triton" if gpu else "ours:pytorch"
    return timing_rows("attention", calls, baseline=baseline, opts=opts, shape=str(case)) + memory_rows(
        "attention", fns, (q, k, v, case.is_causal), shape=str(case), formula=formula
    )
