"""Notebook 02's sections, one call each: plan, run, check the physical bounds, save with provenance, and return a
Result (helpers.section) whose notes are made from the same values as its table.

    r = shapes_section(SCALE, device, profile)          # §1: every norm on (rows, H), one interleaved loop per shape
    r                                                   # notes, table, where it was saved
    assert r.values["forward_over_both_low"] <= 1       # forward never measurably slower than forward+backward

Later sections read earlier ones' timings (bandwidth_section(shapes, ...), compile_section(models, ...)): one
measurement per implementation and shape, shown in several ways.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch

from helpers.budget import Budget
from helpers.env import card_bytes, device_type, machine_facts, resolve_profile, triton_mode
from helpers.experiments.gpu_plans_bytes import compile_loop_bytes, keep_fitting
from helpers.experiments.rmsnorm_checks import (
    DERIVED_TOL,
    GRADCHECK,
    LOSS_TOL,
    TOL,
    check_against_spec,
    check_model_norms,
    tiny_model_runs,
)
from helpers.experiments.rmsnorm_compare import (
    check_forward_le_both,
    compare_shapes,
    ratio_lines,
    ratio_rows,
)
from helpers.experiments.rmsnorm_model import (
    compare_model_norms,
    model_lines,
    plan_model_norms,
)
from helpers.model import get_config, sizes_for
from helpers.results import save_results
from helpers.rmsnorm import (
    RMSNormPyTorchFunction,
    RMSNormTritonFunction,
    rmsnorm_backward_g,
    rmsnorm_backward_x,
    rmsnorm_reference,
)
from helpers.section import Result

PYTORCH_NORMS = ["layernorm", "torch", "F.rms_norm"]  # section 1's table: PyTorch's norms and the spec
TRITON_LEFT_OUT = (  # how the writeup's front page recognises this cut (helpers.writeup.index.LEFT_OUT_LINES)
    "rmsnorm_triton is left out of the model timings here: Triton runs in its interpreter on this machine "
    "(its correctness inside the model is checked in section 3 and in tests/test_rmsnorm.py)"
)


@dataclass(frozen=True)
class Setup:
    """Where notebook 02 runs: the profile (it picks the sizes: `scale`, a PROFILES entry, and the model `sizes`), the
    machine's device (env.device_type: CUDA when present, under the cpu profile too, so compiled Triton gets CUDA
    tensors) and the time budget."""

    profile: str
    device: str
    scale: dict = field(repr=False)
    sizes: list = field(repr=False)
    budget: Budget = field(repr=False)

    @classmethod
    def resolve(cls, profile: str, budget, profiles: dict) -> Setup:
        """The parameters cell's PROFILE and BUDGET made concrete (on cpu the budget calibrates this machine, about a
        second); `profiles`: rmsnorm.PROFILES."""
        profile = resolve_profile(profile)
        scale = fit_card(profiles[profile], card_bytes())  # what this GPU holds (None without CUDA: all)
        return cls(profile, device_type(), scale, sizes_for(profile), Budget.resolve(budget, "02", profile))


def fit_card(scale: dict, gpu_bytes: float | None) -> dict:
    """`scale` (a PROFILES entry) on a card of gpu_bytes: §5's compiled models whose loop the card cannot hold
    (gpu_plans_bytes.compile_loop_bytes: AdamW's state beside every pass) left out, the smallest always, each named in
    scale["left_out"]; `scale` itself where the card holds them all or none is known (gpu_bytes None)."""
    B = scale["batch"]
    need = {m: compile_loop_bytes(m, B, get_config(m).context_length) for m in scale["compile_model_sizes"]}
    kept, notes = keep_fitting(
        need,
        gpu_bytes,
        lambda m: f"{size_name(m)}'s compiled step (fwd+bwd+AdamW, batch {B})",
        instead="not compiled here",
    )
    return scale if len(kept) == len(need) else {**scale, "compile_model_sizes": kept, "left_out": notes}


@dataclass(repr=False)  # Result's own repr: notes and table, not every field
class Timed(Result):
    """A Result that keeps its timed rows and the paired Comparisons of its interleaved loops, which later sections
    show again (section 4 reads section 1's, section 5 saves section 2's beside its own)."""

    rows: list = field(default_factory=list)
    comps: dict = field(default_factory=dict)


@dataclass(repr=False)
class Bandwidth(Result):
    """Section 4's Result, with every saved row (`bench`) and the rows at the profile's row count (`big`)."""

    bench: pd.DataFrame | None = None
    big: pd.DataFrame | None = None


def where(profile: str) -> str:
    """The caption's tail: this machine, the profile and how Triton runs."""
    return f"{machine_facts()['device']} · profile {profile} · Triton {triton_mode()}"


def size_name(size) -> str:
    """A model size as the tables and saved rows name it: a MODEL_SIZES name, or a ModelConfig's name (tests)."""
    return getattr(size, "name", size)


def _named(rows: list[dict]) -> list[dict]:
    """Rows whose "size" is a name (compare_model_norms and compare_compiled keep what they were given)."""
    return [{**r, "size": size_name(r["size"])} for r in rows]


def _tidy(line: str) -> str:
    """One line of the sentence helpers' aligned text, as a note: the alignment's runs of spaces collapsed."""
    return " ".join(line.split())


def _ms(rows) -> pd.DataFrame:
    """Rows as a frame with a median_ms column."""
    df = pd.DataFrame(rows)
    df["median_ms"] = df["median_s"] * 1e3
    return df


def triton_timed(scale: dict) -> bool:
    """Whether Triton is timed on every shape: where it is compiled (a GPU, whatever the profile), or where the
    profile names no interpreter shape; in the interpreter only scale["triton_shape"] runs, to show it runs."""
    return scale["triton_shape"] is None or triton_mode() == "compiled"


def kernels_at(H: int, scale: dict) -> list[str]:
    """Section 4's kernels timed at width H: torchfn; compiled where this profile compiles H; Triton where timed."""
    compiled = ["compiled"] if H in scale["compile_hidden"] else []
    return ["torchfn", *compiled, *(["triton"] if triton_timed(scale) else [])]


def model_norms(profile: str) -> list[str]:
    """The norms swapped into the model: Triton's only where it is compiled (the interpreter would take hours)."""
    compiled = profile == "gpu" or triton_mode() == "compiled"
    return ["layernorm", "rmsnorm", "rmsnorm_torchfn"] + (["rmsnorm_triton"] if compiled else [])


# ---- §1: the norms on (rows, H), and inside the model --------------------------------------------------------


def shapes_section(scale: dict, device, profile: str, yours: dict | None = None) -> Timed:
    """Every implementation (section 4's kernels and `yours` too), forward and forward+backward, in ONE interleaved
    loop per shape; forward <= forward+backward checked; every pair's paired ratio saved (rmsnorm_ratios, which the
    answers page reads). The table: PyTorch's norms and the spec, median ms."""
    yours = dict(yours or {})
    rows, comps = compare_shapes(
        lambda H: [*PYTORCH_NORMS, *kernels_at(H, scale), *yours],
        rows=scale["rows"],
        hidden=scale["hidden"],
        dtypes=scale["dtypes"],
        device=device,
        warmup=scale["warmup"],
        steps=scale["steps"],
        fns=yours,
    )
    saved = save_results(ratio_rows(comps, ("dtype", "H")), "rmsnorm_ratios", profile=profile)  # then the bound
    low = check_forward_le_both(comps)
    df = _ms(rows)
    table = df.pivot_table(index=["dtype", "pass", "H"], columns="impl", values="median_ms")[PYTORCH_NORMS]
    notes = [
        f"{scale['rows']} rows, median ms per call, every implementation in one interleaved loop per shape "
        f"· {where(profile)}",
        f"forward <= forward+backward for every implementation and shape (checked on the paired ratios; the "
        f"largest lower bound of forward / forward+backward is {low:.2f})",
        *(f"against LayerNorm, {_tidy(line)}" for line in ratio_lines(comps, ["torch", "F.rms_norm"]).splitlines()),
    ]
    if yours:  # against our autograd Function, paired per round in the same loops
        notes += [f"yours, {_tidy(line)}" for line in ratio_lines(comps, list(yours), baseline="torchfn").splitlines()]
    return Timed(
        table.round(3), notes=notes, saved=saved, values={"forward_over_both_low": low}, rows=rows, comps=comps
    )


def model_section(budget, sizes, scale: dict, device, profile: str) -> Timed:
    """One model per size (the smallest always, the others within the budget), its norms swapped in turn: every norm
    and pass in one interleaved loop; forward <= forward+backward checked. Saved in section 5 (rmsnorm_models)."""
    norms = model_norms(profile)
    B, W, S = scale["batch"], scale["warmup"], scale["steps"]
    plan = plan_model_norms(
        budget, sizes, norms, B, W, S, run=lambda size: compare_model_norms(size, norms, device, B, W, S)
    )
    rows = _named([row for rows_, _ in plan.results for row in rows_])
    comps = {size_name(size): comp for size, (_, comp) in zip(plan.kept, plan.results, strict=True)}
    low = check_forward_le_both(comps)
    table = _ms(rows).pivot_table(index=["size", "pass"], columns="norm", values="median_ms", sort=False)[norms]
    notes = [
        f"batch {B} × context {get_config(sizes[0]).context_length}, median ms · {where(profile)}",
        *(_tidy(line) for line in model_lines(comps, norms).splitlines()),
        *([plan.note] if plan.note else []),
        *([TRITON_LEFT_OUT] if "rmsnorm_triton" not in norms else []),
    ]
    return Timed(table.round(2), notes=notes, values={"forward_over_both_low": low}, rows=rows, comps=comps)


# ---- §2 and §3: the gradients and the kernels against their spec ----------------------------------------------


def gradients_section(profile: str) -> Result:
    """The hand-derived gradients against autograd through the forward ops (float64, DERIVED_TOL), and gradcheck of
    RMSNormPyTorchFunction (whose backward they are) against finite differences; saved (rmsnorm_grad_checks)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, 33, generator=gen, dtype=torch.float64).requires_grad_()  # (B, T, H), H not a power of 2
    g = (1 + 0.5 * torch.randn(33, generator=gen, dtype=torch.float64)).requires_grad_()  # (H,)
    dy = torch.randn(4, 7, 33, generator=gen, dtype=torch.float64)  # upstream gradient
    dx_auto, dg_auto = torch.autograd.grad(rmsnorm_reference(x, g), (x, g), dy)
    dx, dg = rmsnorm_backward_x(dy, x, g), rmsnorm_backward_g(dy, x, g)
    torch.testing.assert_close(dx, dx_auto, **DERIVED_TOL)
    torch.testing.assert_close(dg, dg_auto, **DERIVED_TOL)
    err = max((dx - dx_auto).abs().max().item(), (dg - dg_auto).abs().max().item())
    ok = torch.autograd.gradcheck(RMSNormPyTorchFunction.apply, (x[:2, :3], g), **GRADCHECK)
    rows = [
        {"check": "derived gradients vs autograd (float64)", "max_abs_error": err, "passed": True},
        {"check": "gradcheck of RMSNormPyTorchFunction", "max_abs_error": None, "passed": ok},
    ]
    saved = save_results(rows, "rmsnorm_grad_checks", profile=profile)
    note = (
        f"hand-derived gradients vs autograd: largest difference {err:.1e} (float64, within {DERIVED_TOL}); "
        f"gradcheck of RMSNormPyTorchFunction {'passed' if ok else 'FAILED'} ({GRADCHECK})"
    )
    values = {"max_abs_error": err, "gradcheck": ok}
    return Result(pd.DataFrame(rows).set_index("check"), notes=[note], saved=saved, values=values)


def spec_section(device, shape=(2, 3, 37)) -> Result:
    """RMSNormTritonFunction against the spec (y, dx, dg) in every dtype of TOL, and the Triton norm inside the TINY
    model against the plain rmsnorm model (loss within LOSS_TOL, every gradient within TOL[float32])."""
    rows = []
    for dtype, tol in TOL.items():  # asserts within tol
        err = check_against_spec(RMSNormTritonFunction.apply, shape, dtype, device)
        rows.append({"dtype": str(dtype).replace("torch.", ""), **tol, "largest error (y, dx, dg)": err})
    runs = tiny_model_runs(["rmsnorm", "rmsnorm_triton"], device)  # norm -> (loss, gradients)
    check_model_norms(runs, ref="rmsnorm")
    loss, ref = float(runs["rmsnorm_triton"][0]), float(runs["rmsnorm"][0])
    rel = abs(loss - ref) / abs(ref)
    notes = [
        f"RMSNormTritonFunction = spec on {shape} in {', '.join(r['dtype'] for r in rows)}: the forward and both "
        f"gradients, each within its dtype's tolerance (Triton {triton_mode()})",
        f"tiny model: loss {loss:.6f} with Triton norms vs {ref:.6f} (relative difference {rel:.1e}, within "
        f"{LOSS_TOL}); every gradient within {TOL[torch.float32]}",
    ]
    values = {"largest_error": {r["dtype"]: r["largest error (y, dx, dg)"] for r in rows}, "loss_rel_diff": rel}
    return Result(pd.DataFrame(rows).set_index("dtype"), notes=notes, values=values)
