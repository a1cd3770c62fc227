"""Notebook 07's experiment functions (helpers.experiments.fsdp) and the closed forms they check, gloo on CPU: FSDP vs
one process within the derived bound (2 ranks) and bitwise (1 rank); memory vs formulas.fsdp_live_bytes (exact) and
ZeRO-3; bytes per step vs the formula (1.5x DDP); ring all-reduces exact; the checkpointing model's optimum; the
2025/2026 calculators' known values; bad inputs. FSDP against one process (2 ranks and 1) runs as notebook 07 runs it,
through its section function: tests/test_fsdp_sections.py."""

import functools
import math

import pytest
import torch

from helpers import formulas as F
from helpers.experiments import fsdp as X
from helpers.launch import launch

CHECK = dict(model="small/cpu", n_layers=2, steps=2, batch_size=4, context_length=16)


@pytest.fixture(scope="module")
def measured():
    worker = functools.partial(
        X.measure_worker, model="small/cpu", batch_size=8, context_length=64, steps=2, warmup=1, kinds=("fsdp", "ddp")
    )
    return launch(worker, 2, backend="gloo", device="cpu", timeout_s=300)


def test_memory_matches_the_formulas(measured):
    check = X.fsdp_memory_check(measured)
    assert check["within"].all(), check[~check["within"]]
    zero = X.zero_check(measured)
    assert ((zero["measured/zero"] - 1).abs() < 0.01).all(), zero
    fsdp, ddp = zero[zero["kind"] == "fsdp"], zero[zero["kind"] == "ddp"]
    assert fsdp["measured_MiB"].max() < 0.6 * ddp["measured_MiB"].min()  # 1/N of the states, N = 2


def test_bytes_per_step_are_the_formula_and_1_5x_ddp(measured):
    table = X.bytes_table(measured, "small/cpu")
    assert table["equal"].all()
    assert abs(table["FSDP / DDP"].iloc[0] - 1.5) < 0.01
    assert F.fsdp_live_bytes("small/cpu", 2, 4, 64, "after init")["gradients"] == 0


def test_trace_and_speed_tables(measured):
    timely = X.gather_timeliness(measured)
    assert len(timely) == 2 * 11 and not timely["prefetched"].iloc[0]  # 11 sharded modules per forward
    speed = X.speed_table(measured)
    assert set(speed.index) == {"fsdp", "ddp"} and speed.loc["fsdp", "/ fsdp"] == 1.0


def test_ring_all_reduces_exact_and_their_bytes():
    per_rank = launch(
        functools.partial(X.ring_worker, sizes=[5, 1000], steps=1, warmup=0),
        3,
        backend="gloo",
        device="cpu",
        timeout_s=120,
    )
    table = X.ring_table([per_rank])
    assert table["exact"].all()
    hand = table[table["method"] != "dist.all_reduce"]
    assert (hand[hand["S_bytes"] == 4000]["sent/S"] == hand[hand["S_bytes"] == 4000]["formula/S"]).all()


def test_checkpointing_model_and_sweep():
    assert F.best_segment(16, 1.0, 1.0) == (4.0, 4)  # equal sizes: sqrt(L) blocks per segment
    assert F.best_segment(12, 1.0, 20.0)[1] == 1  # activations >> inputs: one block per segment
    assert F.checkpoint_memory(12, 0, 1, 20) == 240 and F.checkpoint_memory(12, 5, 1, 1) == 3 + 5
    s = F.checkpoint_strategies(64)
    assert (
        s["sqrt"]["memory_blocks"] == 16 and s["nested"]["memory_blocks"] == 7 and s["nested"]["forward_passes"] == 4.5
    )
    # the sweep itself, as notebook 07 runs it: tests/test_fsdp_sections.py (checkpoint_section)


def test_the_gpu_checkpoint_sweep_times_enough_pairs_for_a_verdict():
    """§5's sentence on a GPU compares checkpointing with none from ckpt_steps paired steps: at 5 (below
    timing.MIN_PAIRS) it could only ever say "too few paired samples to tell"."""
    from helpers.timing import MIN_PAIRS, Ratio, verdict

    steps = X.PROFILES["gpu"]["ckpt_steps"]
    assert steps >= MIN_PAIRS
    assert "too few" not in verdict("checkpointing", "no checkpointing", Ratio(1.3, 1.2, 1.4, steps))


def test_calculators_known_values():
    xxl = F.xxl_memory(tokens=0)
    assert xxl["params"] == 126 * 2 * 16384 * 53248 and xxl["states"] == 16 * xxl["params"]
    assert math.isclose(xxl["states"] / 1e12, 3.5176, rel_tol=1e-4)  # TB of fp32 states
    n = F.xxl_min_fsdp(1024)
    assert F.xxl_memory(1024, n)["total"] <= 95e9 < F.xxl_memory(1024, n - 1)["total"]
    assert F.xxl_min_fsdp(10**6) is None  # half the activations alone exceed the device
    ffn = dict(tokens=1000, d=64, f=256, n=4, C=1e12, W=1e10)
    dp, tp = F.gated_ffn("dp", **ffn), F.gated_ffn("tp", **ffn)
    assert dp["backward_flops"] == 12 * 1000 * 64 * 256 and dp["bytes_sent"] == 2 * 0.75 * 3 * 64 * 256 * 2
    assert tp["backward_flops"] == dp["backward_flops"] / 4 and tp["bytes_sent"] == 2 * 0.75 * 1000 * 64 * 2
    limits = F.gated_ffn_thresholds(d=64, f=256, n=4, C=1e12, W=1e10)
    assert F.gated_ffn("dp", **{**ffn, "tokens": int(limits["dp_min_tokens"]) - 1})["comm_bound"]
    assert not F.gated_ffn("dp", **{**ffn, "tokens": int(limits["dp_min_tokens"]) + 1})["comm_bound"]
    assert F.zero_memory("xl", 8, 3)["communication"] / F.zero_memory("xl", 8, 0)["communication"] == 1.5
    assert X.strategies_table("xl", 8, 80 * F.GiB).loc["FSDP (ZeRO-3)", "fits"]


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="unknown strategy"):
        F.gated_ffn("pp", tokens=1, d=1, f=1, n=2, C=1, W=1)
    with pytest.raises(ValueError, match="unknown kind"):
        X.build_kind("zero9", "small/cpu")
    with pytest.raises(ValueError, match="segment must be"):
        X.CheckpointedLM(X.build("small/cpu"), 5)
    with pytest.raises(ValueError, match="paired_ratio needs"):
        X.speed_table([X.MeasureRun([], [], None, {"fsdp": []}, {"fsdp": 0})])
    assert torch.get_default_dtype() == torch.float32


def test_reference_is_built_on_the_device_the_run_computed_on():
    """Issue 31 item 2: a GPU run's one-rank bitwise check needs its reference computed by the same BLAS (cuBLAS)."""
    per_rank = launch(
        functools.partial(X.equivalence_worker, dtypes=["fp32"], **{**CHECK, "steps": 1}),
        1,
        backend="gloo",
        device="cpu",
        timeout_s=300,
    )
    run = per_rank[0]["fp32"]
    assert run.device == "cpu"
    net = X.loaded(CHECK["model"], CHECK["n_layers"], run.weights[0], device="meta")
    assert {p.device.type for p in net.parameters()} == {"meta"}


def test_checkpoint_sweep_builds_the_model_at_the_context_it_feeds():
    """Issue 31 item 3: xl at context 1024 on the gpu profile; a model built at its default 128 positions fails."""
    sweep = X.checkpoint_sweep(
        "small/cpu", n_layers=2, batch_size=1, context_length=192, segments=[0, 1], steps=1, warmup=0
    )
    assert list(sweep.index) == [0, 1]


@pytest.mark.parametrize(
    "gpus,expected",
    [(0, ("gloo", "cpu")), (1, ("gloo", "cpu")), (2, ("gloo", "cpu")), (4, ("nccl", "cuda")), (8, ("nccl", "cuda"))],
)
def test_ring_runs_nccl_on_a_gpu_per_rank_else_gloo_on_host_memory(monkeypatch, gpus, expected):
    """Issue 31 item 6: worlds 2 and 4 on 1-3 GPUs run gloo with host data (gloo's send/recv read a raw pointer as
    host memory), labelled so; a GPU per rank: NCCL with the data on each rank's GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert X.ring_backend([2, 4]) == expected


def test_ring_table_says_where_the_data_moved():
    per_rank = launch(
        functools.partial(X.ring_worker, sizes=[8], steps=1, warmup=0), 2, backend="gloo", device="cpu", timeout_s=120
    )
    assert set(X.ring_table([per_rank])["on"]) == {"gloo on cpu"}


def test_nccl_all_gathers_are_found_and_timed_on_the_device():
    """Issue 31 item 9: under NCCL the gathers are kernels (no gloo: event) and the host runs ahead of the GPU, so
    each call's span is the kernels its ops launched. A fake trace: module a's ops launched kernels 10-20 µs (host
    range 0-5), b's 25-40 (host 5-8); b's prefetched all-gather kernel ends at 18, in time; a second run ends it
    at 23."""
    from types import SimpleNamespace as NS

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    span = lambda a, b: NS(start=a, end=b)  # noqa: E731
    ra = NS(name="a (Linear)", device_type=cpu, thread=1, time_range=span(0, 5), id=1, linked_correlation_id=0)
    rb = NS(name="b (Linear)", device_type=cpu, thread=1, time_range=span(5, 8), id=2, linked_correlation_id=0)
    ops = [
        NS(name="aten::mm", device_type=cpu, thread=1, time_range=span(1, 2), id=11, linked_correlation_id=0),
        NS(name="aten::mm", device_type=cpu, thread=1, time_range=span(6, 7), id=12, linked_correlation_id=0),
    ]
    kernels = [
        NS(name="nvjet_tst_gemm", device_type=cuda, thread=9, time_range=span(10, 20), id=0, linked_correlation_id=11),
        NS(name="nvjet_tst_gemm", device_type=cuda, thread=9, time_range=span(25, 40), id=0, linked_correlation_id=12),
    ]
    for end, in_time in ((18, True), (23, False)):
        gathers = [
            NS(
                name=f"ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgs{i})",
                device_type=cuda,
                thread=9,
                time_range=span(e - 3, e),
                id=0,
                linked_correlation_id=0,
            )
            for i, e in enumerate((8, end))
        ]
        events = [ra, rb, *ops, *kernels, *gathers]
        assert [X.is_gather(e) for e in events] == [False] * 6 + [True] * 2
        spans = [X.kernel_span(events, r) for r in (ra, rb)]
        assert spans == [(10, 20), (25, 40)]
        traced = X.gather_rows(["a", "b"], [1, 1], spans, [e.time_range.end for e in gathers])
        run = X.MeasureRun([], [], traced, {}, {})
        assert X.gather_timeliness([run])["in_time"].tolist() == [False, in_time]


def test_the_bench_line_says_why_a_peak_is_missing_instead_of_nan():
    """Issue 39 item 14: fully_shard's per-rank peak cannot be read on a CPU (step_peak: nan)."""
    from helpers.experiments import fsdp as XF

    assert XF.peak_text(12.345) == "12.35 MiB"
    assert "not measurable on a CPU" in XF.peak_text(float("nan")) and "nan" not in XF.peak_text(float("nan"))
