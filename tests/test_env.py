"""Profiles, machine facts, and the Triton interpreter switch."""

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import env, pins


def test_auto_profile_follows_cuda(monkeypatch):
    monkeypatch.delenv(env.AUTO_PROFILE_VAR, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert env.resolve_profile("auto") == "cpu"
    assert env.resolve_profile("CPU") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert env.resolve_profile("auto") == "gpu"


def test_make_tests_profile_variable_decides_auto_only(monkeypatch):
    """Issue 39 item 2: `make test` on a GPU runs the notebooks at the cpu profile's sizes (HELPERS_PROFILE=cpu); the
    gpu sizes belong to `make writeup PROFILE=gpu` and `make reference`. An explicit PROFILE still wins."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(env.AUTO_PROFILE_VAR, "cpu")
    assert env.resolve_profile("auto") == "cpu" and env.resolve_profile("gpu") == "gpu"
    monkeypatch.setenv(env.AUTO_PROFILE_VAR, "tpu")
    with pytest.raises(ValueError, match="unknown PROFILE"):
        env.resolve_profile("auto")
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert f"{env.AUTO_PROFILE_VAR}=cpu $(PY) -m pytest" in makefile


TORCH_211_CU130 = [
    "filelock",
    'triton==3.6.0; platform_system == "Linux"',
    'nvidia-nccl-cu13==2.28.9; platform_system == "Linux"',
]
TORCH_213_CUDA = ["filelock", 'triton==3.7.1; platform_system == "Linux" and platform_machine == "x86_64"']  # its own
TORCH_NIGHTLY = ["filelock", 'pytorch-triton==3.8.0+gitabc; platform_system == "Linux"']
TORCH_CPU = ["filelock", "sympy>=1.13.3", 'optree>=0.13.0; extra == "optree"']


@pytest.mark.parametrize(
    "requires, installs",
    [(TORCH_211_CU130, None), (TORCH_213_CUDA, None), (TORCH_NIGHTLY, None), (TORCH_CPU, pins.COURSE_TRITON)],
    ids=["cuda 2.11 keeps its 3.6", "cuda 2.13 keeps its own", "nightly keeps pytorch-triton", "cpu build: the pin"],
)
def test_make_setup_keeps_the_triton_torch_requires(requires, installs):
    """Issue 47 item 4: PyPI's CUDA torch requires the one Triton inductor was built for; pinning the course's 3.6
    beside torch 2.13 would make inductor generate code for a Triton it was not built for. The pin is for a torch that
    requires none (a CPU build: the interpreter runs a student's block-pointer kernel)."""
    assert pins.triton_to_install(requires) == installs
    assert pins.triton_to_install(requires + ['triton; extra == "compile"'], "triton==9") == (installs and "triton==9")
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert '$(PY) helpers/pins.py "$(TRITON)"' in makefile  # what make setup asks (torch-free), then installs
    assert not any(line.strip().startswith("$(if $(strip $(TRITON)),$(PY) -m pip") for line in makefile.splitlines())


def test_make_setup_asks_the_pin_of_torchs_metadata_without_importing_torch():
    """make setup runs helpers/pins.py as a script right after torch's install: it reads torch's requirements from
    its metadata and prints the pin, or nothing, without importing torch or the helpers package (2.6 s of setup)."""
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "helpers/pins.py", "triton==9"], cwd=root, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == (pins.triton_to_install(importlib.metadata.requires("torch"), "triton==9") or "")
    imported = {line.split("|")[-1].strip().split(".")[0] for line in run.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "helpers"}, imported & {"torch", "helpers"}


@pytest.mark.parametrize(
    "version, gpu",
    [(dict(cuda=None, hip=None), False), (dict(cuda="13.0", hip=None), True), (dict(cuda=None, hip="7.0"), True)],
    ids=["cpu", "cuda", "rocm"],
)
def test_make_test_asks_torch_for_a_device_only_where_its_build_has_one(version, gpu):
    """make test's HAS_CUDA (the smoke run or not) from helpers/pins.py --cuda: a CPU build answers 0 from its
    version.py without importing torch (1.5 s on make test's critical path); a CUDA or ROCm build imports torch and
    asks torch.cuda, as the Makefile did for every build."""
    assert pins.gpu_build(version) is gpu
    assert "$(PY) helpers/pins.py --cuda" in (Path(__file__).resolve().parents[1] / "Makefile").read_text()


def test_the_cuda_answer_is_torchs_and_a_cpu_build_gives_it_unimported():
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "helpers/pins.py", "--cuda"], cwd=root, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(int(torch.cuda.is_available()))
    imported = {line.split("|")[-1].strip().split(".")[0] for line in run.stderr.splitlines() if "|" in line}
    assert ("torch" in imported) is pins.gpu_build(vars(torch.version)), imported & {"torch"}


def test_the_device_follows_the_machine_not_the_profile(monkeypatch):
    monkeypatch.setenv(env.AUTO_PROFILE_VAR, "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert (env.resolve_profile("auto"), env.device_type()) == ("cpu", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert (env.resolve_profile("auto"), env.device_type()) == ("cpu", "cpu")


def test_bad_profiles_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="unknown PROFILE"):
        env.resolve_profile("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="needs CUDA"):
        env.resolve_profile("gpu")


def test_machine_facts_and_report():
    facts = env.machine_facts()
    assert facts["torch"] == torch.__version__
    assert facts["cpu_count"] >= 1 and facts["gpu_count"] == torch.cuda.device_count()
    keys = [k for k, _ in env.environment_table("cpu")]
    assert {"device", "distributed backends", "triton mode", "profile"} <= set(keys)


def test_import_helpers_turns_on_the_triton_interpreter_without_cuda():
    clean = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "import helpers, os; print(os.environ.get('TRITON_INTERPRET'))"
    out = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ("1" if not torch.cuda.is_available() else "None")


def test_seed_everything_repeats():
    env.seed_everything(3)
    a = torch.rand(4)
    env.seed_everything(3)
    torch.testing.assert_close(a, torch.rand(4))


def test_cpu_flags_is_a_set_of_names():
    flags = env.cpu_flags()
    assert isinstance(flags, set) and all(isinstance(f, str) and " " not in f for f in flags)


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs a Python that is itself a venv (make test's .venv is)")
def test_make_setup_from_a_python_that_is_a_venv_sees_its_torch(tmp_path):
    """Issue 31 item 1: on GPU images torch lives in a venv; `make setup VENV_ARGS=--system-site-packages` from it must
    give .venv that venv's packages, not only the base interpreter's (CPython #95469)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    venv = tmp_path / ".venv"
    subprocess.run(
        [
            "make",
            "-s",
            "-C",
            root,
            f"VENV={venv}",
            f"PYTHON={sys.executable}",
            "VENV_ARGS=--system-site-packages --without-pip",
            f"{venv}/bin/python",
        ],
        check=True,
        timeout=120,
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import torch, sys; print(torch.__file__, sys.prefix)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.split()[1] == str(venv)


def test_share_of_cores_splits_without_overlap_and_covers_every_core():
    """make test's workers (conftest.py): disjoint shares that cover the cores, sizes within one of each other."""
    for n_cores in (1, 2, 3, 16):
        cores = list(range(n_cores))
        for workers in range(1, 5):
            shares = [env.share_of_cores(cores, w, workers) for w in range(workers)]
            if workers <= n_cores:
                assert sorted(c for s in shares for c in s) == cores
                assert max(map(len, shares)) - min(map(len, shares)) <= 1
            else:
                assert all(s == cores for s in shares)  # more workers than cores: each may use them all
    with pytest.raises(ValueError, match="worker 2 of 2"):
        env.share_of_cores([0, 1], 2, 2)


def _setup_commands(tmp_path, *args) -> str:
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        ["make", "-n", "-s", "-C", str(root), f"VENV={tmp_path / '.venv'}", *args, "setup"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def test_setup_installs_with_uv_where_it_can_and_falls_back_to_pip(tmp_path):
    """make setup fetches uv into .venv (a failure there is ignored: offline) and installs the project with it, pip
    when uv is missing or fails; with --system-site-packages only pip (uv would not count a torch seen through
    outer-venv.pth, and would install one)."""
    default = _setup_commands(tmp_path)
    assert "-m pip install --quiet --no-compile uv >/dev/null 2>&1 || true" in default
    uv_line = re.search(r"\{ test -x \S+/bin/uv && .*?uv pip install .*?-e \"\.\[dev\]\" \|\| (.*?); \}", default)
    assert uv_line and "-m pip install" in uv_line.group(1) and '-e ".[dev]"' in uv_line.group(1), default
    outer = _setup_commands(tmp_path, "VENV_ARGS=--system-site-packages")
    assert "pip install --quiet --no-compile uv" not in outer and "-m pip install --quiet --no-compile $(" in outer
