"""The side-by-side rows of `yours`' kernel topics: a student's RMSNorm and FlashAttention-2 timed in one interleaved
loop beside ours and PyTorch's, and the bytes each saves for backward (kernels.py calls these once the checks ran).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from helpers.course.yours.kernels.attention import AttnCase, attn_inputs
from helpers.course.yours.kernels.numerics import EPS, saved_tensors, short
from helpers.course.yours.kernels.triton_runtime import cuda_broken, is_cuda_error
from helpers.course.yours.options import Options
from helpers.timing import MIN_PAIRS, compare, ratio_columns, verdict


def _fwd_bwd(apply, *inputs, grad_out):
    """A callable: apply(*inputs) and its backward with grad_out (what every timing row measures)."""
    leaves = [t for t in inputs if isinstance(t, Tensor) and t.requires_grad]
    return lambda: torch.autograd.grad(apply(*inputs), leaves, grad_out)


class TimingFault(Exception):
    """A timing row's call left a CUDA error: this process cannot time anything else (run_kernel_topic times the
    other rows in a fresh process, and this one once more alone with the baseline)."""

    def __init__(self, label: str, why: str):
        super().__init__(f"{label}: {why}")
        self.label, self.why = label, why


def runnable(calls: dict, *, baseline: str, opts: Options, errors: list) -> dict:
    """The calls to time: those opts.timing_skip/timing_only leave, each run once alone first so that one row's
    error hides no other (appended to `errors` as (label, why)); TimingFault on a CUDA error (the process is gone)."""
    keep = {k: f for k, f in calls.items() if k not in opts.timing_skip}
    if opts.timing_only:
        keep = {k: f for k, f in keep.items() if k in opts.timing_only or k == baseline}
    out = {}
    for label, call in keep.items():
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - one row's error is that row's
            why = f"raised {type(exc).__name__}: {exc}"
            if is_cuda_error(exc) or cuda_broken():
                raise TimingFault(label, why) from exc
            errors.append((label, why))
        else:
            out[label] = call
    return out


def timing_rows(topic: str, calls: dict, *, baseline: str, opts: Options, shape: str, errors=None) -> list[dict]:
    """Every call that runs timed in ONE interleaved loop; a row each: median, the paired ratio to `baseline`, the
    verdict. A call that raises is left out and named in `errors`; without the baseline, the first that runs is."""
    calls = runnable(calls, baseline=baseline, opts=opts, errors=[] if errors is None else errors)
    if not calls:
        return []
    baseline = baseline if baseline in calls else next(iter(calls))
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


def norm_timing(yours: dict, *, rows: int, H: int, dtype, opts: Options, ours: dict, errors=None) -> list[dict]:
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
    timed = timing_rows("rmsnorm", calls, baseline="ours:pytorch", opts=opts, shape=shape, errors=errors)
    eager = {k: f for k, f in eager.items() if k in {r["who"] + ":" + r["impl"] for r in timed}}
    return timed + memory_rows("rmsnorm", eager, (x, g), shape=shape, formula=None)


def sdpa_3d(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> Tensor:
    """PyTorch's SDPA on the handout's 3-D (batch, N, d) inputs, given to it in 4-D as (1, batch, N, d): its fused
    kernels (flash, memory-efficient, cuDNN) take only 4-D inputs, and on 3-D ones it falls back to the math path."""
    return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=is_causal)[0]  # (batch, N, d)


def attn_timing(yours: dict, *, opts: Options, ours: dict, errors=None) -> list[dict]:
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
    fns["pytorch:sdpa"] = sdpa_3d
    drop = "pytorch" if gpu else "triton" if device == "cpu" else None
    fns = {k_: f for k_, f in fns.items() if not (drop and k_.endswith(drop))}
    calls = {k_: _fwd_bwd(f, q, k, v, case.is_causal, grad_out=do) for k_, f in fns.items()}
    formula = case.batch * case.Tq * case.d * case.dtype.itemsize + case.batch * case.Tq * 4  # O, and L in fp32
    baseline = "ours:triton" if gpu else "ours:pytorch"
    timed = timing_rows("attention", calls, baseline=baseline, opts=opts, shape=str(case), errors=errors)
    fns = {k_: f for k_, f in fns.items() if k_ in {r["who"] + ":" + r["impl"] for r in timed}}
    return timed + memory_rows("attention", fns, (q, k, v, case.is_causal), shape=str(case), formula=formula)
