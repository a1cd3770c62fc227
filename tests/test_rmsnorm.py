"""RMSNorm (notebook 02): hand-derived gradients, the PyTorch Function, the Triton kernels (interpreter on CPU), the
layer."""

import pandas as pd
import pytest
import torch

import helpers  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before triton is imported)
from helpers import env
from helpers import formulas as F
from helpers import rmsnorm as R
from helpers.experiments import rmsnorm as XR
from helpers.model import NORM_LAYERS, build_model
from helpers.rmsnorm import (
    RMSNormLayer,
    RMSNormPyTorchFunction,
    RMSNormTritonFunction,
    rmsnorm_backward_g,
    rmsnorm_backward_x,
    rmsnorm_reference,
)

needs_triton = pytest.mark.skipif(R.triton is None, reason="triton is not installed")
DEVICE = env.device_type()  # the machine's: compiled Triton refuses host tensors (CPU: Triton's interpreter)
TOL = XR.TOL  # the notebook's tolerances: one table, in helpers.experiments.rmsnorm
SHAPES = [(10, 20, 50), (3, 37), (2, 3, 100), (4, 256), (1, 1)]


def _inputs(shape, dtype=torch.float32, seed=0):
    """x (shape), g (H,), dy (shape) with requires_grad on x and g, on DEVICE."""
    return XR.spec_inputs(shape, dtype, DEVICE, seed)


_fwd_bwd = XR.fwd_bwd


def test_reference_matches_model_rmsnorm():
    layer = NORM_LAYERS["rmsnorm"](50)
    with torch.no_grad():
        layer.weight.mul_(torch.linspace(0.5, 2, 50))
    x = torch.randn(4, 7, 50)
    torch.testing.assert_close(rmsnorm_reference(x, layer.weight), layer(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_hand_derived_gradients_match_autograd(shape):
    x, g, dy = _inputs(shape, torch.float64)
    _, dx, dg = _fwd_bwd(rmsnorm_reference, x, g, dy)
    torch.testing.assert_close(rmsnorm_backward_x(dy, x, g), dx, **XR.DERIVED_TOL)
    torch.testing.assert_close(rmsnorm_backward_g(dy, x, g), dg, **XR.DERIVED_TOL)
    assert rmsnorm_backward_g(dy, x, g).shape == (shape[-1],)


def test_pytorch_function_gradcheck_float64():
    x, g, _ = _inputs((3, 5, 16), torch.float64)
    assert torch.autograd.gradcheck(RMSNormPyTorchFunction.apply, (x, g), **XR.GRADCHECK)


@pytest.mark.parametrize("shape", SHAPES)
def test_pytorch_function_matches_reference(shape):
    x, g, dy = _inputs(shape)
    for got, want in zip(
        _fwd_bwd(RMSNormPyTorchFunction.apply, x, g, dy), _fwd_bwd(rmsnorm_reference, x, g, dy), strict=True
    ):
        torch.testing.assert_close(got, want, **TOL[torch.float32])


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_matches_spec(shape, dtype):
    XR.check_against_spec(RMSNormTritonFunction.apply, shape, dtype, DEVICE)  # the checker notebook 02 calls


@needs_triton
def test_triton_saves_reciprocal_rms():
    x, g, _ = _inputs((6, 37))
    y = RMSNormTritonFunction.apply(x, g)
    saved = y.grad_fn.saved_tensors
    rrms = torch.rsqrt(x.detach().pow(2).mean(-1) + R.EPS)  # (6,)
    torch.testing.assert_close(saved[2], rrms, **XR.RRMS_TOL)


@needs_triton
def test_triton_dg_two_stage_reduction_many_programs():
    """More rows than backward programs, rows not divisible by the program count: every row lands in dg once."""
    x, g, dy = _inputs((37, 100))
    x2 = x.detach()
    y, rrms = R.rmsnorm_triton_forward(x2, g.detach())
    dx, dg = R.rmsnorm_triton_backward(dy, x2, g.detach(), rrms)
    assert R._bwd_programs(37, x2.device) > 1
    torch.testing.assert_close(dg, rmsnorm_backward_g(dy, x2, g), **TOL[torch.float32])
    torch.testing.assert_close(dx, rmsnorm_backward_x(dy, x2, g), **TOL[torch.float32])


@needs_triton
@pytest.mark.parametrize("fn", [RMSNormTritonFunction.apply, RMSNormPyTorchFunction.apply], ids=["triton", "torchfn"])
def test_non_contiguous_input(fn):
    base = torch.randn(40, 6).to(DEVICE)
    x = base.t().requires_grad_()  # (6, 40), strides (1, 6)
    assert not x.is_contiguous()
    g = torch.linspace(0.5, 1.5, 40).to(DEVICE).requires_grad_()
    dy = torch.randn(40, 6).to(DEVICE).t()  # non-contiguous upstream gradient too
    for a, b in zip(_fwd_bwd(fn, x, g, dy), _fwd_bwd(rmsnorm_reference, x, g, dy), strict=True):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


@needs_triton
def test_triton_empty_input():
    x, g, dy = _inputs((0, 16))
    y, dx, dg = _fwd_bwd(RMSNormTritonFunction.apply, x, g, dy)
    assert y.shape == (0, 16) and dx.shape == (0, 16)
    torch.testing.assert_close(dg, torch.zeros_like(dg))


@pytest.mark.parametrize("fn", [RMSNormTritonFunction.apply, RMSNormPyTorchFunction.apply], ids=["triton", "torchfn"])
@pytest.mark.parametrize(
    "x_shape,g_shape,match", [((4, 8), (7,), "shape"), ((4, 8), (1, 8), "shape"), ((4, 8), (), "shape")]
)
def test_wrong_g_shape_is_a_value_error(fn, x_shape, g_shape, match):
    with pytest.raises(ValueError, match=match):
        fn(torch.randn(*x_shape), torch.ones(g_shape))


@pytest.mark.parametrize("fn", [RMSNormTritonFunction.apply, RMSNormPyTorchFunction.apply], ids=["triton", "torchfn"])
def test_mismatched_devices_is_a_value_error(fn):
    with pytest.raises(ValueError, match="same device"):
        fn(torch.randn(2, 8), torch.ones(8, device="meta"))


@needs_triton
def test_bad_dtype_and_impl_are_value_errors():
    """(Any width is fine since the kernels loop over column blocks: wide rows are tested in tests/test_kernels.py.)"""
    with pytest.raises(ValueError, match="cast"):
        RMSNormTritonFunction.apply(torch.randn(2, 8, dtype=torch.float64), torch.ones(8, dtype=torch.float64))
    with pytest.raises(ValueError, match="impl"):
        RMSNormLayer(8, impl="cuda")


@needs_triton
@pytest.mark.parametrize("impl", ["torch", "torchfn", "triton"])
def test_layer_impls_agree(impl):
    x, _, dy = _inputs((2, 3, 37))
    layer = RMSNormLayer(37, impl=impl).to(DEVICE)
    with torch.no_grad():
        layer.weight.copy_(torch.linspace(0.5, 2, 37))
    y = layer(x)
    y.backward(dy)
    want_y, want_dx, want_dg = _fwd_bwd(
        rmsnorm_reference, x.detach().requires_grad_(), layer.weight.detach().requires_grad_(), dy
    )
    torch.testing.assert_close(y, want_y, **TOL[torch.float32])
    torch.testing.assert_close(x.grad, want_dx, **TOL[torch.float32])
    torch.testing.assert_close(layer.weight.grad, want_dg, **TOL[torch.float32])


@needs_triton
def test_triton_norm_in_model_matches_rmsnorm():
    assert {"rmsnorm_triton", "rmsnorm_torchfn"} <= set(NORM_LAYERS)
    runs = XR.tiny_model_runs(["rmsnorm", "rmsnorm_triton", "rmsnorm_torchfn"], DEVICE)  # as notebook 02
    XR.check_model_norms(runs, ref="rmsnorm")  # loss within LOSS_TOL, every gradient within TOL[float32]
    for norm in runs:
        model = build_model(XR.TINY, norm=norm, device="meta")
        assert sum(isinstance(m, RMSNormLayer) for m in model.modules()) == (0 if norm == "rmsnorm" else 5)


def test_norm_bytes_counts_reads_and_writes():
    assert F.norm_bytes(10, 4, torch.float32, backward=False) == (2 * 40 + 4) * 4
    assert F.norm_bytes(10, 4, torch.bfloat16, backward=True) == ((2 * 40 + 4) + (3 * 40 + 8)) * 2


def test_bench_norm_row():
    row = XR.bench_norm("torch", 64, 32, warmup=1, steps=2, backward=True)
    assert row["pass"] == "fwd+bwd" and row["impl"] == "torch" and row["steps"] == 2
    assert row["GBps"] > 0 and row["copy_GBps"] > 0
    assert row["frac_of_copy"] == pytest.approx(row["GBps"] / row["copy_GBps"])


def test_bench_main_prints_a_table(capsys):
    assert (
        XR.bench_main(["--rows", "32", "--hidden", "16", "--impls", "torch", "triton", "--warmup", "0", "--steps", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert "frac_of_copy" in out and "triton" in out and "fwd+bwd" in out


def test_copy_bandwidth_is_a_bound_every_norm_stays_under():
    rows = [
        XR.bench_norm(name, 2048, 1024, warmup=1, steps=5, backward=b)
        for name in ("torch", "layernorm")
        for b in (False, True)
    ]
    XR.check_fraction_of_copy(rows)
    with pytest.raises(AssertionError, match="copy bandwidth"):
        XR.check_fraction_of_copy([{**rows[0], "frac_of_copy": 1.2}])


def test_one_interleaved_loop_per_shape_checks_its_bounds():
    rows, comps = XR.compare_shapes(
        lambda H: ["layernorm", "torch", "torchfn"],
        rows=64,
        hidden=[32],
        dtypes=[torch.float32],
        device="cpu",
        warmup=1,
        steps=5,
    )
    assert {(r["impl"], r["pass"]) for r in rows} == {
        (n, p) for n in ("layernorm", "torch", "torchfn") for p in ("fwd", "fwd+bwd")
    }
    assert all(r["p25_s"] <= r["median_s"] for r in rows)
    comp = comps[("float32", 32)]
    assert all(len(s) == 5 for s in comp.samples.values())  # every candidate once per round
    XR.check_forward_le_both(comps)
    assert "H=32" in XR.ratio_lines(comps, ["torch"]) and XR.fastest_lines(rows, comps).count("\n") == 1
    fake = type(comp)({"a|fwd": [1.0] * 6, "a|fwd+bwd": [0.5] * 6}, "a|fwd", "cpu")
    with pytest.raises(AssertionError, match="forward takes"):
        XR.check_forward_le_both({("float32", 1): fake})
    few = type(comp)({"a|fwd": [1.0] * 5, "a|fwd+bwd": [0.5] * 5}, "a|fwd", "cpu")
    XR.check_forward_le_both({("float32", 1): few})  # fewer than timing.MIN_PAIRS pairs cannot tell
    noisy = type(comp)(
        {"a|fwd": [1.1, 0.4, 1.2, 0.5, 1.3, 1.05], "a|fwd+bwd": [0.9, 1.0, 1.0, 1.0, 1.0, 1.0]}, "a|fwd", "cpu"
    )  # median ratio above 1, interval across it: inside the noise, not a violation
    XR.check_forward_le_both({("float32", 1): noisy})


def test_model_norms_swapped_in_one_model_and_one_loop():
    rows, comp = XR.compare_model_norms(XR.TINY, ["layernorm", "rmsnorm"], warmup=1, steps=3)
    assert len(rows) == 4 and set(comp.samples) == {
        "layernorm|fwd",
        "layernorm|fwd+bwd",
        "rmsnorm|fwd",
        "rmsnorm|fwd+bwd",
    }
    text = XR.model_lines({"tiny": comp}, ["layernorm", "rmsnorm"])
    assert text.count("RMSNorm (PyTorch ops)") == 2


# ---- notebook 02's sections: one call each, a Result whose notes come from the values it saved ----

SCALE = dict(  # the cpu profile, shrunk: 64 rows, one width, MIN_PAIRS rounds
    XR.PROFILES["cpu"], rows=64, hidden=[32], warmup=1, steps=6, compile_hidden=[], triton_shape=(4, 16)
)


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    from helpers import results

    monkeypatch.setattr(results, "DATA_DIR", tmp_path)
    return tmp_path


def _saved(path):
    from helpers.results import load_results

    return load_results(path).frame()


def test_shapes_and_bandwidth_sections_save_what_the_answers_page_reads(data_dir):
    shapes = XR.shapes_section(SCALE, DEVICE, "cpu", yours={"yours:torchfn": RMSNormPyTorchFunction.apply})
    assert list(shapes.table.columns) == XR.PYTORCH_NORMS and shapes.saved.name == "rmsnorm_ratios.jsonl"
    ratios = _saved(shapes.saved)
    assert {"a", "b", "pass", "dtype", "H"} <= set(ratios.columns) and "yours:torchfn" in set(ratios["a"])
    low = shapes.values["forward_over_both_low"]
    assert low <= 1 and f"is {low:.2f})" in shapes.notes[1]  # the sentence states the value the cell asserts on
    assert sum(n.startswith("yours, ") for n in shapes.notes) == 2  # yours vs torchfn, per pass
    bw = XR.bandwidth_section(shapes, SCALE, DEVICE, "cpu")
    bench = _saved(bw.saved)
    assert bw.saved.name == "rmsnorm_bench.jsonl" and {"impl", "pass", "median_ms", "frac_of_copy"} <= set(bench)
    assert bw.values["max_fraction_of_copy"] == pytest.approx(bw.big["frac_of_copy"].max())
    tiny = ("triton", 4) in set(zip(bench["impl"], bench["rows"], strict=True))  # the interpreter's tiny shape
    assert tiny != XR.triton_timed(SCALE) and ("triton" in set(bw.big["impl"])) == XR.triton_timed(SCALE)
    assert {"fraction of copy", "median ms"} == set(bw.table.columns.get_level_values(0))
    fast = XR.fastest_section(shapes, bw, SCALE, "cpu")
    assert len(fast.notes) == 3 and "judged on the gpu profile" in fast.notes[-1] and fast.table is None
    shapes.rows[0] = {**shapes.rows[0], "frac_of_copy": 1.2}  # a norm faster than the copy: a wrong byte count
    with pytest.raises(AssertionError, match="copy bandwidth"):
        XR.bandwidth_section(shapes, SCALE, DEVICE, "cpu")


def test_gradients_section_catches_a_wrong_derivation(data_dir, monkeypatch):
    from helpers.experiments import rmsnorm_sections

    r = XR.gradients_section("cpu")
    assert r.values["gradcheck"] and r.values["max_abs_error"] < 1e-12
    assert _saved(r.saved)["check"].tolist() == list(r.table.index)
    assert f"{r.values['max_abs_error']:.1e}" in r.notes[0]

    def no_mean_term(grad_out, x, g, eps=R.EPS):  # forgets that r depends on x: r * dy * g
        return grad_out * g * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    monkeypatch.setattr(rmsnorm_sections, "rmsnorm_backward_x", no_mean_term)
    with pytest.raises(AssertionError):
        XR.gradients_section("cpu")


@needs_triton
def test_spec_section_catches_a_norm_off_its_spec(monkeypatch):
    from helpers.experiments import rmsnorm_sections

    r = XR.spec_section(DEVICE, shape=(3, 37))
    assert list(r.table.index) == ["float32", "float16", "bfloat16"]
    assert r.values["loss_rel_diff"] <= XR.LOSS_TOL["rtol"] and "bfloat16" in r.notes[0]

    class Off:  # a gain 1% too large: outside float32's tolerance
        apply = staticmethod(lambda x, g: rmsnorm_reference(x, g * 1.01))

    monkeypatch.setattr(rmsnorm_sections, "RMSNormTritonFunction", Off)
    with pytest.raises(AssertionError, match="float32"):
        XR.spec_section(DEVICE, shape=(3, 37))


def test_model_and_compile_sections_save_both_loops(data_dir, monkeypatch):
    from helpers.budget import Budget
    from helpers.experiments import rmsnorm_speed

    models = XR.model_section(Budget(None), [XR.TINY], dict(SCALE, steps=3), DEVICE, "cpu")
    assert list(models.table.columns) == XR.model_norms("cpu")
    assert (XR.TRITON_LEFT_OUT in models.notes) == (env.triton_mode() == "interpreter")  # compiled: timed
    assert set(models.comps) == {"tiny"} and {r["size"] for r in models.rows} == {"tiny"}

    def eager_twice(size, device, batch, warmup, steps):  # torch.compile stood in by the eager model (seconds)
        rows, comp = XR.compare_model_norms(size, ["rmsnorm"], device, batch, warmup, steps)
        comp.samples = {f"{c}|{label.split('|')[1]}": s for label, s in comp.samples.items() for c in (False, True)}
        return [{**row, "compiled": c} for row in rows for c in (False, True)], comp

    monkeypatch.setattr(rmsnorm_speed, "compare_compiled", eager_twice)
    card = "x's compiled step needs about 57 GB; this card has 40: not compiled here"  # as fit_card says it
    scale = dict(SCALE, steps=3, compile_model_sizes=[XR.TINY], left_out=[card])
    r = XR.compile_section(models, scale, [XR.TINY, "x"], DEVICE, "cpu")
    assert list(r.table.columns) == ["eager", "compiled"] and r.notes[0].startswith("compiled here: tiny of")
    assert r.notes[-1] == card  # what the card left out, in the cell's notes
    saved = _saved(r.saved)  # section 2's rows and the compiled ones
    assert r.saved.name == "rmsnorm_models.jsonl" and len(saved) == len(models.rows) + 2
    loops = _saved(r.saved.with_name("rmsnorm_model_ratios.jsonl"))["loop"]
    assert set(loops) == {"norms", "compile"}


def test_sections_save_before_a_tripped_bound(data_dir, monkeypatch):
    """One tripped bound on a GPU must not lose the run (issue 47): section 1's ratios and section 5's loops are saved
    first, then forward <= forward+backward is checked."""
    from helpers.experiments import rmsnorm_sections, rmsnorm_speed
    from helpers.timing import Comparison

    def slow(a, b):  # a's forward measurably slower than its forward+backward
        times = {f"{a}|fwd": 1.0, f"{a}|fwd+bwd": 0.5, f"{b}|fwd": 0.2, f"{b}|fwd+bwd": 0.5}
        return Comparison({label: [t] * 6 for label, t in times.items()}, f"{a}|fwd", "cpu")

    monkeypatch.setattr(rmsnorm_sections, "compare_shapes", lambda *a, **k: ([], {("float32", 32): slow("torch", "x")}))
    with pytest.raises(AssertionError, match="forward takes"):
        XR.shapes_section(SCALE, DEVICE, "cpu")
    [ratios] = data_dir.rglob("rmsnorm_ratios.jsonl")
    assert set(_saved(ratios)["pass"]) == {"fwd", "fwd+bwd"}  # saved before the check raised
    row = dict(size="tiny", norm="rmsnorm", pass_="fwd", median_s=1e-3)
    monkeypatch.setattr(
        rmsnorm_speed, "compare_compiled", lambda *a, **k: ([{**row, "compiled": True}], slow("True", "False"))
    )
    models = XR.Timed(rows=[row], comps={})  # section 2's rows, saved beside the compiled ones
    with pytest.raises(AssertionError, match="forward takes"):
        XR.compile_section(models, dict(SCALE, compile_model_sizes=["tiny"]), ["tiny"], DEVICE, "cpu")
    [loops] = data_dir.rglob("rmsnorm_model_ratios.jsonl")
    assert set(_saved(loops)["loop"]) == {"compile"} and len(_saved(loops.with_name("rmsnorm_models.jsonl"))) == 2


def test_fastest_section_judges_the_kernels_targets_on_the_gpu_profile():
    from helpers.timing import Comparison

    def row(impl, pass_, ms, frac):
        return dict(impl=impl, dtype="float32", H=4096, rows=8, median_s=ms / 1e3, GBps=1.0, frac_of_copy=frac,
                    **{"pass": pass_})  # fmt: skip

    rows = [row("triton", "fwd", 1, 0.9), row("triton", "fwd+bwd", 2, 0.5)]
    rows += [row(o, p, 4, 0.3) for o in ("compiled", "F.rms_norm") for p in ("fwd", "fwd+bwd")]
    samples = {f"{r['impl']}|{r['pass']}": [r["median_s"] * (1 + i / 100) for i in range(6)] for r in rows}
    shapes = XR.Timed(rows=rows, comps={("float32", 4096): Comparison(samples, "triton|fwd", "cpu")})
    bw = XR.Bandwidth(big=pd.DataFrame(rows))
    r = XR.fastest_section(shapes, bw, dict(SCALE, hidden=[4096]), "gpu")
    assert r.table["met"].tolist() == [True, False, True]  # forward 0.9 >= 0.85; fwd+bwd 0.5 < 0.6; 2x faster
    assert r.values == {"targets_met": 2, "targets": 3} and r.notes[0].startswith("float32 fwd H=4096 : fastest is")
