"""Issue 41, "answered for another configuration": each answer names the configuration that ran against the one its
handout asks, from the saved rows, and is partial (saying what is missing) where they differ (notebooks 03, 04, 06)."""

from pathlib import Path

import answers_data as D
import pytest

from helpers.course import answers as A
from helpers.experiments import attention as XA
from helpers.experiments import collectives as XC
from helpers.experiments import ddp as XD
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
    assert [(r["d"], r["T"]) for r in a.table] == sorted(HANDOUT)  # one row per configuration, in order
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


# ---- torch_compile(b): "the combined forward and backward passes and optimizer steps" --------------------------------


def test_the_compiled_model_is_timed_through_adamws_step(monkeypatch):
    """Notebook 02 §5's loop times a whole training step (forward, backward, AdamW's step) beside forward and
    forward+backward, eager against compiled, and the optimizer does step (torch.compile stood in by the eager model:
    seconds, not tens of seconds)."""
    from helpers.experiments import rmsnorm as XR
    from helpers.experiments import rmsnorm_model
    from helpers.experiments.common import make_optimizer

    steps = []

    def counting(params, name):
        opt = make_optimizer(params, name)
        step = opt.step
        opt.step = lambda *a, **k: (steps.append(name), step(*a, **k))[1]
        return opt

    monkeypatch.setattr(rmsnorm_model.torch, "compile", lambda model: model)
    monkeypatch.setattr(rmsnorm_model, "make_optimizer", counting)
    rows, comp = XR.compare_compiled(XR.TINY, "cpu", batch_size=2, warmup=1, steps=3)
    assert {(r["compiled"], r["pass"]) for r in rows} == {(c, p) for c in (False, True) for p in XR.COMPILE_PASSES}
    assert XR.STEP == "fwd+bwd+opt" and set(steps) == {"adamw"} and len(steps) >= 2 * 3  # both sides, every round
    ratios = XR.ratio_rows({"tiny": comp}, ("size",), passes=XR.COMPILE_PASSES, loop="compile")
    assert {r["pass"] for r in ratios} == set(XR.COMPILE_PASSES)
    assert "fwd+bwd+opt" in XR.compiled_lines({"tiny": comp})


def test_torch_compile_b_answers_the_training_step_and_is_partial_without_it(synthetic, tmp_path):
    got = A.answer(A.BY_NUMBER["torch_compile(b)"], A.Saved(synthetic, "cpu"))  # the 2024 model: partial, named
    assert got.status == "partial" and "The training step (forward, backward and AdamW's step" in got.text, got.text
    assert "Measured on the 2024 edition's model" in got.text and "cs336-basics" in got.missing
    assert [r["comparison"] for r in got.intervals] == [
        "compiled model's forward time over eager model's",
        "compiled model's training step time over eager model's",
    ]
    old = [r for r in D.notebook_02_rows()["rmsnorm_model_ratios"][0] if r["pass"] != "fwd+bwd+opt"]
    D.write(tmp_path, {"rmsnorm_model_ratios": (old, {})})  # a run of notebook 02 from before the step was timed
    got = A.answer(A.BY_NUMBER["torch_compile(b)"], A.Saved(tmp_path, "cpu"))
    assert got.status == "partial" and "AdamW's step" in got.missing and "Forward+backward:" in got.text


# ---- 3.1.1: sizes 1 MB-1 GB (2024 from 512 KB), 2/4/6 processes, gloo+CPU and NCCL+GPU ------------------------------


def _collective_rows(combos, counts, sizes, drop=()):
    """03_collectives all-reduce rows, one per (backend, device) x world size x size, but (n, size) in drop."""
    return [
        {
            "backend": b,
            "device": dev,
            "world_size": n,
            "nodes": 1,
            "op": "all_reduce",
            "size_bytes": size,
            "size": XC.format_size(size),
            "time_s": 1e-4 + size / 1e9,
            "p25_s": 1e-4,
            "p75_s": 2e-4,
            "busbw_GBps": 1.0,
            "wrong": 0,
        }
        for b, dev in combos
        for n in counts
        for size in sizes
        if (n, size) not in drop
    ]


def test_3_1_1_names_the_cut_of_the_handouts_grid(synthetic):
    got = A.answer(A.BY_NUMBER["3.1.1"], A.Saved(synthetic, "cpu"))  # gloo+CPU, 2 and 4 ranks, 8 KiB to 1 MiB
    assert got.text.startswith("Ran gloo+CPU with 2 and 4 ranks at 8 KiB, 64 KiB and 1 MiB."), got.text
    assert got.status == "partial", got
    for part in (
        "gloo+CPU with 6 ranks",
        "gloo+CPU at 512 KiB, 10 MiB, 50 MiB, 100 MiB, 500 MiB and 1 GiB (2 and 4 ranks)",
        "NCCL+GPU, which needs one GPU per rank",
        "2025 and 2026 ask 1 MB, 10 MB, 100 MB and 1 GB",
    ):
        assert part in got.missing, (part, got.missing)


def test_3_1_1_on_the_whole_grid_is_measured_and_a_size_one_count_lacks_is_named(tmp_path):
    combos, counts = [("gloo", "cpu"), ("nccl", "cuda")], (2, 4, 6)
    rows = _collective_rows(combos, counts, XC.SEED_SIZES)
    D.write(tmp_path, {"03_collectives": (rows, dict(cpu_count=16, gpu_count=8))}, profile="gpu")
    got = A.answer(A.BY_NUMBER["3.1.1"], A.Saved(tmp_path, "gpu"))
    assert got.status == "measured" and not got.missing and "NCCL+GPU with 2, 4 and 6 ranks" in got.text, got
    rows = _collective_rows(combos, counts, XC.SEED_SIZES, drop={(6, XC.SEED_SIZES[-1])})  # 6 ranks: no 1 GB
    D.write(tmp_path, {"03_collectives": (rows, dict(cpu_count=16, gpu_count=8))}, profile="gpu")
    got = A.answer(A.BY_NUMBER["3.1.1"], A.Saved(tmp_path, "gpu"))
    assert got.status == "partial" and "gloo+CPU at 1 GiB (6 ranks); NCCL+GPU at 1 GiB (6 ranks)" in got.missing, got


# ---- 3.3.2-3.4.3: 1 node, 2 GPUs, the xl model -----------------------------------------------------------------------

DDP_SPEED = ["3.3.2", "3.4.1", "3.4.2", "3.4.3(a)", "3.4.3(b)", "3.4.3(c)"]


def test_the_ddp_speed_answers_name_their_sizes_and_miss_xl(synthetic):
    saved = A.Saved(synthetic, "cpu")
    for number in DDP_SPEED:
        got = A.answer(A.BY_NUMBER[number], saved)
        assert got.status == "partial" and got.missing.startswith("the handouts' xl model (xl/cpu on the cpu profile)")
        sizes = "medium/cpu" if number.startswith("3.4.3(") and number != "3.4.3(a)" else "small/cpu and medium/cpu"
        assert f"Measured on {sizes}; the handouts ask xl" in got.text, (number, got.text)


@pytest.mark.parametrize("xl", ["xl/cpu", "xl-2026/cpu"])  # as each edition's Table 1 names it
def test_the_ddp_speed_answers_are_measured_once_xl_ran(tmp_path, xl):
    raw = {m: [{v: D.speed_run(1.0 + k, 0.2) for v in ("local", "naive", "flat", "per_parameter")}] * 2
           for k, m in enumerate(["small/cpu", xl])}  # fmt: skip
    speed = [{"model": m, "variant": v, "step_s": 1.0, "comm_s": 0.2} for m in raw for v in raw[m][0]]
    overlap = [{"variant": v, "buckets": None, "trace overlap": o} for v, o in (("naive", 0.0), ("per_parameter", 0.4))]
    D.write(
        tmp_path,
        {
            "04_ddp_speed": (speed, {}),
            "04_ddp_ratios": (XD.ratio_rows(raw), {}),
            "04_ddp_overlap": (overlap, dict(model=xl)),
        },
    )
    for number in DDP_SPEED:
        got = A.answer(A.BY_NUMBER[number], A.Saved(tmp_path, "cpu"))
        assert got.status == "measured" and not got.missing and "the handouts ask xl" not in got.text, number
