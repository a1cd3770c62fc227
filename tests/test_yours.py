"""`python -m helpers yours` on the kernel topics: the fixture student (our implementations) passes every check,
each mutant is caught with a message naming the broken property, and bad input is reported, never crashes the run."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from browser import needs_chromium, start_chrome

from helpers.course.yours import Options, inventory, run
from helpers.course.yours import kernels as K
from helpers.course.yours import norm_checks as N
from helpers.course.yours.adapters import AdaptersError, assignment_root
from helpers.course.yours.report import ERROR, FAIL, NOT_IMPLEMENTED, PASS
from helpers.results import load_results

STUDENT = Path(__file__).parent / "student"
ADAPTERS = STUDENT / "tests" / "adapters.py"
MUTANTS = STUDENT / "mutants"
CHECKS_ONLY = Options(timed=False)


def _by_impl(result, impl):
    return {c.prop: c for c in result.checks if c.impl == impl}


def test_the_assignment_root_is_found_from_tests_or_a_pyproject():
    assert assignment_root(ADAPTERS) == STUDENT
    assert assignment_root(MUTANTS / "rmsnorm_eps_outside.py") == STUDENT


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, g: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + K.EPS) * g,
        lambda x, g: F.rms_norm(x, (x.shape[-1],), g, K.EPS),
    ],
    ids=["naive", "F.rms_norm"],
)
def test_pytorchs_own_rmsnorm_passes_the_derived_bounds_in_every_dtype(fn):
    for cases in N.NORM_PROPERTIES.values():
        for case in cases:
            assert K.check_norm_function(fn, case) == "", case


def test_sdpa_passes_the_derived_bounds():
    def sdpa(q, k, v, c):
        return F.scaled_dot_product_attention(q, k, v, is_causal=c)

    for cases in K.ATTN_PROPERTIES.values():
        for case in cases:
            assert K.check_attn_function(sdpa, case) == "", case


def test_a_bound_is_tight_enough_to_catch_one_wrong_ulp_pattern():
    """A result off by 64 fp32 ulps everywhere fails: the bound is not a blanket tolerance."""

    def sloppy(x, g):
        y = F.rms_norm(x, (x.shape[-1],), g, K.EPS)
        return y * (1 + 64 * torch.finfo(torch.float32).eps)

    assert "the bound" in K.check_norm_function(sloppy, K.NormCase((7, 33)))


@pytest.mark.parametrize(
    "mutant, worker, prop, says",
    [
        (
            "rmsnorm_eps_outside",
            K.rmsnorm_worker,
            "eps = 1e-5 inside the square root",
            "eps added outside the square root",
        ),
        ("attention_causal_shift", K.attention_worker, "is_causal=True runs", "causal mask is shifted by one"),
        ("attention_two_stats", K.attention_worker, "exactly one (batch, N_q) logsumexp", "expected exactly one"),
    ],
)
def test_each_mutant_is_caught_naming_the_property(mutant, worker, prop, says):
    result = worker(str(MUTANTS / f"{mutant}.py"), CHECKS_ONLY, ["pytorch"])  # the mutant replaced that adapter
    failing = [c for c in result.checks if c.status == FAIL and c.impl == "pytorch" and c.prop.startswith(prop)]
    assert failing and says in failing[0].detail, result.checks
    assert not any(c.beyond for c in failing)


def test_bad_input_is_reported_per_implementation_and_topic():
    results = {
        r.topic: r for r in run(MUTANTS / "broken_kernels.py", ["rmsnorm", "attention"], CHECKS_ONLY, progress=False)
    }
    norm = results["rmsnorm"]
    nan = _by_impl(norm, "pytorch")["forward and both gradients vs float64, fp32 (..., H)"]
    assert nan.status == FAIL and "not finite" in nan.detail
    instance = _by_impl(norm, "triton")[K.FUNCTION_TYPE]  # an instance's .apply is the class's: judged, type noted
    assert instance.beyond and "an instance of RMSNormPyTorchFunction" in instance.detail
    assert "returns an autograd.Function" not in _by_impl(norm, "triton") and len(_by_impl(norm, "triton")) > 1
    assert all(c.status == PASS for c in norm.checks if c.impl.startswith("backward"))  # the others still ran
    crash = _by_impl(results["attention"], "pytorch")["runs to the end"]  # its own launch: the Triton one still ran
    assert crash.status == ERROR and "SIGSEGV" in crash.detail
    assert _by_impl(results["attention"], "triton")["implemented"].status == NOT_IMPLEMENTED


def test_behaviour_is_judged_through_apply_and_the_type_is_information():
    """A plain class whose .apply is a Function's passes the checks (one information row beyond the handout names
    its type); an object without .apply, which the course's tests could not call, is an error. No launch."""
    from helpers.course.yours.adapters import Adapter
    from helpers.rmsnorm import RMSNormPyTorchFunction

    class Plain:
        apply = staticmethod(RMSNormPyTorchFunction.apply)

    suites = [K.Suite(N.NORM_CONTRACT, K.check_norm_function)]
    name = "get_rmsnorm_autograd_function_pytorch"
    apply, checks = K._function_checks(Adapter("rmsnorm", "pytorch", "ok", {name: lambda: Plain}), suites)
    within = [c for c in checks if not c.beyond]
    assert apply is not None and within and all(c.status == PASS for c in within), checks
    [typed] = [c for c in checks if c.beyond]
    assert typed.prop == K.FUNCTION_TYPE and "the class Plain, not a torch.autograd.Function subclass" in typed.detail
    assert typed.why == K.ONLY_APPLY
    _, checks = K._function_checks(Adapter("rmsnorm", "pytorch", "ok", {name: lambda: lambda x, g: x}), suites)
    assert [(c.status, c.beyond) for c in checks] == [(ERROR, False)] and "has no .apply" in checks[0].detail


def test_nvtx_ranges_are_no_ops_on_a_cpu_only_torch(monkeypatch):
    """The handouts' NVTX ranges: torch's own stub raises on a CPU-only build; after quiet_nvtx they run (a CUDA build
    keeps its own NVTX)."""
    import torch.cuda.nvtx as nvtx

    from helpers.course.yours.student_env import NoNVTX, quiet_nvtx

    if hasattr(torch._C, "_nvtx"):
        assert not quiet_nvtx()
        return

    class TorchStub:  # what a fresh process's torch.cuda.nvtx holds on a CPU-only build (an earlier load replaced it)
        def fail(*args):
            raise RuntimeError("NVTX functions not installed. Are you sure you have a CUDA build?")

        rangePushA = rangePop = markA = fail  # noqa: N815 - torch's names

    monkeypatch.setattr(nvtx, "_nvtx", TorchStub())
    with pytest.raises(RuntimeError, match="NVTX functions not installed"):
        nvtx.range_push("step")
    assert quiet_nvtx() and isinstance(nvtx._nvtx, NoNVTX)
    assert nvtx.range_push("step") == 0 and nvtx.range_push("inner") == 1 and nvtx.range_pop() == 1
    with nvtx.range("forward"):
        nvtx.mark("here")
    assert nvtx.range_pop() == 0


def test_a_file_that_cannot_be_used_gets_one_clear_error(tmp_path):
    with pytest.raises(AdaptersError, match="no adapters file"):
        inventory(tmp_path / "missing.py")
    with pytest.raises(AdaptersError, match=r"ImportError.*import_error\.py:2"):
        inventory(MUTANTS / "import_error.py")


def test_not_implemented_is_listed_as_such(tmp_path):
    path = tmp_path / "adapters.py"
    path.write_text("def get_rmsnorm_autograd_function_pytorch():\n    raise NotImplementedError\n")
    result = K.rmsnorm_worker(str(path), CHECKS_ONLY)
    statuses = {c.impl: c.status for c in result.checks}
    assert statuses["pytorch"] == NOT_IMPLEMENTED and statuses["triton"] == "skipped"


@pytest.fixture(scope="module")
def command(tmp_path_factory):
    """One `python -m helpers yours` run on the fixture's kernel topics: (the finished process, the page's folder)."""
    out = tmp_path_factory.mktemp("yours")
    cmd = [
        sys.executable,
        "-m",
        "helpers",
        "yours",
        str(ADAPTERS),
        "--topics",
        "rmsnorm,attention",
        "--no-compile",
        "--steps",
        "6",
        "--out",
        str(out),
        "--results",
        str(out),
    ]  # not data/local: the writeup would link it
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600), out


def test_the_command_prints_saves_and_writes_the_page(command, tmp_path):
    run_, out = command
    assert run_.returncode == 0, run_.stdout[-3000:] + run_.stderr[-3000:]
    for who in ("yours:pytorch", "ours:pytorch", "pytorch:F.rms_norm", "pytorch:sdpa"):
        assert who in run_.stdout
    checks = load_results(out / "yours_checks.jsonl").rows  # the fixture (our implementations) passes every check
    assert checks and all(c["status"] == PASS for c in checks), [c for c in checks if c["status"] != PASS]
    assert {c["impl"] for c in checks if c["topic"] == "attention"} == {"pytorch", "triton"}
    page = (out / "yours.html").read_text()
    assert "Yours beside ours" in page and "fwd+bwd time" in page
    bad = subprocess.run(
        [sys.executable, "-m", "helpers", "yours", str(tmp_path / "nope.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "no adapters file" in bad.stderr and "Traceback" not in bad.stderr


def test_beyond_the_handout_reads_as_information_in_the_terminal_and_on_the_page(capsys):
    """Within the handout: pass / fail / error. Beyond it: "differs" and "raises" with why the handout does not
    require it, grouped per topic and folded (counts first; on the page a <details> per topic), never "fail" or
    "error"; the saved statuses and the summary keep their meaning."""
    from helpers.course.yours.page import render
    from helpers.course.yours.report import (
        DIFFERS,
        LEFT_OPEN,
        RAISES,
        Check,
        TopicResult,
        checks_table,
        print_report,
        summary,
    )

    results = [
        TopicResult(
            "attention",
            [
                Check("attention", "pytorch", "output vs float64", FAIL, "o[0, 3, 1] off by 2x the bound"),
                Check("attention", "pytorch", "4-D (batch, heads, N, d)", ERROR, "raised EinopsError: 4 dims", True),
                Check("attention", "pytorch", "bf16", FAIL, "o[0, 0, 0] off by 3x the bound", True),
                Check("attention", "pytorch", "lengths that are not tile multiples", PASS, "", True),
            ],
        ),
        TopicResult("ddp", [Check("ddp", "ddp", "beyond the handout: something new", FAIL, "w[1] differs", True)]),
    ]
    print_report(results)
    out = capsys.readouterr().out
    within, beyond = out.split("==== beyond the handout")
    assert "fail  pytorch     output vs float64" in within and "o[0, 3, 1]" in within
    assert "== attention: 3 probes: 1 pass, 1 differs, 1 raises" in beyond and "== ddp: 1 probe: 1 differs" in beyond
    assert f"{RAISES}  pytorch     4-D (batch, heads, N, d)" in beyond and "(the handout's inputs are 3-D" in beyond
    assert f"{DIFFERS}  ddp         something new" in beyond and f"({LEFT_OPEN})" in beyond
    assert "tile multiples" not in beyond  # a probe that passed is folded into the counts
    assert not any(word in beyond for word in (f" {FAIL} ", f" {ERROR} ", f"{FAIL}  ", f"{ERROR}  "))
    rows = checks_table(results).to_dict(orient="records")
    assert [r["status"] for r in rows if r["beyond"]] == [ERROR, FAIL, PASS, FAIL]  # the data keep their statuses
    assert rows[2]["why"] == "the course's tests run this implementation in fp32" and rows[0]["why"] == ""
    assert summary(rows) == (
        "1 checks of what you implemented: 0 pass, 1 fail, 0 need a GPU or another Triton; 0 not implemented",
        False,
    )
    page = render(rows, [], {"device": "cpu", "profile": "cpu"})
    folded = page.split("<h2 id='beyond'>")[1]
    assert (
        folded.count("<details>") == 2 and "<summary><b>attention</b>: 3 probes: 1 pass, 1 differs, 1 raises" in folded
    )
    assert (
        f"<b>{RAISES}</b>" in folded and f"<b>{DIFFERS}</b>" in folded and "the handout&#x27;s inputs are 3-D" in folded
    )
    assert "<b>fail</b>" not in folded and "<b>error</b>" not in folded and "#cf222e" not in folded
    assert "<b>fail</b>" in page.split("<h2 id='beyond'>")[0]  # within the handout, a failure stays one


@needs_chromium
def test_the_page_passes_the_browser_checks_offline(command):
    from test_browser import check_page

    driver = start_chrome(offline=True)
    try:
        check_page(driver, command[1] / "yours.html", command[1] / "yours.png")
    finally:
        driver.quit()


def test_the_notebooks_experiments_take_yours_as_one_more_implementation():
    from helpers.course.yours.adapters import functions
    from helpers.experiments import attention as XA
    from helpers.experiments import rmsnorm as XR

    assert functions(None, "rmsnorm") == {}
    norms = functions(ADAPTERS, "rmsnorm")  # on a CPU: the PyTorch one (Triton would time its interpreter)
    assert list(norms) == ["yours:pytorch"]
    rows, comp = XR.compare_shape(["torchfn", *norms], 64, 96, warmup=1, steps=6, fns=norms)
    assert {r["impl"] for r in rows} == {"torchfn", "yours:pytorch"} and "yours:pytorch|fwd+bwd" in comp.samples
    attn = functions(ADAPTERS, "attention")
    cmp = XA.compare_impls(["flash_pytorch", *attn, "sdpa"], (1, 2, 32, 16), warmup=1, steps=6, fns=attn)
    assert set(cmp.samples) == {"flash_pytorch", "yours:pytorch", "sdpa"}


def test_triton_checks_draw_their_inputs_on_the_device_triton_runs_on(monkeypatch):
    """On a GPU the Triton checks' inputs are CUDA tensors (a kernel cannot read CPU memory); the PyTorch version
    keeps the course's CPU inputs. Checked through the device argument, with a runtime that says "cuda"."""
    from helpers.course.yours.adapters import Adapter
    from helpers.rmsnorm import RMSNormPyTorchFunction

    seen, real = [], N.norm_inputs
    monkeypatch.setattr(N, "norm_inputs", lambda case, seed=0, device="cpu": seen.append(device) or real(case, seed))
    suites = [K.Suite(K.NORM_CONTRACT, K.check_norm_function)]
    for impl, runtime, want in (("triton", K.TritonRuntime("cuda", "", None, None), "cuda"), ("pytorch", None, "cpu")):
        seen.clear()
        name = f"get_rmsnorm_autograd_function_{impl}"
        _, checks = K._function_checks(
            Adapter("rmsnorm", impl, "ok", {name: lambda: RMSNormPyTorchFunction}), suites, runtime
        )
        assert checks and all(c.status == PASS for c in checks) and seen and set(seen) == {want}
