"""`python -m helpers yours` on the kernel topics: the fixture student (our implementations) passes every check,
each mutant is caught with a message naming the broken property, and bad input is reported, never crashes the run."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from browser import needs_chromium, start_chrome

from helpers.attention.pytorch import FlashAttentionPyTorch
from helpers.course.yours import Options, inventory, run
from helpers.course.yours import kernels as K
from helpers.course.yours.adapters import AdaptersError, assignment_root
from helpers.course.yours.kernels import attention as AC
from helpers.course.yours.kernels import rmsnorm as N
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
    apply, checks, _ = K._function_checks(Adapter("rmsnorm", "pytorch", "ok", {name: lambda: Plain}), suites)
    within = [c for c in checks if not c.beyond]
    assert apply is not None and within and all(c.status == PASS for c in within), checks
    [typed] = [c for c in checks if c.beyond]
    assert typed.prop == K.FUNCTION_TYPE and "the class Plain, not a torch.autograd.Function subclass" in typed.detail
    assert typed.why == K.ONLY_APPLY
    _, checks, _ = K._function_checks(Adapter("rmsnorm", "pytorch", "ok", {name: lambda: lambda x, g: x}), suites)
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


@pytest.mark.ci
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
        _, checks, poisoned = K._function_checks(
            Adapter("rmsnorm", impl, "ok", {name: lambda: RMSNormPyTorchFunction}), suites, runtime
        )
        assert not poisoned
        assert checks and all(c.status == PASS for c in checks) and seen and set(seen) == {want}


class _StickyCudaError(torch.autograd.Function):
    """Exact attention (SDPA, its gradients by autograd) that raises what a GPU's illegal address raises on
    N_q != N_k, and on every call after it in the same process (a CUDA error is sticky)."""

    failed = []

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        if q.shape[-2] != k.shape[-2] or _StickyCudaError.failed:
            _StickyCudaError.failed.append(1)
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        ctx.save_for_backward(q, k, v)
        ctx.is_causal = is_causal
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    @staticmethod
    def backward(ctx, do):
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=ctx.is_causal)
            return (*torch.autograd.grad(o, (q, k, v), do), None)


def test_a_cuda_error_stops_the_process_and_is_the_students_failure(monkeypatch):
    """The property that met the CUDA error is the student's ERROR (never 'needs a GPU', even when our own proof
    run would fail too in the poisoned process); nothing runs after it in this process."""
    from helpers.course.yours.adapters import Adapter
    from helpers.course.yours.report import NEEDS_GPU

    _StickyCudaError.failed.clear()
    runtime = K.TritonRuntime("cpu", "", None, lambda *a: "CUDA error: ours fails too in this process")
    props = {"ok": [AC.AttnCase(16, 16, 16, False)], "nk": [AC.AttnCase(16, 32, 16, False)], "after": [LSE]}
    name = "get_flashattention_autograd_function_triton"
    adapter = Adapter("attention", "triton", "ok", {name: lambda: _StickyCudaError})
    _, checks, poisoned = K._function_checks(adapter, [K.Suite(props, K.check_attn_function)], runtime)
    assert poisoned and [c.prop for c in checks] == ["ok", "nk"]
    assert checks[0].status == PASS and checks[1].status == ERROR != NEEDS_GPU
    assert "CUDA error" in checks[1].detail and "fresh process" in checks[1].detail
    on_gpu = K.TritonRuntime("cuda", "", None, lambda *a: "fails")
    assert on_gpu.cannot_run(LSE) == ""  # on a GPU our kernel is never the proof that a case cannot run


LSE = AC.AttnCase(32, 32, 16, False)


def test_on_a_gpu_fp32_triton_is_held_to_the_courses_bound(monkeypatch):
    """tl.dot rounds fp32 to TF32 on a GPU and the course's tests accept 1e-2: there the contract's bound for fp32 is
    the course's; bf16 keeps its derived bound. On the CPU (the interpreter's exact fp32), the derived bound."""
    from helpers.course.yours.kernels import suites as S

    case = AC.AttnCase(32, 32, 16, False, batch=1)

    def off_by(rel):
        return lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c) * (1 + rel)

    cpu = S.attention_suites("triton", Options())
    assert "the bound" in cpu[0].check(off_by(3e-3), case, "cpu")  # far past fp32's arithmetic
    monkeypatch.setattr(S, "triton_device", lambda: "cuda")
    gpu = S.attention_suites("triton", Options())
    assert gpu[0].check(off_by(3e-3), case, "cpu") == ""  # within rtol = atol = 1e-2
    assert "the bound" in gpu[0].check(off_by(3e-2), case, "cpu")
    bf16 = AC.AttnCase(32, 32, 16, False, torch.bfloat16, batch=1)
    assert "the bound" in AC.check_attn_function(off_by(3e-2), bf16, tolerance=AC.COURSE)
    assert S._attn_check_at(off_by(3e-2), bf16, tolerance=AC.COURSE) == ""  # bf16 keeps its own derived bound
    assert "the bound" in S._attn_check_at(off_by(0.3), bf16, tolerance=AC.COURSE)


def test_the_sdpa_baseline_is_given_4d_inputs(monkeypatch):
    """PyTorch's fused SDPA kernels take (batch, heads, N, d) only: the 3-D inputs go in as (1, batch, N, d)."""
    from helpers.course.yours.kernels import timing as T

    seen, real = [], F.scaled_dot_product_attention
    monkeypatch.setattr(
        T.F, "scaled_dot_product_attention", lambda q, *a, **kw: seen.append(q.dim()) or real(q, *a, **kw)
    )
    q, k, v, _ = AC.attn_inputs(AC.AttnCase(32, 32, 16, True, batch=3))
    o = T.sdpa_3d(q, k, v, True)
    assert seen == [4] and o.shape == q.shape
    assert torch.allclose(o, real(q, k, v, is_causal=True), atol=1e-6)


def test_the_contract_cases_keep_the_handouts_promises():
    """Within the contract: N and d powers of two and at least 16, 3-D; the Triton version's cases reach several
    query tiles, batch elements that outnumber them, N = 16, N_q != N_k, d = 16 and 128, bf16 and fp32; RMSNorm
    reaches H = 8192 with eps-sensitive rows."""

    def power(n):
        return n >= 16 and n & (n - 1) == 0

    for props in (AC.ATTN_PYTORCH_CONTRACT, AC.ATTN_CAUSAL_RUNS, AC.ATTN_TRITON_CONTRACT, AC.ATTN_TRITON_GPU_CONTRACT):
        for case in (c for cases in props.values() for c in cases):
            assert power(case.Tq) and power(case.Tk) and power(case.d) and not case.heads, case
    triton = [c for cases in AC.ATTN_TRITON_CONTRACT.values() for c in cases]
    assert any(c.batch > c.Tq // 16 for c in triton) and any(c.Tq == 16 for c in triton)
    assert any(c.Tq != c.Tk for c in triton) and {16, 128} <= {c.d for c in triton}
    assert {torch.float32, torch.bfloat16} == {c.dtype for c in triton} and any(c.is_causal for c in triton)
    widths = {c.shape[-1] for cases in N.NORM_CONTRACT.values() for c in cases}
    assert {1024, 2048, 4096, 8192} <= widths and any(
        c.scale < 1e-2 for c in N.NORM_CONTRACT[next(p for p in N.NORM_CONTRACT if p.startswith("eps"))]
    )


def test_the_float64_reference_is_the_same_in_query_chunks(monkeypatch):
    from helpers.course.yours.kernels import attention_reference as R

    case = AC.AttnCase(64, 128, 16, True)
    q, k, v, do = AC.attn_inputs(case)
    whole = R.attn_float64(q, k, v, do, R.Variant(True))
    monkeypatch.setattr(R, "CHUNK_ELEMENTS", 5 * 128)  # 5 query rows at a time, the last chunk shorter
    chunked = R.attn_float64(q, k, v, do, R.Variant(True))
    for name in whole.want:
        assert torch.allclose(whole.want[name], chunked.want[name], rtol=1e-12, atol=1e-12), name
        assert torch.allclose(whole.scales[name], chunked.scales[name], rtol=1e-12, atol=1e-12), name
    assert (whole.s_max, whole.s_abs_d) == pytest.approx((chunked.s_max, chunked.s_abs_d), rel=1e-12)


STICKY_STUDENT = """
import math, os, signal
import torch
import torch.nn.functional as F

FAILED = []


class Exact(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        if q.shape[-2] != k.shape[-2] or FAILED:
            FAILED.append(1)
            BREAK()
        s = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])
        if is_causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
        lse = torch.logsumexp(s, -1)
        ctx.save_for_backward(q, k, v, lse)
        ctx.is_causal = is_causal
        return (torch.exp(s - lse[..., None]) @ v.float()).to(q.dtype)

    @staticmethod
    def backward(ctx, do):
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors[:3])
            o = F.scaled_dot_product_attention(q, k, v, is_causal=ctx.is_causal)
            return (*torch.autograd.grad(o, (q, k, v), do), None)


def get_flashattention_autograd_function_triton():
    return Exact
"""


@pytest.mark.parametrize(
    "how, says",
    [
        ("os.kill(os.getpid(), signal.SIGSEGV)", "died in this check (SIGSEGV)"),
        ("raise RuntimeError('CUDA error: an illegal memory access was encountered')", "a CUDA error"),
    ],
    ids=["crash", "cuda-error"],
)
def test_a_process_broken_in_one_check_names_it_and_the_others_are_judged(tmp_path, how, says):
    """A crash, or a CUDA error (simulated: it fails every later call in its process, as on a GPU), in the N_q != N_k
    cases: that property is the student's ERROR, the others run in a fresh process and pass."""
    from helpers.course.yours.kernels.launch import _impl_checks
    from helpers.course.yours.report import NEEDS_GPU

    path = tmp_path / "adapters.py"
    path.write_text(STICKY_STUDENT.replace("BREAK()", how))
    checks = _impl_checks(K.attention_worker, str(path), "attention", CHECKS_ONLY, "triton")
    within = {c.prop: c for c in checks if not c.beyond}
    broken = within.pop("N_q != N_k (powers of two)")
    assert broken.status == ERROR != NEEDS_GPU and says in broken.detail, broken
    assert within and all(c.status == PASS for c in within.values()), within
    assert list(within)[0].startswith("batch elements")  # in the order the properties are checked


def test_a_timing_rows_error_hides_no_other_row_and_a_cuda_error_is_rerun_in_a_fresh_process(monkeypatch):
    """One row raising leaves the others timed (its error named); a CUDA error (stubbed) stops this process's timing
    and run_kernel_topic times the other rows in a fresh process, then the failed one once more alone."""
    from dataclasses import replace

    from helpers.course.yours.kernels import launch as KL
    from helpers.course.yours.kernels import timing as KT
    from helpers.course.yours.report import TopicResult

    opts = Options(steps=2, warmup=0)

    def boom(exc):
        def call():
            raise exc

        return call

    calls = {"ours:pytorch": lambda: None, "yours:pytorch": boom(ValueError("shape")), "pytorch:sdpa": lambda: None}
    errors = []
    rows = KT.timing_rows("attention", calls, baseline="ours:pytorch", opts=opts, shape="s", errors=errors)
    assert {r["who"] for r in rows} == {"ours", "pytorch"} and errors[0][0] == "yours:pytorch"
    calls["yours:triton"] = boom(RuntimeError("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(KT.TimingFault) as fault:
        KT.timing_rows("attention", calls, baseline="ours:pytorch", opts=opts, shape="s", errors=[])
    assert fault.value.label == "yours:triton"

    launched = []  # each fresh process's options: the other rows, then the failed one alone

    def in_rank(fn, path, o, *args):
        launched.append(o)
        row = {"who": "yours", "impl": "triton"} if o.timing_only else {"who": "ours", "impl": "pytorch"}
        return TopicResult("attention", rows=[row])

    monkeypatch.setattr(KL, "_in_rank", in_rank)
    first = TopicResult("attention", timing_fault="yours:triton")
    first.checks.append(K.Check("attention", "yours:triton", "timing runs", ERROR, "raised RuntimeError: CUDA error"))
    got = KL._timing_again(None, "adapters.py", replace(opts), first, None)
    assert [o.timing_skip for o in launched] == [("yours:triton",), ()]
    assert launched[1].timing_only == ("yours:triton",)
    assert {(r["who"], r["impl"]) for r in got.rows} == {("ours", "pytorch"), ("yours", "triton")}
    assert "not when rerun alone in a fresh process" in got.checks[0].detail


def test_cuda_events_and_streams_run_on_a_cpu_only_torch_as_nvtx_does(monkeypatch):
    """torch.cuda.Event, Stream, stream(), current_stream() and synchronize() raise on a CPU-only build: stubbed where
    the student's code runs, their logic (timing, a side stream) runs and the elapsed time is the host's."""
    import torch

    from helpers.course.yours.student_env import CUDA_STUBS, quiet_cuda_events

    for name in CUDA_STUBS:
        monkeypatch.setattr(torch.cuda, name, getattr(torch.cuda, name))  # restored after the test
    if not quiet_cuda_events():
        pytest.skip("a CUDA build of torch runs its own events")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        start.record()
        torch.ones(64).sum()
        end.record()
    torch.cuda.synchronize()
    assert start.elapsed_time(end) >= 0.0


def test_a_layout_case_whose_contiguous_twin_raises_is_not_the_layouts_fault():
    """A kernel whose fixed tiles overrun short inputs raises on the plain case as on its expanded or sliced twin
    (an out-of-bounds load): the length rules report it, never a layout rule (a false red line there)."""
    import dataclasses

    import pytest

    from helpers.course.yours.kernels.suites import NotALayoutBug, layout_check

    @dataclasses.dataclass
    class Case:
        n: int
        expanded: bool = False

    def check(apply, case, device):
        if case.n < 64:
            raise IndexError("tl.load reaches elements outside every tensor")
        return "" if not case.expanded else "wrong with a stride-0 gradient"

    with pytest.raises(NotALayoutBug, match="contiguous twin"):
        layout_check(check, None, Case(32, expanded=True))
    assert layout_check(check, None, Case(64, expanded=True)) == "wrong with a stride-0 gradient"  # still judged


class MaskLeftOut(FlashAttentionPyTorch):
    """Our FlashAttention with is_causal left out, as the handout lets the PyTorch version do."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        return FlashAttentionPyTorch.forward(ctx, q, k, v, False)


def test_a_pytorch_version_without_the_mask_is_judged_on_4d_tails_and_bf16_for_what_they_are():
    """The probes past the handout run causal cases; a PyTorch version that leaves the mask out (allowed) differs
    there because of the mask alone, which its own probe reports: the others must not blame 4-D, tails or bf16."""
    from helpers.course.yours.kernels.suites import attention_suites

    verdicts = {
        prop: [suite.check(MaskLeftOut.apply, case, "cpu") for case in cases]
        for suite in attention_suites("pytorch", Options(timed=False))
        if suite.beyond
        for prop, cases in suite.properties.items()
        if prop != "nothing N_q x N_k saved for backward"
    }
    mask = verdicts.pop("causal mask applied (optional for the PyTorch version)")
    assert all(mask) and set(verdicts) == {"4-D (batch, heads, N, d)", "lengths that are not tile multiples", "bf16"}
    assert all(v == "" for found in verdicts.values() for v in found), verdicts


def test_a_layout_case_whose_twin_raises_says_so():
    """A backward not written yet is not a layout bug, and the skip says what the plain twin did."""
    from helpers.course.yours.kernels.suites import NotALayoutBug, layout_check

    class NoBackward(MaskLeftOut):
        @staticmethod
        def backward(ctx, do):
            raise NotImplementedError

    case = next(iter(AC.ATTN_LAYOUTS.values()))[0]
    with pytest.raises(NotALayoutBug, match=r"twin \(.*\) has no backward yet \(the rules above\)"):
        layout_check(AC.check_attn_function, NoBackward.apply, case)


def test_a_students_failed_compile_leaves_no_torch_error_log_above_the_report(caplog, monkeypatch):
    """The fake-tensor error log of a torch.compile'd function that fails to trace, and dynamo's warning that one hit
    its recompile limit (our checks' many shapes did), are held back in checked processes (the check reports the
    exception), also after torch._logging resets its loggers, and only those records."""
    import logging

    from helpers.course.yours.adapters import quiet_compile_errors

    log, frames = logging.getLogger("torch._subclasses.fake_tensor"), logging.getLogger("torch._dynamo.convert_frame")
    monkeypatch.setattr(log, "filters", [])  # these processes' loggers as they were, after the test
    monkeypatch.setattr(frames, "filters", [])
    quiet_compile_errors()
    quiet_compile_errors()  # once is enough: no second filter
    torch._logging.set_logs()  # what dynamo's start does to torch's loggers' levels
    assert len(log.filters) == len(frames.filters) == 1
    with caplog.at_level(logging.WARNING):
        log.error("failed while attempting to run meta for aten.bmm")
        frames.warning("torch._dynamo hit config.%s (%s)\n   function: %s", "recompile_limit", 8, "tile")
        frames.warning("another warning")
        logging.getLogger("torch._dynamo").error("still shown")
    assert [r.getMessage() for r in caplog.records] == ["another warning", "still shown"]


def test_torchs_notices_about_a_students_calls_are_held_back_and_theirs_are_not(recwarn):
    """A deprecated collective's name (torch 2.13's FutureWarning from torch.distributed) and a full backward hook on
    a module whose inputs need no gradient printed once per rank above a 2026 repository's report; other warnings
    still show."""
    import warnings

    from helpers.course.yours.adapters import quiet_compile_errors

    with warnings.catch_warnings():
        quiet_compile_errors()
        warnings.warn_explicit(
            "`all_gather_into_tensor` is deprecated",
            FutureWarning,
            "c10d_logger.py",
            83,
            module="torch.distributed.c10d_logger",
        )
        warnings.warn("Full backward hook is firing when gradients are computed with respect to outputs", stacklevel=1)
        warnings.warn_explicit("their own", FutureWarning, "fsdp.py", 1, module="cs336_systems.fsdp")
        warnings.warn("another", UserWarning, stacklevel=1)
    assert [str(w.message) for w in recwarn] == ["their own", "another"]


def test_a_missing_adapters_file_points_to_the_one_2024s_layout_keeps_a_folder_down(tmp_path):
    from helpers.course.yours.adapters import no_adapters_file

    readme_path = tmp_path / "assignment2-systems" / "tests" / "adapters.py"  # the README's path, 2025-26 layout
    assert "found" not in str(no_adapters_file(readme_path))
    real = tmp_path / "assignment2-systems" / "cs336-systems" / "tests" / "adapters.py"
    real.parent.mkdir(parents=True)
    real.write_text("")
    said = str(no_adapters_file(readme_path))
    assert said.startswith(f"no adapters file at {readme_path}") and said.endswith(f"found: {real}")


def test_a_compiled_function_out_of_recompiles_is_judged_after_a_reset():
    """A student's torch.compile(fullgraph=True) function that our earlier shapes ran out of recompiles raises on the
    next case: that case is judged after torch._dynamo.reset(), not taken for a refusal of its layout (a 2026
    repository's PyTorch FlashAttention met it at the expanded-gradient case, 2026-11-29)."""
    double = torch.compile(lambda x: x * 2, backend="eager", fullgraph=True, dynamic=False)
    for n in range(1, torch._dynamo.config.recompile_limit + 1):  # every recompile the limit allows, one per shape
        double(torch.ones(n))

    def check(n: int) -> str:
        return "" if torch.equal(double(torch.ones(n)), torch.full((n,), 2.0)) else f"{n}: wrong values"

    assert K._one_case(check, 99, None, refusable=True) == (PASS, "")
    assert K.hit_recompile_limit(RuntimeError("x")) is False
