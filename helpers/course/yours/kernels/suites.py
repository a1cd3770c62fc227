"""Which properties `yours` checks a kernel implementation on, and how close it must come: the suites of
norm_checks' and attn_checks' cases for each implementation, the Triton ones by the device they run on (the course's
bound for fp32 on a GPU, where tl.dot rounds to TF32; bf16 values judged on a GPU only, Triton's interpreter cannot
compute them) and the profile (the benchmark's sizes on a GPU).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from helpers.course.yours.kernels.attention import (
    ATTN_BEYOND,
    ATTN_CAUSAL_RUNS,
    ATTN_LAYOUTS,
    ATTN_PYTORCH_BEYOND,
    ATTN_PYTORCH_CONTRACT,
    ATTN_PYTORCH_MASK,
    ATTN_TRITON_CONTRACT,
    ATTN_TRITON_GPU_BEYOND,
    ATTN_TRITON_GPU_CONTRACT,
    COURSE,
    DERIVED,
    LSE_CASE,
    attn_layout_outputs,
    check_attn_function,
    check_lse_saved,
    check_nothing_square_saved,
)
from helpers.course.yours.kernels.numerics import BackwardMissing, layout_differs
from helpers.course.yours.kernels.rmsnorm import (
    NORM_BEYOND,
    NORM_CONTRACT,
    NORM_GPU_CONTRACT,
    NORM_LAYOUTS,
    check_norm_function,
    norm_layout_outputs,
)
from helpers.course.yours.kernels.triton_runtime import interpreted
from helpers.course.yours.options import Options


@dataclass
class Suite:
    """Properties ({name: cases}) checked by check(apply, case, device); beyond: past the handout's promises."""

    properties: dict
    check: object
    beyond: bool = False
    refusable: bool = False  # a clear error is information (a layout the handout lets a wrapper refuse)


class NotALayoutBug(Exception):
    """A layout case whose plain (contiguous, dense-gradient) twin fails too: the rules above judge that mistake."""


def layout_check(check, apply, case, device="cpu", *, twin_outputs=None) -> str:
    """check on a layout case (an expanded gradient, a transposed or sliced view), once its plain twin passes: a
    failure here is then the layout's, not a mistake every input shows (NotALayoutBug otherwise). Where the twin
    fails, twin_outputs (norm_layout_outputs, attn_layout_outputs) still judges the layout: the layout case's outputs
    against the same implementation's on the same values laid out contiguously (numerics.layout_differs)."""
    plain = dataclasses.replace(case, **{f: False for f in ("expanded", "sliced", "transposed") if hasattr(case, f)})
    try:
        failed = "fails already" if check(apply, plain, device) else ""
    except Exception as exc:  # noqa: BLE001 - the twin raising (an out-of-bounds load, say) is failing too
        failed = "has no backward yet" if isinstance(exc, BackwardMissing) else f"raises {type(exc).__name__} already"
    if not failed:
        return check(apply, case, device)
    twin = f"its contiguous twin ({plain}) {failed} (the rules above)"
    if failed != "fails already" or twin_outputs is None:
        raise NotALayoutBug(f"{case}: not judged here - {twin}")
    try:
        layout, dense, bound = twin_outputs(apply, case, device)
    except Exception:  # noqa: BLE001 - the contiguous run raising is not the layout's doing
        raise NotALayoutBug(f"{case}: not judged here - {twin}") from None
    differs = layout_differs(layout(), dense, bound)  # the layout run's own exception is judged as the layout's
    if differs:
        return f"{case}: {differs} - the layout is read wrong ({twin})"
    raise NotALayoutBug(
        f"{case}: not judged against float64 here - {twin}; on the same values laid out contiguously it gives the "
        "same outputs"
    )


def triton_device() -> str:
    """Where a Triton implementation's inputs live: the GPU when there is one, else the CPU (the interpreter)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def norm_suites(impl: str, opts: Options) -> list[Suite]:
    """An RMSNorm Function's suites; on a GPU with the gpu profile, also the benchmark's own sizes."""
    contract, check = dict(NORM_CONTRACT), check_norm_function
    if impl == "triton":
        check = interpreted(check_norm_function)
        if triton_device() == "cuda" and opts.profile == "gpu":
            contract.update(NORM_GPU_CONTRACT)
    on_layouts = functools.partial(layout_check, check, twin_outputs=norm_layout_outputs)
    layouts = Suite(NORM_LAYOUTS, on_layouts, refusable=True)
    return [Suite(contract, check), layouts, Suite(NORM_BEYOND, check, beyond=True)]


def attention_suites(impl: str, opts: Options) -> list[Suite]:
    """A FlashAttention Function's suites. The Triton version on a GPU is held to the course's own bound for fp32
    (tl.dot rounds fp32 to TF32 there by default; the course's tests accept 1e-2: a bound derived for TF32 is no
    tighter at these sizes, one derived for fp32 fails every default kernel); with the gpu profile also the
    benchmark's sizes."""
    lse_case = {"exactly one (batch, N_q) logsumexp saved for backward": [LSE_CASE]}
    square = Suite({"nothing N_q x N_k saved for backward": [LSE_CASE]}, check_nothing_square_saved, beyond=True)
    if impl != "triton":
        return [
            Suite(ATTN_PYTORCH_CONTRACT, check_attn_function),
            Suite(ATTN_CAUSAL_RUNS, functools.partial(check_attn_function, mask_optional=True)),
            Suite(lse_case, check_lse_saved),
            Suite(
                ATTN_LAYOUTS,
                functools.partial(layout_check, check_attn_function, twin_outputs=attn_layout_outputs),
                refusable=True,
            ),  # fmt: skip
            Suite(ATTN_PYTORCH_MASK, check_attn_function, beyond=True),
            # a PyTorch version that leaves the mask out (allowed) is judged on 4-D, tails and bf16 for what they are
            Suite(ATTN_PYTORCH_BEYOND, functools.partial(check_attn_function, mask_optional=True), beyond=True),
            square,
        ]
    gpu = triton_device() == "cuda"
    tolerance = COURSE if gpu else DERIVED  # the interpreter's tl.dot is exact fp32: the derived bound holds
    check = interpreted(functools.partial(_attn_check_at, tolerance=tolerance))
    twin = functools.partial(attn_layout_outputs, tolerance=tolerance)
    contract = {**ATTN_TRITON_CONTRACT, **(ATTN_TRITON_GPU_CONTRACT if gpu and opts.profile == "gpu" else {})}
    suites = [
        Suite(contract, check),
        Suite(lse_case, functools.partial(check_lse_saved, tolerance=tolerance)),
        Suite(ATTN_LAYOUTS, functools.partial(layout_check, check, twin_outputs=twin), refusable=True),
        Suite(ATTN_BEYOND, check, beyond=True),
        square,
    ]
    if gpu and opts.profile == "gpu":
        suites.append(Suite(ATTN_TRITON_GPU_BEYOND, check, beyond=True))
    return suites


def _attn_check_at(apply, case, device="cpu", *, tolerance: str):
    """check_attn_function with the course's bound for fp32 only (bf16 keeps the bound derived from its own unit)."""
    use = tolerance if case.dtype == torch.float32 else DERIVED
    return check_attn_function(apply, case, device, tolerance=use)


def property_names(topic: str, impl: str, opts: Options) -> list[tuple[str, bool]]:
    """(property, beyond) an implementation is checked on, in order (the driver resumes after a crash with those
    not yet judged)."""
    if topic == "rmsnorm" and impl in ("backward_g", "backward_x"):
        return [(backward_property(impl), False)]
    suites = norm_suites(impl, opts) if topic == "rmsnorm" else attention_suites(impl, opts)
    return [(p, s.beyond) for s in suites for p in s.properties]


def backward_property(impl: str) -> str:
    """The one property of the 2024 edition's standalone backward functions."""
    return f"{'dg' if impl == 'backward_g' else 'dx'} vs float64, fp32 (..., H)"
