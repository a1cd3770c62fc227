"""Notebook 02's questions (norms, the Triton RMSNorm, torch.compile: 2024's 2.1.5-2.3.1) and their answers."""

from __future__ import annotations

import pandas as pd

from helpers.course.answers.core import (
    Answer,
    NotMeasured,
    Question,
    Saved,
    answers,
    coverage,
    ran_against,
    ref,
    register,
    series_text,
)

Q = Question
QUESTIONS = [
    Q(
        "2.1.5(a)",
        "Is PyTorch's LayerNorm faster than RMSNorm written in PyTorch ops, per width?",
        notebook="02",
        section="§1 LayerNorm vs RMSNorm",
        reads=("rmsnorm_ratios",),
        gpu="Direction usually carries over (one fused kernel vs several passes); the ratio depends on the bandwidth.",
        references=ref("RMSNorm in PyTorch ops takes 2.6x-3.4x LayerNorm's time, H 1024-8192 (H100)"),
    ),
    Q(
        "2.1.5(b)",
        "What does swapping RMSNorm for LayerNorm do to the whole model's time?",
        notebook="02",
        section="§1 The norm swapped inside the model",
        reads=("rmsnorm_model_ratios",),
        gpu="Does not shrink there: the H100 reference above has RMSNorm in PyTorch ops 8% slower than LayerNorm for "
        "xl forward+backward (180 against 166 ms), against the few per cent measured on a CPU: on a GPU the matmuls "
        "are fast, so the norms' extra memory passes weigh more.",
        references=ref("xl forward+backward 166 ms with LayerNorm vs 180 ms with RMSNorm (H100)"),
    ),
    Q(
        "2.2.1(a)",
        "Is the Triton RMSNorm forward faster than LayerNorm and the PyTorch-ops RMSNorm?",
        notebook="02",
        section="§4 Speed and bandwidth",
        reads=("rmsnorm_ratios",),
        gpu="Only there: compiled Triton needs CUDA (`make writeup PROFILE=gpu`, or `python -m helpers bench rmsnorm "
        "--impls triton layernorm torch`).",
        references=ref("H=8192 forward: Triton 1.79 ms, LayerNorm 1.67 ms, RMSNorm 4.29 ms (H100)"),
    ),
    Q(
        "2.2.1(b)",
        "Inside the model, is the forward faster with the Triton norm?",
        notebook="02",
        section="§1 The norm swapped inside the model",
        reads=("rmsnorm_model_ratios",),
        gpu="Only there (`make writeup PROFILE=gpu`).",
        references=ref("2.7B forward: Triton 55.8 ms, LayerNorm 56.0 ms, RMSNorm 59.1 ms (H100)"),
    ),
    Q(
        "2.2.2(a)",
        "What is the gradient of the loss with respect to the gain g?",
        notebook="02",
        section="§2 The gradients, derived",
        reads=("rmsnorm_grad_checks",),
        gpu="A derivation: the same on every machine.",
    ),
    Q(
        "2.2.2(b)",
        "Implement the backward (a PyTorch autograd Function) and check it.",
        notebook="02",
        section="§2 and §3",
        reads=("rmsnorm_grad_checks",),
        gpu="The PyTorch Function runs anywhere; the Triton one is checked here in the interpreter and compiled for "
        "sm_80/sm_90a by `python -m helpers kernels`.",
    ),
    Q(
        "2.2.3(a)",
        "What is the gradient of the loss with respect to the input x?",
        notebook="02",
        section="§2 The gradients, derived",
        reads=("rmsnorm_grad_checks",),
        gpu="A derivation: the same on every machine.",
    ),
    Q(
        "2.2.4(a)",
        "Forward+backward: how do LayerNorm, the PyTorch RMSNorm and the fused kernel compare?",
        notebook="02",
        section="§4 Speed and bandwidth",
        reads=("rmsnorm_ratios",),
        gpu="The Triton kernel is timed there only (`make writeup PROFILE=gpu`).",
        references=ref(
            "H=8192 forward+backward: LayerNorm 2.84 ms, RMSNorm 6.43 ms, Triton 5.07 ms (H100, its §2.3.1(b))"
        ),
    ),
    Q(
        "2.2.4(b)",
        "Inside the model, forward and backward with each norm?",
        notebook="02",
        section="§1 The norm swapped inside the model",
        reads=("rmsnorm_model_ratios",),
        gpu="The Triton norm inside the model is timed there only (`make writeup PROFILE=gpu`).",
        references=ref("2.7B backward: Triton 145 ms, LayerNorm 145 ms, RMSNorm 155 ms (H100)"),
    ),
    Q(
        "2.3.1(a)",
        "Is torch.compile of the PyTorch RMSNorm faster than the other norms (forward)?",
        notebook="02",
        section="§4 Speed and bandwidth",
        reads=("rmsnorm_ratios",),
        gpu="Does not carry over: torch.compile emits C++ loops for a CPU and Triton kernels for a GPU.",
        references=ref("H=8192 forward: compiled 1.93 ms, Triton 1.44 ms, RMSNorm 4.29 ms (H100)"),
    ),
    Q(
        "2.3.1(b)",
        "The same with the backward pass?",
        notebook="02",
        section="§4 Speed and bandwidth",
        reads=("rmsnorm_ratios",),
        gpu="As (a): a different code generator.",
        references=ref("H=8192 forward+backward: compiled 4.44 ms, Triton 5.07 ms (H100)"),
    ),
    Q(
        "2.3.1(c)",
        "Is the whole model faster compiled than eager, forward and forward+backward?",
        notebook="02",
        section="§5 torch.compile of the whole model",
        reads=("rmsnorm_model_ratios",),
        gpu="Fusion there saves memory traffic and kernel launches; the gain is usually larger.",
        references=ref("2.7B forward+backward 213 ms eager vs 155 ms compiled (H100)"),
    ),
]
register(QUESTIONS)

# ---- 2.1.5-2.3 norms, kernels, torch.compile (notebook 02) -----------------------------------------------------------

NORM_NAMES = {
    "layernorm": "LayerNorm",
    "torch": "RMSNorm (PyTorch ops)",
    "rmsnorm": "RMSNorm (PyTorch ops)",
    "F.rms_norm": "F.rms_norm",
    "torchfn": "RMSNorm (autograd Function)",
    "rmsnorm_torchfn": "RMSNorm (autograd Function)",
    "triton": "Triton RMSNorm",
    "rmsnorm_triton": "Triton RMSNorm",
    "compiled": "compiled RMSNorm",
    "True": "compiled model",
    "False": "eager model",
}
HANDOUT_WIDTHS = (1024, 2048, 4096, 8192)  # 2.1.5 / 2.2.1 / 2.3.1: 50,000 rows of these widths
PASS_NAMES = {"fwd": "forward", "fwd+bwd": "forward+backward"}


def _norm_rows(saved: Saved, pass_: str) -> pd.DataFrame:
    """rmsnorm_ratios for one pass, in the first dtype saved (float32 on both profiles)."""
    r = saved.frame("rmsnorm_ratios")
    r = r[(r["pass"] == pass_) & (r["dtype"] == r["dtype"].iloc[0])]
    ran_against("widths H", sorted(int(h) for h in r["H"]), HANDOUT_WIDTHS)
    return r.sort_values("H")


def _norm_series(rows: pd.DataFrame, pairs, over: str, what: str) -> str:
    """series_text for each (a, b) of `pairs`, with the norms' display names."""
    return "; ".join(series_text(rows, a, b, over, NORM_NAMES, what) for a, b in pairs) + "."


def _by_pass(rows_of, pairs, over: str) -> str:
    """ "Forward: ... Forward+backward: ...": _norm_series of rows_of(pass) for each pass."""
    return " ".join(
        f"{PASS_NAMES[p].capitalize()}: " + _norm_series(rows_of(p), pairs, over, f"{PASS_NAMES[p]} time")
        for p in PASS_NAMES
    )


def _triton_absent(what: str) -> str:
    """Why the Triton kernel has no timing on a machine without a GPU, and what checks it here."""
    return (
        f"The Triton kernel was not timed {what} on this machine: without a GPU it runs in Triton's interpreter, "
        "correct (checked against its PyTorch spec in notebook 02 §3) but far too slow to time; "
        "`python -m helpers kernels` compiles it for sm_80/sm_90a here to check registers and spills. To time it, "
        "run `make writeup PROFILE=gpu` or `python -m helpers bench rmsnorm --impls triton layernorm torch` on a "
        "GPU machine."
    )


@answers("2.1.5(a)")
def layernorm_vs_rmsnorm(q, saved):
    return _by_pass(lambda p: _norm_rows(saved, p), [("torch", "layernorm")], "H")


def _model_rows(saved: Saved, loop: str, pass_: str) -> pd.DataFrame:
    """rmsnorm_model_ratios of one loop ("norms": the norms swapped in the model, "compile": eager vs compiled)."""
    r = saved.frame("rmsnorm_model_ratios")
    return r[(r["loop"] == loop) & (r["pass"] == pass_)]


def _sizes_note(saved: Saved, loop: str) -> str:
    """The coverage clause for the sizes a model loop of rmsnorm_model_ratios ran."""
    r = saved.frame("rmsnorm_model_ratios")
    limit = "the time budget" if loop != "compile" else COMPILE_LIMIT
    return coverage(list(r[r["loop"] == loop]["size"]), saved.profile, limit=limit)


COMPILE_LIMIT = (  # what cuts the compiled loop's sizes: a fixed list, not the time budget
    "notebook 02's list of sizes to compile (rmsnorm PROFILES' compile_model_sizes: each takes tens of seconds)"
)


@answers("2.1.5(b)")
def model_norm_swap(q, saved):
    text = _by_pass(lambda p: _model_rows(saved, "norms", p), [("layernorm", "rmsnorm")], "size")
    return text.rstrip(".") + _sizes_note(saved, "norms") + "."


def _kernel_answer(rows: pd.DataFrame, impl: str, others, over: str, what: str, absent: str) -> str | Answer:
    """impl against each of `others` present in the rows, or why impl was not timed here."""
    if impl not in set(rows["a"]):
        return Answer(absent, status="needs a GPU", missing="the Triton kernel timed on a GPU")
    return _norm_series(rows, [(impl, o) for o in others if o in set(rows["b"])], over, what)


@answers("2.2.1(a)")
def triton_forward(q, saved):
    return _kernel_answer(
        _norm_rows(saved, "fwd"),
        "triton",
        ["layernorm", "torch"],
        "H",
        "forward time",
        _triton_absent("on (rows, H) tensors"),
    )


@answers("2.2.1(b)")
def triton_model_forward(q, saved):
    return _kernel_answer(
        _model_rows(saved, "norms", "fwd"),
        "rmsnorm_triton",
        ["layernorm", "rmsnorm"],
        "size",
        "forward time",
        _triton_absent("inside the model"),
    )


def _grad_checks(saved: Saved) -> pd.Series:
    """The largest error of each gradient check notebook 02 §2 ran, when all of them passed."""
    c = saved.frame("rmsnorm_grad_checks").set_index("check")
    if not c["passed"].all():
        raise NotMeasured("a gradient check failed in the saved run")
    return c["max_abs_error"]


@answers("2.2.2(a)")
def grad_g(q, saved):
    err = _grad_checks(saved)
    return (
        "With r = (mean(x²) + ε)^(-1/2) per row and x̂ = r·x, y = g ⊙ x̂ depends on g_j only through y_j, so "
        "∇_g L = Σ over rows of ∇_y L ⊙ x̂ (the sum because every row shares g). Derived step by step in notebook "
        f"02 §2 and checked there in float64 against autograd (largest difference here "
        f"{err.iloc[0]:.1e}) and by gradcheck."
    )


@answers("2.2.2(b)")
def grad_impl(q, saved):
    _grad_checks(saved)
    return (
        "`helpers.rmsnorm.RMSNormPyTorchFunction` saves x, g and r in forward; its backward calls "
        "`rmsnorm_backward_x` and `rmsnorm_backward_g`. In this run both passed the float64 comparison with "
        "autograd and `torch.autograd.gradcheck` (notebook 02 §2); the Triton Function is checked against the same "
        "spec in fp32, fp16 and bf16 in §3."
    )


@answers("2.2.3(a)")
def grad_x(q, saved):
    err = _grad_checks(saved)
    return (
        "∇_x L = r·(∇_y L ⊙ g − x̂ · mean(∇_y L ⊙ g ⊙ x̂)) per row: the first term is the direct path through "
        "x, the second comes from r depending on every x_k (∂r/∂x_j = −r³x_j/H). Derived in notebook 02 §2 with ε "
        f"inside the square root as in the code, and checked in float64 against autograd (largest difference here "
        f"{err.iloc[0]:.1e}) and by gradcheck."
    )


@answers("2.2.4(a)")
def norms_fwd_bwd(q, saved):
    rows = _norm_rows(saved, "fwd+bwd")
    if "triton" in set(rows["a"]):
        return _norm_series(rows, [("triton", "layernorm"), ("triton", "torch")], "H", "forward+backward time")
    return Answer(
        _triton_absent("on (rows, H) tensors")
        + " What this machine does answer: "
        + _norm_series(rows, [("torchfn", "torch"), ("torch", "layernorm")], "H", "forward+backward time"),
        status="partial",
        missing="the Triton kernel timed on a GPU",
    )


@answers("2.2.4(b)")
def model_norms_fwd_bwd(q, saved):
    rows = _model_rows(saved, "norms", "fwd+bwd")
    impl = "rmsnorm_triton" if "rmsnorm_triton" in set(rows["a"]) else "rmsnorm_torchfn"
    text = _norm_series(rows, [(impl, "rmsnorm"), (impl, "layernorm")], "size", "forward+backward time")
    return (
        text
        if impl == "rmsnorm_triton"
        else Answer(
            _triton_absent("inside the model") + " Measured here: " + text,
            status="partial",
            missing="the Triton kernel timed on a GPU",
        )
    )


def _compiled_answer(saved: Saved, pass_: str) -> str:
    """torch.compile of the PyTorch RMSNorm against every other norm timed in the same loops."""
    rows = _norm_rows(saved, pass_)
    others = [o for o in ("triton", "torch", "layernorm") if o in set(rows["b"][rows["a"] == "compiled"])]
    return _norm_series(rows, [("compiled", o) for o in others], "H", f"{PASS_NAMES[pass_]} time")


@answers("2.3.1(a)")
def compiled_forward(q, saved):
    return _compiled_answer(saved, "fwd")


@answers("2.3.1(b)")
def compiled_fwd_bwd(q, saved):
    return _compiled_answer(saved, "fwd+bwd")


@answers("2.3.1(c)")
def compiled_model(q, saved):
    return (
        _by_pass(lambda p: _model_rows(saved, "compile", p), [("True", "False")], "size").rstrip(".")
        + _sizes_note(saved, "compile")
        + "."
    )
