"""Notebook 06's experiment functions on CPU: memory vs closed forms, FLOP counts and bounds, the algorithm's steps,
the kernel checker, the model's attention modes, the bench command, and bad input."""

import math

import pandas as pd
import pytest
import torch

import helpers  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before triton is imported)
from helpers import attention as A
from helpers import env
from helpers.experiments import attention as X

DEVICE = env.device_type()  # Triton's inputs on the machine's device: compiled Triton refuses host tensors


@pytest.mark.parametrize("impl", ["naive", "flash_pytorch"])
@pytest.mark.parametrize("causal", [False, True])
def test_saved_memory_equals_the_closed_form_byte_for_byte(impl, causal):
    row = X.saved_memory(impl, (2, 3, 48, 16), torch.float32, "cpu", causal)
    assert not row["oom"] and row["saved_bytes"] == row["formula_bytes"] > 0
    assert row["peak_bytes"] >= row["saved_bytes"]


def test_naive_memory_grows_as_t_squared_and_flash_as_t():
    by = {
        (impl, T): X.saved_memory(impl, (1, 1, T, 16))["saved_bytes"]
        for impl in ("naive", "flash_pytorch")
        for T in (64, 128)
    }
    assert by[("flash_pytorch", 128)] == 2 * by[("flash_pytorch", 64)]
    naive_p = A.score_matrix_bytes(1, 128, 128, torch.float32)
    assert by[("naive", 128)] - naive_p == 2 * (by[("naive", 64)] - A.score_matrix_bytes(1, 64, 64, torch.float32))


def test_bench_rows_count_causal_flops_and_respect_the_bounds():
    rows = X.bench_attention("naive", (1, 2, 32, 16), torch.float32, "cpu", True, warmup=1, steps=2)
    assert [r["pass"] for r in rows] == list(X.PASSES) and not any(r["oom"] for r in rows)
    fwd = A.attention_flops(2, 32, 32, 16, True)
    assert [r["flops"] for r in rows] == [fwd, fwd * 10 // 4, fwd * 14 // 4]
    assert fwd == 2 * 32 * 33 // 2 * 16 * 4
    timed = [dict(r, min_s={"fwd": 1.0, "bwd": 2.0, "fwd+bwd": 3.0}[r["pass"]]) for r in rows]  # no timing noise
    assert X.check_physical_bounds(timed, "cpu") == 0  # no peak known for a CPU; the fwd <= fwd+bwd check ran
    with pytest.raises(AssertionError, match="forward slower"):
        X.check_physical_bounds([dict(r, min_s=5.0 if r["pass"] == "fwd" else 1.0) for r in rows], "cpu")
    bad = [dict(rows[0], TFLOPs=2000.0, dtype="bfloat16")]
    with pytest.raises(AssertionError, match="peak"):
        X.check_physical_bounds(bad, "NVIDIA H100 80GB HBM3")


def test_online_softmax_and_backward_from_lse_match_naive_attention():
    s = torch.randn(3, 50, dtype=torch.float64) * 20
    m, lsum, lse = X.online_softmax(s, block=7)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), **X.TOL[torch.float64])
    q, k, v, do = X.inputs((1, 2, 33, 8), torch.float64)
    for causal in (False, True):
        o, dq, dk, dv = X.naive_grads(q, k, v, do, causal)
        lse = A.attention_lse(q.detach(), k.detach(), causal)
        got = X.backward_from_lse(q.detach(), k.detach(), v.detach(), o, lse, do, causal)
        for a, b in zip(got, (dq, dk, dv), strict=True):
            torch.testing.assert_close(a, b, **X.TOL[torch.float64])


@pytest.mark.parametrize("name", list(X.KERNELS))
def test_each_kernel_matches_its_spec(name):
    pytest.importorskip("triton")
    assert X.check_kernel(name, (1, 2, 40, 16), torch.float32, DEVICE, is_causal=True) < 1e-4


def test_check_function_catches_a_wrong_attention():
    assert X.check_function(A.FlashAttentionPyTorch.apply, (1, 2, 20, 8), torch.float64, "cpu", True) < 1e-10
    with pytest.raises(AssertionError):
        X.check_function(lambda q, k, v, c: A.naive_attention(q, k, v, not c), (1, 2, 20, 8), torch.float64)


def test_model_attention_modes_agree_and_compare_interleaves():
    X.check_model_outputs(X.tiny_model_outputs(["naive", "sdpa", "flash_pytorch"]))
    cmp = X.compare_models(X.TINY, ["naive", "sdpa"], batch_size=2, warmup=1, steps=3)
    assert set(cmp.samples) == {"naive", "sdpa"} and all(len(s) == 3 for s in cmp.samples.values())


def test_bench_main_on_cpu_saves_rows_with_provenance(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(X, "save_results", lambda df, name, profile: (tmp_path / f"{name}.jsonl", df)[0])
    assert (
        X.bench_main(
            [
                "--seq",
                "32",
                "--heads",
                "1",
                "--head-dim",
                "16",
                "--warmup",
                "0",
                "--steps",
                "2",
                "--impls",
                "sdpa",
                "naive",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "attention_bench.jsonl" in out and "naive" in out and ("no CUDA" in out) != torch.cuda.is_available()


def test_leaderboard_rows_report_tflops():
    _, rows = X.leaderboard_comparison(
        ("sdpa", "naive"), "cpu", warmup=0, steps=2, shape=(1, 1, 32, 16), dtype=torch.float32
    )
    assert [r["impl"] for r in rows] == ["sdpa", "naive"] and all(r["TFLOPs"] > 0 for r in rows)
    assert math.isclose(rows[0]["ratio"], 1.0)


def test_bad_input_says_what_to_do():
    with pytest.raises(ValueError, match="batch, heads, T, d"):
        X.inputs((4, 16))
    with pytest.raises(ValueError, match="unknown attention"):
        X.attention_fn("flash3", torch.zeros(1), False)
    with pytest.raises(ValueError, match="unknown kernel"):
        X.run_kernel("fused", *X.inputs((1, 1, 16, 16)))
    with pytest.raises(ValueError, match="no closed form"):
        X.saved_bytes_formula("sdpa", (1, 1, 16, 16))
    with pytest.raises(SystemExit):
        X.bench_main(["--seq", "0"])
    assert isinstance(
        pd.DataFrame(X.sweep(["sdpa"], [(1, 1, 16, 16)], [torch.float32], warmup=0, steps=1)), pd.DataFrame
    )


def test_the_pytorch_tiles_are_timed_for_at_most_tiled_steps():
    """Issue 31: notebook 06 timed the eager tiles 100 steps at T = 4096 on a GPU (5-8 minutes)."""
    rows = pd.DataFrame(
        X.sweep(["flash_pytorch", "sdpa"], [(1, 1, 32, 16)], [torch.float32], warmup=0, steps=X.TILED_STEPS + 2)
    )
    steps = rows.groupby("impl")["steps"].max()
    assert steps["flash_pytorch"] == X.TILED_STEPS and steps["sdpa"] == X.TILED_STEPS + 2
