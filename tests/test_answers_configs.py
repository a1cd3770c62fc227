"""Issue 41, "answered for another configuration": each answer names the configuration that ran against the one its
handout asks, from the saved rows, and is partial (saying what is missing) where they differ (notebooks 03, 04, 06)."""

from pathlib import Path

import answers_data as D
import pytest

from helpers.course import answers as A
from helpers.experiments import attention as XA
from helpers.experiments import gpu_plans as G
from helpers.experiments.attention_sections import naive_flops

HANDOUT = [(d, T) for d in (16, 32, 64, 128) for T in (256, 1024, 4096, 8192, 16384)]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """Every result the answers read (answers_data.synthetic_folder: built once per session)."""
    return D.synthetic_folder(tmp_path_factory)


# ---- pytorch_attention: batch 8, d 16-128, T 256-16,384; the smallest configuration that runs out of memory ---------


def test_the_cpu_profile_runs_the_handouts_batch_and_head_dims_within_its_flop_cap():
    run, left_out = XA.naive_shapes(XA.PROFILES["cpu"])
    assert run == [(8, 1, 256, 16), (8, 1, 1024, 16), (8, 1, 256, 32), (8, 1, 256, 64), (8, 1, 256, 128)]
    assert len(left_out) == 15 and all(naive_flops(s) > 2e9 for s in left_out)
    gpu, none = XA.naive_shapes(XA.PROFILES["gpu"])
    assert sorted((d, T) for _, _, T, d in gpu) == sorted(HANDOUT) and not none and gpu[0][0] == 8
    assert XA.PROFILES["cpu"]["compile_shape"][0] == 8  # torch_compile(a): "the same configuration"


def test_pytorch_attention_a_names_what_ran_and_what_the_cap_left_out(synthetic):
    got = A.answer(A.BY_NUMBER["pytorch_attention(a)"], A.Saved(synthetic, "cpu"))
    assert got.text.startswith(
        "Ran 5 of the handout's 20 configurations (batch 8, one head, fp32, not causal): every d at T 256; d 16 at "
        "T 1,024."
    ), got.text
    assert "median of 6 timed passes after 2 warm-up (the handout times 100)" in got.text
    assert got.status == "partial" and got.missing.startswith(
        "the handout's other 15 configurations (d 32, 64, 128 at T 1,024; every d at T 4,096; every d at T 8,192; "
        "every d at T 16,384): the cpu profile times only the configurations of at most 2 GFLOP"
    ), got.missing


def _gpu_run(tmp_path, oom, device_bytes=8e9):
    """The whole handout grid saved as a GPU run would, out of memory at the (d, T) in `oom`."""
    extra = dict(D.NAIVE_CPU, device_type="cuda", device="NVIDIA H100 80GB HBM3", device_bytes=device_bytes)
    extra["grid"] = dict(extra["grid"], max_flops=None)
    mem = [
        {"batch": 8, "T": T, "d": d, "oom": False, "saved_bytes": b, "formula_bytes": b, "score_matrix_bytes": 1}
        for d, T in HANDOUT
        if (d, T) not in oom
        for b in [8 * T * T * 4 + 8 * T * d * 4]
    ]
    runs = {"06_naive_attention": (D.naive_rows(HANDOUT, oom=oom), extra), "06_naive_memory": (mem, extra)}
    return A.Saved(D.write(tmp_path, runs, profile="gpu"), "gpu")


def test_on_a_gpu_the_whole_grid_is_measured_and_the_smallest_oom_is_the_one_observed(tmp_path):
    saved = _gpu_run(tmp_path, oom={(16, 16384), (128, 8192), (128, 16384)})
    a = A.answer(A.BY_NUMBER["pytorch_attention(a)"], saved)
    assert a.status == "measured" and not a.missing and a.text.startswith("Ran 20 of the handout's 20"), a.text
    assert sum(r["forward+backward"] == "out of memory" for r in a.table) == 3
    b = A.answer(A.BY_NUMBER["pytorch_attention(b)"], saved)
    # (128, 8192) needs 4·8·8192²·4 B + 7·8·8192·128·4 B = 8.8 GB at the peak; (16, 16384) needs 34.4 GB
    assert b.status == "measured" and b.text.startswith(
        "The smallest configuration that ran out of memory on this NVIDIA H100 80GB HBM3: batch 8, T 8,192, d 128"
    ), b.text
    assert "more than this NVIDIA H100 80GB HBM3's 7.45 GiB" in b.text


def test_a_gpu_where_nothing_ran_out_counts_the_first_past_the_grid(tmp_path):
    b = A.answer(A.BY_NUMBER["pytorch_attention(b)"], _gpu_run(tmp_path, oom=set(), device_bytes=80e9))
    assert b.status == "measured" and "Nothing of the handout's grid ran out of memory" in b.text
    assert "past the grid: batch 8, T 32,768, d 16" in b.text, b.text


def test_pytorch_attention_b_on_a_cpu_counts_the_first_oom_against_the_cards(synthetic):
    got = A.answer(A.BY_NUMBER["pytorch_attention(b)"], A.Saved(synthetic, "cpu"))
    assert got.status == "partial" and "observed on a GPU" in got.missing
    # batch 8, T 32,768, d 16: 4 score matrices of 8·32768²·4 B = 32 GiB each, 7 (B, T, d) of 16 MiB: 128.1 GiB
    assert "the first to run out is batch 8, T 32,768, d 16" in got.text, got.text
    assert "128 GiB (gpu_plans.naive_pass_bytes" in got.text and "more than the H100's 74.5 GiB" in got.text
    assert "peaks at 32.4 GiB" in got.text  # the grid's largest, batch 8, T 16,384, d 128, fits the H100
    cards = {r["GPU"]: r["first out of memory (fp32)"] for r in got.table}
    assert cards == {
        "H100 80 GB": "batch 8, T 32,768, d 16",
        "H200 141 GB": "batch 8, T 65,536, d 16",
        "B200 ~180 GB": "batch 8, T 65,536, d 16",
    }


def test_the_smallest_oom_is_the_least_peak_above_the_memory():
    dims, lens = (16, 32, 64, 128), (256, 1024, 4096, 8192, 16384)
    assert G.smallest_naive_oom(8, dims, lens, 80e9) == (8, 1, 32768, 16)  # the grid fits: past it
    assert G.smallest_naive_oom(8, dims, lens, 24e9) == (8, 1, 16384, 16)
    assert G.smallest_naive_oom(8, dims, lens, 1e9) == (8, 1, 4096, 16)  # 2.1 GB, where T 1,024 needs 0.15 GB
    for device_bytes in (1e9, 24e9):
        shape = G.smallest_naive_oom(8, dims, lens, device_bytes)
        over = [G.naive_pass_bytes((8, 1, T, d)) for d in dims for T in lens]
        assert G.naive_pass_bytes(shape) == min(b for b in over if b > device_bytes)
    with pytest.raises(ValueError, match="finite"):
        G.smallest_naive_oom(8, dims, lens, float("inf"))
