"""`yours` judged by the course's contract, on tests/corpus: an assignment repository written in the styles students
use (3-D einsum, einops tiles of 16, a torch.compile'd tile update, Triton with block pointers, a Triton wrapper that
asserts CUDA, a relative sys.path entry, the 2025 template's package that reads its own metadata). Each correct
implementation must pass every check within the handout (or be one this environment cannot run); each mutant in
tests/corpus/mutants must fail within the handout, with the right diagnosis or none."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.course.yours import Options, run
from helpers.course.yours import kernels as K
from helpers.course.yours.kernels.attention import ATTN_LAYOUTS
from helpers.course.yours.report import (
    CANNOT_RUN,
    ERROR,
    FAILED,
    NEEDS_GPU,
    NEEDS_TRITON,
    PASS,
    SKIPPED,
    checks_table,
    summary,
)

CORPUS = Path(__file__).parent / "corpus"
CHECKS_ONLY = Options(timed=False, timeout_s=300)
BLOCK_POINTERS = not K.block_pointer_probe("cuda" if K.torch.cuda.is_available() else "cpu")
needs_block_pointers = pytest.mark.skipif(not BLOCK_POINTERS, reason="this Triton has no block pointers")


def within(results) -> list:
    return [c for r in results for c in r.checks if not c.beyond]


@pytest.mark.parametrize("adapters", ["adapters.py", "adapters_styles.py", "adapters_compiled.py"])
def test_course_style_implementations_are_never_flagged(adapters):
    results = run(CORPUS / "tests" / adapters, ["rmsnorm", "attention"], CHECKS_ONLY, progress=False)
    bad = [c for c in within(results) if c.status in FAILED]
    assert not bad, "\n".join(f"{c.topic} {c.impl} | {c.prop} | {c.status} | {c.detail}" for c in bad)
    text, ok = summary(checks_table(results).to_dict(orient="records"))
    assert ok and " 0 fail" in text, text
    if adapters == "adapters_styles.py":  # NVTX ranges, and a plain class whose .apply is a Function's: its type noted
        norm = [c for c in results[0].checks if c.impl == "pytorch"]
        assert [c.status for c in norm if not c.beyond] and all(c.status == PASS for c in norm if not c.beyond)
        [typed] = [c for c in norm if c.prop == K.FUNCTION_TYPE]
        assert typed.beyond and "the class RMSNormFunction" in typed.detail
    triton = {(c.topic, c.prop): c.status for c in within(results) if c.impl == "triton" and c.status != SKIPPED}
    if BLOCK_POINTERS:  # the course's Triton: every Triton implementation runs and passes (bf16's values on a GPU)
        assert set(triton.values()) <= {PASS, NEEDS_GPU}, triton
        assert all(status == PASS for (_, prop), status in triton.items() if "bf16" not in prop), triton
    elif triton:
        assert {s for (topic, _), s in triton.items() if topic == "attention"} <= {NEEDS_TRITON, *CANNOT_RUN}
    if adapters == "adapters.py":  # the einsum style breaks on 4-D inputs and non-multiple lengths: reported only
        assert [c for r in results for c in r.checks if c.beyond and c.status in FAILED]


@functools.cache
def mutant_run(mutant: str) -> list:
    """`yours` on a mutant's topic, once per module: several cases (two implementations of one mutant, and the eps
    test below) read the same run."""
    return run(CORPUS / "mutants" / f"{mutant}.py", [mutant.split("_")[0]], CHECKS_ONLY, progress=False)


@pytest.mark.parametrize(
    "mutant, impl, says",
    [
        ("rmsnorm_half_grad", "pytorch", "dx is 0.5x"),
        ("rmsnorm_half_grad", "backward_x", "dx is 0.5x"),
        ("rmsnorm_no_eps", "pytorch", "eps"),
        ("rmsnorm_eps_1e8", "pytorch", "eps"),
        ("rmsnorm_stride_row", "triton", None),
        ("attention_keys_ignored", "pytorch", "keys beyond the first N_q"),
        ("attention_causal_short", "pytorch", None),
    ],
)
def test_each_mutant_fails_within_the_handout_with_a_right_or_no_diagnosis(mutant, impl, says):
    results = mutant_run(mutant)
    failed = [c for c in within(results) if c.impl == impl and c.status in FAILED]
    assert failed, [(c.impl, c.prop, c.status, c.detail) for c in within(results)]
    for c in failed:
        if "likely mistake" in c.detail:
            assert says and says in c.detail.split("likely mistake")[1], c.detail
    assert says is None or any(says in c.detail for c in failed), failed


GRID = "batch elements apart from query tiles (the grid is (T_q, batch))"
SHORT = "N = 16, shorter than a tile of 32 or more"
KERNEL_MUTANTS = [  # (mutant, implementation, the contract properties it fails, what their detail says)
    ("rmsnorm_triton_1024", "triton", {"the benchmark's widths, H = 1024 to 8192"}, "2x3x2048"),
    ("attention_triton_no_boundary", "triton", {SHORT}, "outside every tensor the kernel was given"),
    ("attention_triton_phantom_keys", "triton", {SHORT}, "pad N_k = 16 to 64 with zero keys"),
    ("attention_triton_fp32_out", "triton", {"bf16 (the handout benchmarks bf16 and fp32)"}, "expected the input's"),
    ("attention_triton_nk_backward", "triton", {"N_q != N_k (powers of two)"}, "must match the existing size"),
    ("attention_backward_masks", "pytorch", {"is_causal=True runs (the mask may be ignored)"}, "backward applies"),
    ("rmsnorm_triton_dy_row_stride", "triton", {next(iter(K.NORM_LAYOUTS))}, "dy expanded (stride 0)"),
    ("rmsnorm_triton_sliced_rows", "triton", {list(K.NORM_LAYOUTS)[1]}, "fp32 6x72, non-contiguous: y["),
    ("attention_triton_contiguous_strides", "triton", {list(ATTN_LAYOUTS)[1]}, "q, k, v sliced from"),
]


@needs_block_pointers
@pytest.mark.parametrize("mutant, impl, props, says", KERNEL_MUTANTS, ids=[m[0] for m in KERNEL_MUTANTS])
def test_each_kernel_mutant_fails_exactly_its_rule(mutant, impl, props, says):
    """A bug that passes the course's own tests fails exactly the property of the handout it breaks, saying so."""
    topic = mutant.split("_")[0]
    path = CORPUS / "mutants" / f"{mutant}.py"
    course_cases_pass(path, topic, impl)
    failed = {c.prop: c.detail for c in judged(path, topic, impl) if c.impl == impl and c.status in FAILED}
    assert set(failed) == props, failed
    assert all(says in detail for detail in failed.values()), failed


@needs_block_pointers
def test_the_eps_and_the_grid_mutants_fail_where_their_rule_shows():
    """eps = 1e-6 in Triton is named where the rows tell (and shows wherever fp32's bound is tight enough); a grid
    whose axes are swapped is named on the first property that separates batch elements from query tiles (its
    other cases read past the tensors: refused by the interpreter's guard, never a crash)."""
    for mutant, first, says in (
        ("rmsnorm_triton_eps_1e6", "eps = 1e-5 inside the square root", "eps = 1e-06"),
        ("attention_triton_grid_swapped", GRID, "launch grid whose axes are swapped"),
    ):
        topic = mutant.split("_")[0]
        path = CORPUS / "mutants" / f"{mutant}.py"
        course_cases_pass(path, topic, "triton")
        failed = {c.prop: c for c in judged(path, topic, "triton") if c.status in FAILED}
        assert says in next(c for p, c in failed.items() if p.startswith(first)).detail, failed
        for c in failed.values():
            assert ("eps" in c.detail) if topic == "rmsnorm" else ("swapped" in c.detail or "outside" in c.detail)


def course_cases_pass(path: Path, topic: str, impl: str) -> None:
    """The course's own tests' cases and bounds, in our words: FlashAttention 4 x 128 x 64 fp32 (the Triton version
    causal too), rtol = atol = 1e-2 on o, L and the gradients, one (4, 128) tensor saved; RMSNorm 10 x 20 x 50,
    rtol 1e-4 and atol 1e-5 (the 2024 tests). Runs the mutant in this process (the interpreter on a CPU)."""
    from helpers.course.yours import adapters as A

    device = "cuda" if K.torch.cuda.is_available() else "cpu"
    name = A.ADAPTERS[topic][impl][0]
    with corpus_loaded():
        apply = getattr(A.load(path), name)().apply
        _course_cases(apply, topic, impl, device)


def judged(path: Path, topic: str, impl: str) -> list:
    """A mutant's checks within the handout: in this process on a CPU (the interpreter refuses an access outside
    the tensors, so nothing crashes), in a launched one on a GPU (a CUDA error would poison this one)."""
    if K.torch.cuda.is_available():
        return within(run(path, [topic], CHECKS_ONLY, progress=False))
    worker = K.rmsnorm_worker if topic == "rmsnorm" else K.attention_worker
    with corpus_loaded():
        return within([worker(str(path), CHECKS_ONLY, [impl])])


STUDENT_PACKAGES = ("cs336_systems", "cs336_basics")  # every test's student repository names its packages so


@contextlib.contextmanager
def corpus_loaded():
    """Inside: the corpus's packages may be imported here, and another student's packages that an earlier test left
    in this process are set aside (they would shadow the corpus's); after, the corpus's leave, the others come back
    and sys.path is as before."""
    other = {m: mod for m, mod in sys.modules.items() if m.split(".")[0] in STUDENT_PACKAGES and not _in_corpus(mod)}
    for m in other:
        del sys.modules[m]
    modules, sys_path = set(sys.modules), list(sys.path)
    try:
        yield
    finally:
        where = {m: _location(sys.modules[m]) for m in set(sys.modules) - modules}  # all before any is removed
        for module, place in where.items():
            if place.startswith(str(CORPUS)):
                del sys.modules[module]
        sys.modules.update(other)
        sys.path[:] = sys_path


def _in_corpus(module) -> bool:
    return _location(module).startswith(str(CORPUS))


def _location(module) -> str:
    """Where a module's code lives: its file, or a namespace package's first folder."""
    return str(getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", None) or []), ""))


def _course_cases(apply, topic: str, impl: str, device: str) -> None:
    from helpers.course.yours.kernels.triton_runtime import pretend_cuda

    torch = K.torch
    gen = torch.Generator().manual_seed(0)
    if topic == "rmsnorm":
        x, g = torch.randn(10, 20, 50, generator=gen), torch.randn(50, generator=gen)
        dy = 0.1 * torch.randn(10, 20, 50, generator=gen)
        x, g, dy = (t.to(device) for t in (x, g, dy))
        x.requires_grad_(), g.requires_grad_()
        with pretend_cuda():
            y = apply(x, g)
            got = (y, *torch.autograd.grad(y, (x, g), dy))
        ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g
        for a, b in zip(got, (ref, *torch.autograd.grad(ref, (x, g), dy)), strict=True):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
        return
    q, k, v, do = (torch.randn(4, 128, 64, generator=gen).to(device) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    for is_causal in (False, True) if impl == "triton" else (False,):
        o = apply(q, k, v, is_causal)
        [lse] = [t for t in o.grad_fn.saved_tensors if t.shape == (4, 128)]
        s = q @ k.transpose(1, 2) / 8
        if is_causal:
            s = s.masked_fill(torch.ones(128, 128, dtype=torch.bool, device=device).triu(1), -1e6)
        ref = torch.softmax(s, -1) @ v
        close = dict(rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(o, ref, **close)
        torch.testing.assert_close(lse, torch.logsumexp(s, -1), **close)
        for a, b in zip(torch.autograd.grad(o, (q, k, v), do), torch.autograd.grad(ref, (q, k, v), do), strict=True):
            torch.testing.assert_close(a, b, **close)


def test_the_eps_mutants_are_told_apart_where_the_rows_can_tell():
    """Rows with mean(x^2) below eps separate eps = 1e-8 from no eps at all."""
    results = mutant_run("rmsnorm_eps_1e8")  # the run the case above judged
    [small] = [c for c in within(results) if c.prop.startswith("eps = 1e-5")]
    assert small.status in FAILED and "eps = 1e-08" in small.detail


def fake_student_env(tmp_path: Path, leave_out=("cloudpickle",)) -> Path:
    """A virtual environment like a student's `uv sync` makes: its own Python, the course's packages (linked from
    this one's), but not what only the companion needs (cloudpickle)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    import torch

    site = Path(torch.__file__).parents[1]
    linked = tmp_path / "packages"
    linked.mkdir()
    for entry in site.iterdir():
        if (
            not entry.name.endswith(".pth")
            and not any(entry.name.startswith(n) for n in leave_out)
            and not entry.name.startswith(("__editable__", "helpers", "llmsys"))
        ):
            (linked / entry.name).symlink_to(entry)
    [venv_site] = (venv / "lib").glob("python*/site-packages")
    (venv_site / "course.pth").write_text(f"{linked}\n")
    return venv / "bin" / "python"


def test_the_students_own_python_runs_their_code(tmp_path):
    python = fake_student_env(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert subprocess.run([str(python), "-c", "import cloudpickle"], env=env, capture_output=True).returncode != 0
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "helpers",
        "yours",
        str(CORPUS / "tests" / "adapters.py"),
        "--topics",
        "rmsnorm",
        "--python",
        str(python),
        "--no-timing",
        "--out",
        str(out),
        "--results",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    from helpers.results import load_results

    saved = load_results(out / "yours_checks.jsonl")
    assert saved.provenance["student_python"] == str(python)
    within = [c for c in saved.rows if not c["beyond"]]
    assert {c["status"] for c in within if c["prop"] not in K.NORM_LAYOUTS} <= {PASS, *CANNOT_RUN}
    refused = [c for c in within if c["prop"] in K.NORM_LAYOUTS and c["status"] != PASS]  # the Triton one asserts
    assert all(c["status"] == SKIPPED and "a clear refusal" in c["detail"] for c in refused), refused
    assert "your code ran with" in (out / "yours.html").read_text()


def test_an_import_that_fails_names_the_one_command_that_fixes_it(tmp_path, monkeypatch):
    from helpers.course.yours.adapters import AdaptersError, load

    monkeypatch.setattr(sys, "path", list(sys.path))  # loading puts the assignment's folders on this process's path
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "cs336-systems"\nversion = "1.0.4"\n')
    (tmp_path / "tests").mkdir()
    adapters = tmp_path / "tests" / "adapters.py"
    adapters.write_text("import some_missing_package_xyz\n")
    with pytest.raises(
        AdaptersError,
        match=r"No module named 'some_missing_package_xyz'.*To fix: .* -m pip install "
        r"some_missing_package_xyz",
    ):
        load(adapters)
    adapters.write_text("import cs336_alignment\n")  # a course package this process has not imported
    with pytest.raises(AdaptersError, match=r"To fix: cd .* && uv sync, then run with --python .*\.venv/bin/python"):
        load(adapters)
    adapters.write_text("import importlib.metadata\nVERSION = importlib.metadata.version('cs336-systems')\n")
    assert load(adapters).VERSION == "1.0.4"  # the metadata of a package that is not installed, made visible


def subfolder_repository(tmp_path: Path, adapters: str, git: bool = True) -> Path:
    """A repository in the 2024 layout: the assignment in a subfolder with tests/ (pytest runs from the repository's
    root), cs336-basics and a folder of the student's own beside it, and `adapters` as
    cs336-systems/tests/adapters.py; without .git when `git` is False (an unpacked archive)."""
    repo = tmp_path / "repo"
    (repo / "cs336-basics" / "cs336_basics").mkdir(parents=True)
    if git:
        (repo / ".git").mkdir()
    (repo / "cs336-basics" / "cs336_basics" / "__init__.py").write_text("")
    (repo / "libs").mkdir()
    (repo / "libs" / "timing_utils.py").write_text("")
    assignment = repo / "cs336-systems"
    (assignment / "cs336_systems").mkdir(parents=True)
    (assignment / "setup.py").write_text("from setuptools import setup\nsetup(name='cs336-systems')\n")
    (assignment / "cs336_systems" / "norms.py").write_text((CORPUS / "cs336_systems/norms/rmsnorm.py").read_text())
    (assignment / "tests").mkdir()
    (assignment / "tests" / "adapters.py").write_text(adapters)
    return assignment / "tests" / "adapters.py"


ROOT_RELATIVE = """import os, sys
sys.path.insert(0, './cs336-systems/cs336_systems')  # relative to the repository root, where pytest runs
sys.path.append(os.path.abspath('libs'))
import cs336_basics  # in the repository's root: the course ships it there
import timing_utils
from norms import RMSNormAutograd

def get_rmsnorm_autograd_function_pytorch():
    return RMSNormAutograd
"""


def forget_modules_under(folder: Path) -> None:
    """Drop the modules imported from `folder` (a test's student repository) from this process."""
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(folder)):
            del sys.modules[name]


@pytest.fixture
def forget_imports(tmp_path):
    """What a test imports from its tmp_path is forgotten afterwards (another test's repository reuses the names)."""
    yield
    forget_modules_under(tmp_path)


@pytest.mark.parametrize("git", [True, False], ids=["git", "unpacked"])
def test_a_path_relative_to_the_repository_root_is_found_when_tests_sit_in_a_subfolder(
    tmp_path, monkeypatch, forget_imports, git
):
    """The 2024 layout: sys.path entries relative to the repository root (relative, or made absolute from the working
    directory) resolve as under pytest, here and in the launched checks; a module that no entry reaches is named as
    the student's own, never as a package to pip install. An unpacked archive (no .git) too, in this process."""
    from helpers.course.yours.adapters import AdaptersError, load

    clean = list(sys.path)
    monkeypatch.setattr(sys, "path", list(clean))  # loading puts the assignment's folders on this process's path
    adapters = subfolder_repository(tmp_path, ROOT_RELATIVE, git)
    repo = tmp_path / "repo"
    assert load(adapters).get_rmsnorm_autograd_function_pytorch().__name__ == "RMSNormAutograd"
    assert str(repo / "cs336-systems" / "cs336_systems") in sys.path and not any(p.startswith("./") for p in sys.path)
    results = run(adapters, ["rmsnorm"], CHECKS_ONLY, progress=False) if git else []
    checks = [c for c in within(results) if c.impl == "pytorch"]
    assert not git or checks and all(c.status == PASS for c in checks), [(c.prop, c.status, c.detail) for c in checks]
    adapters.write_text(ROOT_RELATIVE.replace("./cs336-systems/cs336_systems", "./cs336_systems/elsewhere"))
    sys.path[:] = clean
    forget_modules_under(tmp_path)
    with pytest.raises(
        AdaptersError, match=r"No module named 'norms'.*norms is your own code, in .*cs336_systems"
    ) as e:
        load(adapters)
    assert "pip" not in str(e.value)


def test_a_crash_beyond_the_handout_keeps_the_contract_and_leaves_no_temporary_folder(tmp_path):
    """The whole command on an RMSNorm that is right in fp32 and kills its process on a 16-bit input (as a Triton
    kernel reading outside its tensors does in the interpreter), with a package whose metadata is made visible: the
    checks within the handout pass in a process of their own, the crash is one row beyond the handout, the exit status
    is 0, and the command's temporary folder is empty afterwards."""
    tmp, out = tmp_path / "tmp", tmp_path / "out"
    tmp.mkdir()
    crash = tmp_path / "crash.py"
    crash.write_text(
        f"import sys\nsys.path.insert(0, {str(CORPUS)!r})\n"
        "import importlib.metadata, os, signal\nimport torch\n"
        "from cs336_systems.norms.rmsnorm import RMSNormAutograd\n"
        "assert importlib.metadata.version('cs336-systems')\n"
        "class CrashOn16Bit(RMSNormAutograd):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x, g):\n"
        "        if x.dtype != torch.float32:\n"
        "            os.kill(os.getpid(), signal.SIGSEGV)\n"
        "        return RMSNormAutograd.forward(ctx, x, g)\n"
        "def get_rmsnorm_autograd_function_pytorch():\n    return CrashOn16Bit\n"
    )
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "cs336-systems"\nversion = "1.0.4"\n')
    cmd = [
        sys.executable,
        "-m",
        "helpers",
        "yours",
        str(crash),
        "--topics",
        "rmsnorm",
        "--no-timing",
        "--out",
        str(out),
    ]
    # inductor's compile cache, which importing torch._dynamo creates (in TMPDIR unless told), is meant to stay: apart
    env = {**os.environ, "TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([*cmd, "--results", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    from helpers.results import load_results

    rows = [r for r in load_results(out / "yours_checks.jsonl").rows if r["impl"] == "pytorch"]
    assert [r["status"] for r in rows if not r["beyond"]] == [PASS] * (len(K.NORM_CONTRACT) + len(K.NORM_LAYOUTS))
    [crashed] = [r for r in rows if r["status"] == ERROR]  # pinned on the probe it died in (kernel_launch)
    assert crashed["beyond"] and "SIGSEGV" in crashed["detail"], crashed
    assert not list(tmp.iterdir()), list(tmp.iterdir())


def test_an_empty_template_says_so_and_does_not_pass():
    from helpers.course.yours.report import NOT_IMPLEMENTED, SKIPPED

    text, ok = summary([{"status": NOT_IMPLEMENTED}, {"status": NOT_IMPLEMENTED}, {"status": SKIPPED}])
    assert not ok and text.startswith("nothing implemented yet")
    text, ok = summary([{"status": PASS}, {"status": "fail", "beyond": True}, {"status": NEEDS_GPU}])
    assert ok and text.startswith("2 checks of what you implemented: 1 pass, 0 fail, 1 need a GPU")


def test_the_basics_pyproject_points_to_are_the_ones_imported(tmp_path, monkeypatch, forget_imports):
    """The 2025/2026 templates install cs336-basics from [tool.uv.sources] (`path = "./cs336-basics"`, "change this
    path to your assignment1-basics repo"): a student who pointed it at their own folder imports theirs under uv, so
    here too, ahead of the shipped folder, and never a red line telling them to edit sys.path."""
    from helpers.course.yours.adapters import load

    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [n for n in sys.modules if n.split(".")[0] == "cs336_basics"]:  # an earlier test's, restored after
        monkeypatch.delitem(sys.modules, name)
    root = tmp_path / "assignment"
    for folder, who in (("cs336-basics", "shipped"), ("cs336_basics_mine", "mine")):
        (root / folder / "cs336_basics").mkdir(parents=True)
        (root / folder / "cs336_basics" / "__init__.py").write_text(f"WHO = {who!r}\n")
        (root / folder / "pyproject.toml").write_text('[project]\nname = "cs336-basics"\nversion = "1.0"\n')
    (root / "pyproject.toml").write_text(
        '[project]\nname = "cs336-systems"\nversion = "26.1.1"\n\n[tool.uv.sources]\n'
        'cs336-basics = { path = "./cs336_basics_mine", editable = true } # Change this path to your own\n'
    )
    (root / "tests").mkdir()
    (root / "tests" / "adapters.py").write_text("import cs336_basics\nWHO = cs336_basics.WHO\n")
    assert load(root / "tests" / "adapters.py").WHO == "mine"


TWIN_FAILS = [  # (mutant, implementation, the layout property whose bug hides behind another one)
    pytest.param(
        "rmsnorm_triton_no_eps_dy_row_stride", "triton", next(iter(K.NORM_LAYOUTS)), marks=needs_block_pointers
    ),
    ("attention_unscaled_contiguous_strides", "pytorch", list(ATTN_LAYOUTS)[1]),
]


@pytest.mark.parametrize("mutant, impl, layout", TWIN_FAILS, ids=["rmsnorm_dy_row_stride", "attention_strides"])
def test_a_layout_bug_is_found_where_the_contiguous_twin_fails_too(mutant, impl, layout):
    """A layout read wrong is a second bug, not the first one again: where the contiguous twin fails, the layout case
    is judged against the implementation's own outputs on the same values laid out contiguously (go-akshit's 2024
    Triton RMSNorm has no eps and steps dy by x's row stride)."""
    topic = mutant.split("_")[0]
    checks = {c.prop: c for c in judged(CORPUS / "mutants" / f"{mutant}.py", topic, impl) if c.impl == impl}
    assert checks[layout].status in FAILED and "laid out contiguously" in checks[layout].detail, checks[layout]
    assert any(c.status in FAILED for p, c in checks.items() if p != layout)  # the first bug, in the rules above
    layouts = K.NORM_LAYOUTS if topic == "rmsnorm" else ATTN_LAYOUTS
    for other in set(layouts) - {layout}:  # the layouts it reads right are not failed
        assert checks[other].status not in FAILED, checks[other]


def test_a_wrong_implementation_that_reads_every_layout_right_passes_no_layout_rule_and_says_so():
    """eps missing in PyTorch ops (layout-blind): its layout cases give its own contiguous outputs, so they are not
    failed; they are not judged against float64 either (its contiguous twin fails), and the detail says both."""
    checks = [
        c for c in judged(CORPUS / "mutants" / "rmsnorm_no_eps.py", "rmsnorm", "pytorch") if c.prop in K.NORM_LAYOUTS
    ]
    assert checks and all(c.status not in FAILED for c in checks), checks
    assert all("gives the same outputs" in c.detail for c in checks), [c.detail for c in checks]
