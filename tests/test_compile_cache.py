"""torch.compile's on-disk cache is kept apart per CPU capability by `import helpers` (issue 34)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import compile_cache_dir
from helpers.env import cpu_flags

ROOT = Path(__file__).resolve().parent.parent
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}  # the laptop emulation's switches
AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}  # what ATen's and inductor's AVX-512 code paths need


def test_each_setting_gets_its_own_folder_and_a_native_run_keeps_the_default():
    assert compile_cache_dir({}) is None  # inductor's default, untouched
    assert compile_cache_dir({"TORCHINDUCTOR_CACHE_DIR": "/c"}) == "/c"
    avx2 = compile_cache_dir({"TORCHINDUCTOR_CACHE_DIR": "/c", **AVX2})
    aten_only = compile_cache_dir({"TORCHINDUCTOR_CACHE_DIR": "/c", "ATEN_CPU_CAPABILITY": "avx2"})
    assert avx2 == "/c/cpu-capability-aten_avx2-onednn_avx2"  # nested in the folder you chose, named for the setting
    assert len({avx2, aten_only, "/c"}) == 3

    default_cache_dir = pytest.importorskip("torch._inductor.runtime.cache_dir_utils").default_cache_dir
    assert compile_cache_dir(AVX2) == os.path.join(default_cache_dir(), "cpu-capability-aten_avx2-onednn_avx2")


def test_a_child_process_resolves_the_same_folder_or_its_own():
    avx2 = compile_cache_dir({"TORCHINDUCTOR_CACHE_DIR": "/c", **AVX2})
    assert compile_cache_dir({"TORCHINDUCTOR_CACHE_DIR": avx2, **AVX2}) == avx2  # a rank importing helpers again
    assert compile_cache_dir({"TORCHINDUCTOR_CACHE_DIR": avx2}) == "/c"  # a native child of a switched parent


def _compile_tiny_rmsnorm(cache: Path, switches: dict) -> subprocess.CompletedProcess:
    """A fresh process: import helpers, compile and run an RMSNorm-like function (the shape of notebook 02's crash)."""
    code = (
        "import helpers, os, torch\n"
        "f = torch.compile(lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))\n"
        "f(torch.randn(8, 64))\n"
        "print(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
    )
    clean = {k: v for k, v in os.environ.items() if k not in AVX2}
    env = {**clean, **switches, "TORCHINDUCTOR_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # one kernel: no pool of compile workers to start (2-3 s a run)
    # the vector ISAs taken from the CPU's flags, not proven by compiling a probe for each (5.6 s of a cold cache's
    # 10): the same kernel, and the heap corruption still shows in one shared folder (checked with the repro's order)
    env["TORCHINDUCTOR_VEC_ISA_OK"] = "1"
    # no precompiled header (inductor's are machine-wide, one per set of flags): this one kernel then compiles in 2 s
    # where the native flags' header took 5 s more; in both runs, so both key their kernel alike, and with a shared
    # folder the native run still dies (checked with this code, 2026-11-29)
    env["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] = "0"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.ci  # make test-ci (CI, after make test): two compiles, 18 s of one worker
def test_avx2_then_native_through_import_helpers(tmp_path):
    """The repro's order (../shared/repro/inductor_isa_cache.py): without the separate folders the native run aborts
    with heap corruption on an AVX-512 machine (torch 2.13). On a CPU without AVX-512 the native run compiles for
    AVX2 too: nothing can collide and both runs pass either way, so the two compiles (20 s) are not run
    there (the folders are the tests above')."""
    if not cpu_flags() >= AVX512:
        pytest.skip("no AVX-512 on this CPU: the native run would compile for AVX2 as well, nothing to collide")
    avx2 = _compile_tiny_rmsnorm(tmp_path, AVX2)
    assert avx2.returncode == 0, avx2.stderr[-2000:]
    native = _compile_tiny_rmsnorm(tmp_path, {})
    assert native.returncode == 0, (
        f"the native run after the AVX2 one exited {native.returncode}: {native.stderr[-2000:]}"
    )
    assert avx2.stdout.split()[-1] == str(tmp_path / "cpu-capability-aten_avx2-onednn_avx2")
    assert native.stdout.split()[-1] == str(tmp_path)


def test_launched_ranks_use_the_folder_of_the_launcher(tmp_path):
    code = (
        "import helpers, os\n"
        "from helpers.launch import launch\n"
        "print(launch(os.getenv, 2, 'TORCHINDUCTOR_CACHE_DIR', backend='gloo', device='cpu'))\n"
    )
    env = {**os.environ, **AVX2, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == str([str(tmp_path / "cpu-capability-aten_avx2-onednn_avx2")] * 2)
