"""Issue 50: the kernels' tile tables and the tune command's grid (CPU: interpreter and compile-only), RMSNorm's
rows-per-step backward, and the attention kernels' FLOP and byte closed forms."""

import helpers  # noqa: F401  (first: sets TRITON_INTERPRET=1 without CUDA before anything imports triton)

# isort: split

from pathlib import Path

import pytest
import torch

from helpers import attention as A
from helpers import rmsnorm as R
from helpers.course import tune as T
from helpers.formulas.attention_cost import achieved, kernel_costs

triton = pytest.importorskip("triton")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's checks run on CPU tensors")


@cpu_only
@pytest.mark.parametrize("index, is_causal", [(0, True), (3, False)])
def test_grid_tiles_match_the_spec_in_the_interpreter(index, is_causal):
    """Two of the grid's tile combinations (128-row programs streaming 32; 64-row ones streaming 16/32) at T = 150
    (a ragged tile, a diagonal crossing a border), bf16, fwd + bwd within 4 eps of fp64 (test_attention's bound)."""
    d, cfg = T.interpreter_subset()[index]
    assert T.check_attention_config(cfg, d, T=150, is_causal=is_causal) <= 1


@cpu_only
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_rmsnorm_backward_takes_several_rows_per_step(rows):
    """ROWS rows per step (a power of two), the last step ragged (11 rows over 4 programs), match the spec."""
    T._check_rmsnorm_layout(R.LaunchConfig(64, 1, 4, rows, 4), H=50)


@cpu_only
def test_rmsnorm_grid_reads_a_row_of_8192_columns_once():
    """At 8192 columns the grid holds one block per row at 32 warps (x and dy read once, no dot pre-pass; 8 fp32
    elements per thread in 64 registers), beside the default two-block loop; it matches the spec in the interpreter."""
    one = [c for c in R.backward_grid(8192) if c.chunks == 1]
    assert [(c.block_h, c.num_warps, c.rows) for c in one] == [(8192, 32, 1)]
    assert R.launch_config(8192, "backward") in R.backward_grid(8192)
    T._check_rmsnorm_layout(one[0], H=8192)


def test_the_plan_times_the_candidates_listed_for_its_architecture():
    """The sweep on sm_80 or sm_90a times (and the estimate counts) exactly the candidates GRID lists for it."""
    for arch in A.tiles.ARCHS:
        planned = [
            (p["dtype"], p["d"], p["kernel"], p["tiles"]) for p in T.attention_plan(arch) if p["what"] == "candidate"
        ]
        listed = [
            (*key, kernel, tiles)
            for key in T.TUNE_SHAPES
            for kernel in A.KERNELS
            for tiles, archs in A.GRID[key][kernel]
            if arch in archs
        ]
        assert planned == listed and len(set(listed)) == len(listed)


def test_tables_cover_every_arch_dtype_and_head_dim():
    """Every (arch, dtype, d) has all three kernels' tiles, own % loop == 0, and each row is one of the grid's
    candidates for its architecture (so `kernels --grid` compiled it)."""
    for arch in A.tiles.ARCHS:
        for dtype in A.TRITON_DTYPES:
            for d in A.HEAD_DIMS:
                cfg = A.tiles_for(d, dtype, arch)
                for kernel in A.KERNELS:
                    t = getattr(cfg, kernel)
                    assert t.own % t.loop == 0 and t.loop >= 16
                    assert (t, arch) in [
                        (c, a) for c, archs in A.GRID[A.tiles.table_key(d, dtype)][kernel] for a in archs
                    ]
    for arch in A.tiles.ARCHS:
        for dtype in (torch.float32, torch.bfloat16):
            for H in T.RMS_WIDTHS:
                assert R.backward_config(H, dtype, arch) in R.backward_grid(H)


def test_the_table_writer_reproduces_the_committed_files(tmp_path):
    """Writing the current rows back gives the committed text (ruff-formatted), so a sweep's diff is its choices."""
    from helpers import rmsnorm_tuned
    from helpers.attention import tuned

    for module, write, key in (
        (tuned, T.write_attention_table, lambda r: ((r[1], r[2]), A.tiles_for(r[2], getattr(torch, r[1]), r[0]))),
        (rmsnorm_tuned, T.write_rmsnorm_table, lambda r: ((r[1], r[2]), R.LaunchConfig(r[3], 1, *r[4:]))),
    ):
        path = tmp_path / Path(module.__file__).name
        path.write_text(Path(module.__file__).read_text())
        for arch in ("sm_80", "sm_90a"):
            write(arch, dict(key(r) for r in getattr(module, "TILES", getattr(module, "BACKWARD", ()))
                             if r[0] == arch), module.SOURCE, path)  # fmt: skip
        assert path.read_text() == Path(module.__file__).read_text()


def test_the_sweep_fits_two_minutes_of_device_time():
    assert max(T.estimate_attention_s(arch) for arch in A.tiles.ARCHS) <= 120 and T.estimate_rmsnorm_s() <= 120


def test_tune_without_a_gpu_says_what_to_run_instead(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from helpers.__main__ import main

    assert main(["tune", "attention"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.ci  # make test-ci (CI, after make test): Triton and ptxas for both GPUs, 4.5 s of one worker
def test_two_grid_configurations_compile_without_spills():
    """Compile-only (no GPU): the grid's largest dK/dV tiles for each architecture (`kernels --grid` does all)."""
    import subprocess
    import sys

    code = (
        "from helpers import kernel_check as K;"
        "cs=[c for c in K.attention_grid_configs([('bfloat16', 64)]) if 'dkdv' in c.label and '128x64' in c.label"
        " and 'causal' in c.label];"
        "rows=K.check(configs=cs); print([(r['arch'], r['registers'], r['spill_bytes']) for r in rows]);"
        "assert rows and all(r['spill_bytes'] == 0 for r in rows)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_compile_env(), timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]


def _compile_env():
    import os

    return {**os.environ, "TRITON_INTERPRET": "0"}


def test_kernel_costs_count_each_kernels_matmuls():
    """Per (query, key) pair the forward does 2 matmuls (4 d FLOPs), dK/dV 4 (8 d), dQ 3 (6 d): 14 d for the split
    backward, where attention_flops' FA-2 accounting (one pass) counts 10 d. Bytes: non-causal dK/dV streams all
    Tq rows of Q, dO (and L, D) per key tile; at one tile per side each tensor is read once."""
    n, T_, d = 3, 256, 64
    c = kernel_costs(n, T_, T_, d, is_causal=False, tiles={"fwd": (256, 64), "dkdv": (256, 64), "dq": (256, 64)})
    fwd_fa2 = A.attention_flops(n, T_, T_, d)
    assert c["fwd"].flops == fwd_fa2 and c["dkdv"].flops + c["dq"].flops == 3.5 * fwd_fa2
    row = d * 2
    assert c["dkdv"].bytes == n * (4 * T_ * row + T_ * (2 * row + 8))  # K, V, dK, dV once; Q, dO, L, D once
    causal = kernel_costs(n, T_, T_, d, is_causal=True, tiles={"dkdv": (64, 16)})
    assert causal["dkdv"].flops == 2 * A.attention_flops(n, T_, T_, d, is_causal=True)  # 8 d per kept pair
    assert causal["dkdv"].flops_executed > causal["dkdv"].flops  # diagonal tiles computed whole
    a = achieved(c["fwd"], 1e-3, "NVIDIA H100 80GB HBM3")
    assert a.tflops == pytest.approx(fwd_fa2 / 1e-3 / 1e12) and 0 < a.fraction_of_peak < 1
    assert achieved(c["fwd"], 1e-3, "a CPU").fraction_of_peak is None
