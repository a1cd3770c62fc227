"""RMSNorm kernels at any width (wide rows loop over column blocks) and every kernel compiled for sm_80/sm_90a."""

import os
import re
import subprocess
import sys

import pytest
import torch

import helpers  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before triton is imported)
from helpers import rmsnorm as R

triton = pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(n_rows, H, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_rows, H, generator=gen).to(DEVICE)  # (N, H)
    g = (1 + 0.5 * torch.randn(H, generator=gen)).to(DEVICE)  # (H,)
    dy = torch.randn(n_rows, H, generator=gen).to(DEVICE)  # (N, H)
    return x, g, dy


@pytest.mark.parametrize("H, max_block", [(37, 16), (48, 16), (16, 16), (5, 4)])
def test_wide_row_loops_match_the_spec(H, max_block):
    """Rows wider than one block (forced with a small max_block) give the spec's y, dx and dg."""
    x, g, dy = _inputs(6, H)
    fwd, bwd = R.launch_config(H, "forward", max_block), R.launch_config(H, "backward", max_block)
    assert fwd.chunks == bwd.chunks == -(-H // max_block)
    y, rrms = R.rmsnorm_triton_forward(x, g, max_block=max_block)
    dx, dg = R.rmsnorm_triton_backward(dy, x, g, rrms, max_block=max_block)
    torch.testing.assert_close(y, R.rmsnorm_reference(x, g), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx, R.rmsnorm_backward_x(dy, x, g), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dg, R.rmsnorm_backward_g(dy, x, g), rtol=1e-4, atol=1e-5)


def test_a_row_wider_than_the_old_limit_goes_through_the_function():
    """70,000 columns (the kernels once stopped at 65,536): the default launch configuration loops over blocks."""
    x, g, dy = _inputs(2, 70_000)
    assert R.launch_config(70_000, "forward").chunks > 1 and R.launch_config(70_000, "backward").chunks > 1
    xr, gr = x.clone().requires_grad_(), g.clone().requires_grad_()
    R.RMSNormTritonFunction.apply(xr, gr).backward(dy)
    torch.testing.assert_close(xr.grad, R.rmsnorm_backward_x(dy, x, g), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gr.grad, R.rmsnorm_backward_g(dy, x, g), rtol=1e-4, atol=1e-5)


def test_launch_configs_cover_every_width():
    for H in (1, 7, 4096, 4097, 16384, 16385, 10**6):
        for kind in ("forward", "backward"):
            cfg = R.launch_config(H, kind)
            assert cfg.block_h * cfg.chunks >= H > cfg.block_h * (cfg.chunks - 1)
            assert cfg.block_h <= R.MAX_BLOCK[kind]


@pytest.mark.ci  # make test-ci (CI, after make test): 15 s of one worker
def test_kernels_compile_for_sm80_and_sm90a_without_spills():
    """`python -m helpers kernels --quick` (no GPU needed): every configuration compiles, none spills. Under the newest
    Triton (make test-newest-triton) it compiles for the course's H100 alone (HELPERS_KERNEL_ARCHS): sm_80's
    registers and spills are the course's Triton's to answer for."""
    archs = os.environ.get("HELPERS_KERNEL_ARCHS", "sm_80 sm_90a").split()
    run = subprocess.run(
        [sys.executable, "-m", "helpers", "kernels", "--quick", *(f"--arch={a}" for a in archs)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    last = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    match = re.fullmatch(rf"(\d+) configurations compiled for {', '.join(archs)}; (\d+) with spills", last)
    assert match, last
    assert int(match.group(1)) >= 4 * len(archs) and int(match.group(2)) == 0 and run.returncode == 0, run.stdout


if triton is not None:
    import triton.language as tl
    from triton.language import arange, full  # by name, as some students write them

    @triton.jit
    def _count_to(out_ptr, n):
        """out[pid] = n, counted one by one in a loop over a kernel argument (the bound is a scalar tensor in the
        interpreter)."""
        acc = 0
        for _ in range(0, n):
            acc += 1
        tl.store(out_ptr + tl.program_id(0), acc)

    @triton.jit
    def _by_name(out_ptr, N: tl.constexpr):
        """out[:N] = 3, through triton.language functions imported by name."""
        tl.store(out_ptr + arange(0, N), full((N,), 3, tl.int32))

    @triton.jit
    def _flagged(out_ptr, flag):
        """out[pid] = 2 where `flag` (a runtime argument, not constexpr) is true, else 1."""
        value = 1
        if flag:
            value = 2
        tl.store(out_ptr + tl.program_id(0), value)


def test_a_loop_over_a_kernel_argument_runs_in_this_triton():
    """Issue 38: Triton 3.6's interpreter (the course's pin) fails every range() over a kernel argument under NumPy
    2.4 ('only 0-dimensional arrays can be converted to Python scalars'); helpers.env.fix_triton_interpreter gives
    it the newer Tritons' __index__. Runs under both Tritons `make test` uses."""
    out = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    _count_to[(3,)](out, 5)
    assert out.tolist() == [5, 5, 5]


def test_a_grid_given_as_a_list_runs_as_on_a_gpu():
    """The compiled launcher takes `lambda meta: [n]` (a student's 2024 RMSNorm does); Triton's interpreter (3.6 to
    3.9) failed it with "can only concatenate list (not "tuple") to list", a red line over working code.
    helpers.env.fix_triton_interpreter makes the interpreter take it. Runs under both Tritons `make test` uses."""
    out = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    _count_to[lambda meta: [2]](out, 4)
    _count_to[[2]](out, 3)
    assert out.tolist() == [3, 3]


def test_a_bool_given_for_a_runtime_argument_runs_as_on_a_gpu():
    """A student's `causal` passed as a plain argument (not constexpr) is an int1 on a GPU; Triton 3.6's interpreter
    failed it ("numpy data itemsize (32 bits) exceeds dtype primitive_bitwidth (1 bits)"), six red lines over a 2025
    repository's FlashAttention (2026-11-29); helpers.env.fix_triton_interpreter converts it as 3.7 and newer do."""
    out = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    _flagged[(1,)](out, True)
    _flagged[(1,)](out[1:], False)
    assert out.tolist() == [2, 1]


def test_triton_functions_imported_by_name_run_as_on_a_gpu():
    """`from triton.language import make_block_ptr` (a 2025 repository's FlashAttention, 2026-11-29): the compiler
    resolves the name as tl's, the interpreter (3.6 to 3.9) raised "Did you forget to add @triton.jit ?" unless
    helpers.env.fix_triton_interpreter patches it as tl's own, and puts the original back after the launch."""
    out = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    _by_name[(1,)](out, N=4)
    assert out.tolist() == [3, 3, 3, 3]
    assert arange is tl.arange and full is tl.full  # both put back


def test_each_kernel_test_run_imports_the_triton_it_names(monkeypatch):
    """make test-newest-triton (CI's run after make test) puts NEWEST_TRITON first on PYTHONPATH and names it in
    EXPECT_TRITON; the default environment has the course's pin. A run that silently imported the other one would test
    nothing new."""
    import os

    expected = os.environ.get("EXPECT_TRITON")
    if expected is None:
        pytest.skip("EXPECT_TRITON is set by make test-newest-triton's run under another Triton")
    assert triton.__version__ == expected
