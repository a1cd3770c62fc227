"""FlashAttention-2 checks (2025/2026 editions): a student's Function against the float64 reference of attn_reference
(FA-2's backward in closed form), the logsumexp it saves, and which inputs the handout promises.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from helpers.course.yours.kernels.attention_reference import Reference, Variant, attn_float64
from helpers.course.yours.kernels.numerics import (
    DTYPE_MISMATCH,
    U32,
    BackwardMissing,
    ShapeError,
    _grads,
    bounds,
    constant_factor,
    contiguous_twin,
    first_mismatch,
    matches,
    outputs,
    saved_tensors,
    short,
    unit,
    worst,
)


@dataclass(frozen=True)
class AttnCase:
    """One attention input: (batch, Tq, d) as the handout's skeleton has it, or (batch, heads, Tq, d) with heads."""

    Tq: int
    Tk: int
    d: int
    is_causal: bool
    dtype: torch.dtype = torch.float32
    batch: int = 2
    heads: int = 0  # 0: 3-D inputs
    sliced: bool = False  # q, k, v are slices [..., :d] of one wider (.., T, 3d) projection: rows 3d apart
    expanded: bool = False  # do is one value expanded over o (stride 0), as o.sum().backward() passes it

    def __str__(self) -> str:
        lead = f"{self.batch}x{self.heads}" if self.heads else f"batch {self.batch}"
        extra = (", q, k, v sliced from a wider projection" if self.sliced else "") + (
            ", do expanded (stride 0)" if self.expanded else ""
        )
        causal = ", causal" if self.is_causal else ""
        return f"{short(self.dtype)} {lead}, Tq={self.Tq}, Tk={self.Tk}, d={self.d}{causal}{extra}"


BF16 = torch.bfloat16
# 2025/2026 handouts and tests (flash_forward, flash_backward): 3-D (batch, N, d), N and d powers of two and at least 16
# ("we will always test your code with" such sizes; the tests: fp32 4 x 128 x 64), N_q and N_k may differ; the
# PyTorch version may ignore is_causal (flash_forward (a)). Exactly one (batch, N_q) logsumexp is saved (the tests
# look for it).
ATTN_PYTORCH_CONTRACT = {
    "output and gradients vs float64, fp32 (batch, N, d)": [
        AttnCase(128, 128, 64, False, batch=4),
        AttnCase(16, 16, 16, False),
    ],
    "N_q != N_k (powers of two)": [AttnCase(64, 128, 32, False), AttnCase(128, 64, 32, False)],
    "head dims 16 to 128": [AttnCase(32, 32, 128, False)],
}
ATTN_CAUSAL_RUNS = {  # the PyTorch version: is_causal=True must run; the mask may be ignored
    "is_causal=True runs (the mask may be ignored)": [AttnCase(16, 16, 16, True), AttnCase(128, 128, 64, True)],
}
# The Triton version, in addition: the grid is (T_q, batch) (flash_forward (b)), it masks causally when asked
# (flash_forward (c)), and flash_benchmarking (a) runs it at N 128 to 65,536, d 16 to 128, in bf16 and fp32 (its
# output in the input's dtype: "cast O_i to the appropriate dtype"). Here the CPU-affordable cases that take the same
# code paths: several query and key tiles, batch elements that outnumber the query tiles (a grid whose axes are
# swapped against program_id reads and writes the wrong ones), N = 16 (shorter than most tiles: a load without a
# boundary check, or a tile's zero-padded keys left in the softmax), N_q != N_k, d = 16 and 128, bf16 and fp32.
ATTN_TRITON_CONTRACT = {
    "batch elements apart from query tiles (the grid is (T_q, batch))": [AttnCase(64, 64, 32, False, batch=5)],
    "output and gradients vs float64, fp32 (batch, N, d)": [AttnCase(128, 128, 64, False, batch=2)],
    "N = 16, shorter than a tile of 32 or more": [
        AttnCase(16, 16, 16, False, batch=3),
        AttnCase(16, 16, 32, True, batch=3),
    ],
    "N_q != N_k (powers of two)": [AttnCase(64, 128, 32, False, batch=2), AttnCase(128, 64, 32, False, batch=2)],
    "causal mask (query i sees keys j <= i)": [AttnCase(128, 128, 32, True, batch=1)],
    "head dims 16 to 128": [AttnCase(128, 128, 16, True, batch=1), AttnCase(64, 64, 128, False, batch=1)],
    "bf16 (the handout benchmarks bf16 and fp32)": [
        AttnCase(128, 128, 64, True, BF16, batch=1),
        AttnCase(64, 64, 16, False, BF16, batch=2),
    ],
}
# On a GPU (the gpu profile): the benchmark's sizes, up to the leaderboard's N = 16,384 (bf16, causal, which "must
# pass the same tests"); its longest, 65,536, is reported only: a backward by recomputation in PyTorch, which the
# handout suggests, may run out of memory there.
ATTN_TRITON_GPU_CONTRACT = {
    "the benchmark's sizes (N to 16,384, d 16 to 128, bf16 and fp32, causal)": [
        AttnCase(16384, 16384, 64, True, BF16, batch=1),
        AttnCase(16384, 16384, 128, True, batch=1),
        AttnCase(4096, 4096, 16, True, BF16, batch=1),
        AttnCase(128, 128, 128, True, batch=1),
    ],
}
ATTN_TRITON_GPU_BEYOND = {
    "N = 65,536, the benchmark's longest (a recomputing backward may run out of memory)": [
        AttnCase(65536, 65536, 64, True, BF16, batch=1),
    ],
}
# The autograd contract (helpers.course.yours.kernels.suites runs these with a clear refusal as information): the
# backward gets whatever gradient autograd passes (o.sum().backward(): stride 0) and q, k, v may be views (slices of
# one fused projection); silently wrong on either fails.
ATTN_LAYOUTS = {
    "an expanded upstream gradient (stride 0, as o.sum().backward() passes)": [
        AttnCase(32, 32, 16, False, batch=1, expanded=True)
    ],
    "sliced inputs (q, k, v as [..., :d] of one wider projection)": [AttnCase(32, 32, 16, False, batch=1, sliced=True)],
}
ATTN_BEYOND = {  # probes past the handout: tails, 4-D
    "lengths that are not tile multiples": [
        AttnCase(37, 37, 16, False, batch=1),
        AttnCase(48, 80, 32, False, batch=1),
        AttnCase(100, 100, 16, True, batch=1),
    ],
    "4-D (batch, heads, N, d)": [AttnCase(32, 32, 32, True, batch=1, heads=2)],
}
ATTN_PYTORCH_MASK = {
    "causal mask applied (optional for the PyTorch version)": [
        AttnCase(16, 16, 16, True),
        AttnCase(128, 128, 64, True),
    ],
}
ATTN_PYTORCH_BEYOND = {  # judged with the mask optional, as the contract's causal runs: the mask is probed alone above
    **ATTN_BEYOND,
    "bf16": [AttnCase(32, 32, 32, True, BF16, batch=1)],
}
ATTN_PROPERTIES = {**ATTN_PYTORCH_CONTRACT, **ATTN_TRITON_CONTRACT, **ATTN_PYTORCH_MASK, **ATTN_PYTORCH_BEYOND}
LSE_CASE = AttnCase(64, 64, 32, False)

# How close an output must be: DERIVED from the dtype's arithmetic (numerics.py); COURSE, the course's own bound for
# its Triton tests on a GPU, assert_close(rtol=1e-2, atol=1e-2), where tl.dot rounds fp32 operands to TF32 by default.
DERIVED, COURSE = "derived", "course"
COURSE_TOL = 1e-2


def attn_inputs(case: AttnCase, seed: int = 0, device="cpu") -> tuple[Tensor, ...]:
    """q, k, v (requiring grad) and do, drawn in fp32 on the CPU, then cast and moved to `device`."""
    gen = torch.Generator().manual_seed(seed)
    lead = (case.batch, case.heads) if case.heads else (case.batch,)

    def draw(T, grad=True):
        t = torch.randn(*lead, T, case.d * (3 if case.sliced else 1), generator=gen).to(device, case.dtype)
        return t[..., : case.d].requires_grad_(grad)  # (*lead, T, d), a view with rows 3d apart when sliced

    q, k, v, do = draw(case.Tq), draw(case.Tk), draw(case.Tk), draw(case.Tq, grad=False)
    if case.expanded:
        do = torch.ones((), device=device, dtype=case.dtype).expand(do.shape)  # (*lead, Tq, d), all strides 0
    return q, k, v, do


def attn_bounds(ref: Reference, case: AttnCase, tolerance: str = DERIVED) -> dict:
    """Each output's bound: COURSE's rtol = atol = 1e-2 on the reference, or the derived one (roundings and float32
    sums, plus the scores' error carried through exp: 2 dS, relative)."""
    if tolerance == COURSE:
        return {name: COURSE_TOL + COURSE_TOL * w.abs() for name, w in ref.want.items()}
    dS = unit(case.dtype) * ref.s_max + U32 * ref.s_abs_d
    n = {"o": case.Tk, "lse": case.Tk, "dq": case.Tk + case.d, "dk": case.Tq + case.d, "dv": case.Tq}
    return bounds(ref.scales, case.dtype, n, extra=2 * dS)


def _reference(q, k, v, do, case: AttnCase, tolerance: str, variant: Variant | None = None) -> tuple[dict, dict]:
    """(want, bound) of the variant (default: the right attention for the case)."""
    ref = attn_float64(q, k, v, do, variant or Variant(case.is_causal))
    return ref.want, attn_bounds(ref, case, tolerance)


def _variants(case: AttnCase) -> list[tuple[str, Variant]]:
    """Known mistakes whose whole output signature names them."""
    c = case.is_causal
    out = [("no 1/sqrt(d) scaling of the scores", Variant(c, scaled=False))]
    if case.Tk > case.Tq:
        out.append(
            (
                "keys beyond the first N_q are ignored (the key loop must run over N_k, not N_q)",
                Variant(c, keys=case.Tq),
            )
        )
    padded = set()
    for tile in (16, 32, 64, 128, 256):
        length = -(-case.Tk // tile) * tile
        if length != case.Tk and length not in padded:  # a tile of `tile` keys pads N_k with zero keys
            padded.add(length)
            out.append(
                (
                    f"tiles of {tile} keys pad N_k = {case.Tk} to {length} with zero keys, and they enter the "
                    "softmax (mask the keys j >= N_k, or use tiles no longer than N)",
                    Variant(c, pad_to=tile),
                )
            )
    if c:
        out += [
            ("the causal mask is shifted by one: query i also sees key i+1", Variant(True, shift=1)),
            ("is_causal is ignored (no mask applied)", Variant(False)),
        ]
    return out


def attn_mistake(got: dict, q, k, v, do, case: AttnCase, tolerance: str = DERIVED) -> str:
    """The likely mistake when every output in `got` (o, and dq, dk, dv when there) matches a known wrong variant
    within the same bounds, else ''."""
    for label, variant in _variants(case):
        if matches(got, *_reference(q, k, v, do, case, tolerance, variant)):
            return f"likely mistake: {label}"
    if case.is_causal and not torch.isfinite(got["o"].detach()[..., 0, :]).all():
        return "likely mistake: the causal mask hides the diagonal (query 0 sees no key: NaN)"
    want, bound = _reference(q, k, v, do, case, tolerance)
    batch = _batch_mistake(got["o"], want["o"], bound["o"])
    if batch:
        return batch
    wrong = [n for n in got if got[n].shape == want[n].shape and worst(n, got[n], want[n], bound[n]) is not None]
    return constant_factor(wrong[0], got[wrong[0]], want[wrong[0]], bound[wrong[0]]) if len(wrong) == 1 else ""


def _batch_mistake(o: Tensor, want: Tensor, bound: Tensor) -> str:
    """A batch-shaped signature in the output: the first n batch elements right and the others not (a grid that
    covers too few of them), or every one equal to element 0's attention (no batch offset). '' otherwise."""
    if o.dim() != 3 or o.shape[0] < 2 or o.shape != want.shape:
        return ""
    right = [worst("o", o[b], want[b], bound[b]) is None for b in range(o.shape[0])]
    n = right.index(False) if False in right else len(right)
    if n == len(right) or any(right[n:]):
        return ""
    if all(worst("o", o[b], want[0], bound[0]) is None for b in range(1, o.shape[0])):
        return (
            "likely mistake: every batch element gets element 0's attention: the batch offset "
            "(batch_index * stride_b) is not applied to the pointers"
        )
    if n == 0:
        return ""
    return (
        f"likely mistake: only the first {n} of {o.shape[0]} batch elements are right: a launch grid whose axes are "
        "swapped against tl.program_id? (the handout's grid is (T_q, batch): program_id(0) the query tile, "
        "program_id(1) the batch element)"
    )


@dataclass
class Differs:
    """What differed in one case: the mismatch (or what is missing) and, when recognised, the likely mistake."""

    case: AttnCase
    what: str
    mistake: str = ""
    forward: bool = True  # the forward (o) differs, not only the gradients

    def __str__(self) -> str:
        return f"{self.case}: {self.what}" + (f". {self.mistake}" if self.mistake else "")


def attn_layout_outputs(apply, case: AttnCase, device="cpu", *, tolerance: str = DERIVED) -> tuple:
    """For suites.layout_check: (a call giving the layout case's o, dq, dk, dv; the same implementation's outputs on
    the same values laid out contiguously, run now; their bounds)."""
    q, k, v, do = attn_inputs(case, device=device)
    names, fn = ("o", "dq", "dk", "dv"), lambda *qkv: apply(*qkv, case.is_causal)
    dense = outputs(fn, contiguous_twin((q, k, v)), do.contiguous(), names)
    _, bound = _reference(q, k, v, do, case, tolerance)
    return (lambda: outputs(fn, (q, k, v), do, names)), dense, bound


def check_attn_function(
    apply, case: AttnCase, device="cpu", *, mask_optional: bool = False, tolerance: str = DERIVED
) -> str:
    """'' when o = apply(q, k, v, is_causal) and dq, dk, dv are within the bounds, else what differed.
    mask_optional: a causal case may also match the unmasked result (the PyTorch version may ignore is_causal)."""
    q, k, v, do = attn_inputs(case, device=device)
    o = apply(q, k, v, case.is_causal)
    if not isinstance(o, Tensor):
        raise ShapeError(f"apply(q, k, v, is_causal) returned {type(o).__name__}, expected the output tensor")
    if o.dtype != q.dtype:
        return f"{case}: o is {o.dtype}, {DTYPE_MISMATCH} {q.dtype}"
    grads = _grads(o, (q, k, v), do)
    got = (
        {"o": o}
        if not all(isinstance(g, Tensor) for g in grads)
        else dict(zip(("o", "dq", "dk", "dv"), (o, *grads), strict=True))
    )
    masked = _attn_differs(got, grads, (q, k, v, do), case, tolerance)
    if not (mask_optional and masked):
        return str(masked or "")
    unmasked = _attn_differs(got, grads, (q, k, v, do), replace(case, is_causal=False), tolerance)
    if not unmasked:
        return ""
    if unmasked.forward:
        return str(masked)
    # the forward ignores the mask (allowed) and its gradients are not that forward's
    backward_masked = Variant(False, backward_causal=True)
    likely = matches(got, *_reference(q, k, v, do, case, tolerance, backward_masked))
    hint = (
        "likely mistake: the backward applies the causal mask the forward left out"
        if likely
        else "does the backward apply the causal mask the forward left out?"
    )
    return (
        f"{case}: the forward ignores is_causal (allowed for the PyTorch version), but the gradients are not that "
        f"forward's: {unmasked.what}. {hint} (mask in both or in neither)"
    )


def _attn_differs(got: dict, grads, inputs: tuple, case: AttnCase, tolerance: str) -> Differs | None:
    """How got (o, and its gradients when there) differs from the case's attention, or None."""
    want, bound = _reference(*inputs, case, tolerance)
    want.pop("lse")
    m = worst("o", got["o"], want["o"], bound["o"])  # the forward first: its error explains the gradients'
    if m is not None:  # the forward's own signature names the mistake (the gradients follow from it)
        return Differs(case, str(m), attn_mistake({"o": got["o"]}, *inputs, case, tolerance))
    if isinstance(grads[0], str):
        raise BackwardMissing(f"{case}: forward within its bounds")
    if len(got) == 1:
        missing = "qkv"[[gr is None for gr in grads].index(True)]
        return Differs(case, f"no gradient for {missing} (is backward returning it?)", forward=False)
    try:
        m = first_mismatch(got, want, bound)
    except ShapeError as exc:
        return Differs(case, str(exc), forward=False)
    return None if m is None else Differs(case, str(m), attn_mistake(got, *inputs, case, tolerance), forward=False)


def check_lse_saved(apply, case: AttnCase = LSE_CASE, device="cpu", *, tolerance: str = DERIVED) -> str:
    """Exactly one logsumexp (shape (batch, N_q), as the course's tests look for it) saved for backward, equal to
    float64's L."""
    q, k, v, do = attn_inputs(case, device=device)
    _, saved = saved_tensors(lambda: apply(q, k, v, case.is_causal))
    rows = [t for t in saved if tuple(t.shape) == tuple(q.shape[:-1])]
    if len(rows) != 1:
        return (
            f"{case}: {len(rows)} tensors of shape {tuple(q.shape[:-1])} saved for backward, expected exactly one "
            "(the logsumexp L = m + log(l)); "
            + ("saving m and l separately?" if len(rows) == 2 else "backward must rebuild P from L")
        )
    want, bound = _reference(q, k, v, do, case, tolerance)
    m = worst("L", rows[0], want["lse"], bound["lse"])
    return "" if m is None else f"{case}: the saved (..., Tq) tensor is not the logsumexp of the scores: {m}"


def check_nothing_square_saved(apply, case: AttnCase = LSE_CASE, device="cpu") -> str:
    """Nothing (Tq, Tk)-sized saved for backward: the handout saves L, Q, K, V, O (beyond what the tests check)."""
    q, k, v, _ = attn_inputs(case, device=device)
    _, saved = saved_tensors(lambda: apply(q, k, v, case.is_causal))
    square = [tuple(t.shape) for t in saved if t.dim() >= 2 and tuple(t.shape[-2:]) == (case.Tq, case.Tk)]
    return (
        f"{case}: a tensor of shape {square[0]} is saved for backward: O(T^2) memory; save L instead" if square else ""
    )
