"""Collective benchmarks: bandwidth formulas, exact-result checks that catch a planted error, the alpha-beta fit,
skipped combinations, and the command line both spawned and under torchrun (gloo, CPU, 2 ranks)."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import formulas as F
from helpers.experiments import collectives as C
from helpers.launch import launch

TINY = (4 * F.KiB, 64 * F.KiB)


# ---- formulas ----


@pytest.mark.parametrize(
    "op, n, factor",
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 4, 1.5),
        ("all_reduce", 8, 1.75),
        ("all_gather", 4, 0.75),
        ("reduce_scatter", 8, 0.875),
        ("broadcast", 6, 1.0),
        ("all_reduce", 1, 0.0),
    ],
)
def test_busbw_factors_match_nccl_tests(op, n, factor):
    assert F.busbw_factor(op, n) == pytest.approx(factor)


def test_algbw_and_busbw():
    assert F.algbw(1e9, 0.5) == pytest.approx(2e9)
    assert F.busbw("all_reduce", 1e9, 0.5, 4) == pytest.approx(2e9 * 1.5)
    assert F.busbw("all_gather", 8e6, 2e-3, 2) == pytest.approx(4e9 * 0.5)
    with pytest.raises(ValueError, match="unknown collective"):
        F.busbw_factor("all_to_all", 2)


def test_sizes_parse_and_format():
    assert [C.parse_size(s) for s in ("512KB", "1MB", "1GB", "4096", "10MiB")] == [
        2**19,
        2**20,
        2**30,
        4096,
        10 * 2**20,
    ]
    assert [C.format_size(b) for b in (2**19, 10 * 2**20, 2**30, 100, 263000)] == [
        "512 KiB",
        "10 MiB",
        "1 GiB",
        "100 B",
        "257 KiB",
    ]


def _reference_collective(op: str, inputs: list, rank: int) -> torch.Tensor:
    """What `op` leaves on `rank`, computed directly from every rank's input."""
    if op == "all_reduce":
        return sum(inputs)
    if op == "all_gather":
        return torch.cat(inputs)
    if op == "reduce_scatter":
        return sum(inputs).chunk(len(inputs))[rank]
    if op == "broadcast":
        return inputs[0]
    raise ValueError(f"no reference for {op!r}")


@pytest.mark.parametrize("op", C.OPS)
def test_expected_values_equal_a_reference_collective(op):
    """The exact expected outputs equal the collective computed directly from every rank's input (3 ranks)."""
    n, numel, dev = 3, 3 * 300, torch.device("cpu")
    inputs = [C._buffers(op, numel, r, n, dev)[0] for r in range(n)]
    for rank in range(n):
        expected = C._buffers(op, numel, rank, n, dev)[2]
        reference = _reference_collective(op, inputs, rank)
        assert torch.equal(expected, reference), (op, rank)
        assert expected.abs().max() < 2**24  # integers, exact in float32


# ---- the correctness check, on 2 real gloo ranks ----


def test_clean_run_has_no_wrong_results_and_planted_error_is_caught():
    clean = C.summarize(launch(C.bench_worker, 2, C.OPS, TINY, 5, 4, backend="gloo", device="cpu"), "gloo", "cpu")
    assert len(clean) == len(C.OPS) * len(TINY)
    assert all(r["wrong"] == 0 and r["iters"] == 4 and r["time_s"] > 0 for r in clean), clean
    planted = C.summarize(launch(C.bench_worker, 2, C.OPS, TINY, 5, 4, 0, backend="gloo", device="cpu"), "gloo", "cpu")
    assert all(r["wrong"] == 4 for r in planted), [(r["op"], r["wrong"]) for r in planted]


def test_a_wrong_input_off_the_broadcast_root_is_overwritten_not_counted():
    """Also: a tiny time budget cuts the timed calls to the minimum, 3, on both ranks alike."""
    rows = C.summarize(
        launch(C.bench_worker, 2, ("all_reduce", "broadcast"), TINY[:1], 5, 10, 1, 1e-9, backend="gloo", device="cpu"),
        "gloo",
        "cpu",
    )
    assert {r["op"]: (r["wrong"], r["iters"]) for r in rows} == {"all_reduce": (3, 3), "broadcast": (0, 3)}


def test_summary_times_each_call_by_its_slowest_rank():
    """A call's time is the max over ranks of that call; time_s, p25_s, p75_s are its median and quartiles."""
    r0 = [{"op": "all_reduce", "size_bytes": 1000, "samples": [1.0, 5.0, 2.0, 2.0, 9.0], "wrong": [False] * 5}]
    r1 = [{"op": "all_reduce", "size_bytes": 1000, "samples": [3.0, 1.0, 2.0, 4.0, 1.0], "wrong": [False] * 4 + [True]}]
    (row,) = C.summarize([r0, r1], "gloo", "cpu")
    assert (row["p25_s"], row["time_s"], row["p75_s"]) == (3.0, 4.0, 5.0)  # per call: 3, 5, 2, 4, 9
    assert row["wrong"] == 1 and row["iters"] == 5 and row["busbw_GBps"] == pytest.approx(1000 / 4.0 / 1e9)


def test_fewer_than_five_warmup_calls_are_refused():
    with pytest.raises(ValueError, match="at least 5"):
        C.bench_worker(("all_reduce",), TINY, warmup=4)


# ---- the alpha-beta fit ----


def test_fit_recovers_alpha_beta_from_noisy_synthetic_data():
    alpha, beta = 50e-6, 10e9
    sizes = np.geomspace(1e3, 1e9, 25)
    noise = np.random.default_rng(0).normal(1.0, 0.05, sizes.size)  # 5% multiplicative noise
    fit = C.fit_alpha_beta(sizes, (alpha + sizes / beta) * noise)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.1) and fit.beta_Bps == pytest.approx(beta, rel=0.1)
    assert 0.01 < fit.median_rel_err < 0.1 and fit.max_rel_err < 0.25
    assert fit.crossover_bytes == pytest.approx(alpha * beta, rel=0.2)
    exact = C.fit_alpha_beta(sizes, alpha + sizes / beta)
    assert exact.alpha_s == pytest.approx(alpha, rel=1e-6) and exact.max_rel_err < 1e-6


def test_fit_clamps_a_negative_latency_to_zero():
    sizes = np.array([1e6, 2e6, 4e6])
    fit = C.fit_alpha_beta(sizes, sizes / 1e9 - 1e-4)  # a straight line through a negative intercept
    assert fit.alpha_s == 0.0 and fit.beta_Bps > 0


def test_fit_table_one_row_per_group_fitted_to_the_lower_quartile():
    sizes = np.geomspace(1e4, 1e7, 6)
    df = C.pd.DataFrame(
        [
            {
                "backend": "gloo",
                "device": "cpu",
                "world_size": n,
                "op": "all_reduce",
                "size_bytes": s,
                "p25_s": 1e-4 * n + s / (1e9 / n),
                "time_s": 3e-3 * (k % 2),
            }  # medians: noise, not α–β
            for n in (2, 4)
            for k, s in enumerate(sizes)
        ]
    )
    fits = C.fit_table(df).set_index("world_size")
    assert fits.loc[2, "alpha_us"] == pytest.approx(200) and fits.loc[4, "beta_GBps"] == pytest.approx(0.25)
    assert (fits["fitted_to"] == "p25_s").all() and fits["max_rel_err"].max() < 1e-9
    old = C.fit_table(df.drop(columns="time_s").rename(columns={"p25_s": "time_s"}))  # rows saved before p25_s
    assert (old["fitted_to"] == "time_s").all() and old["alpha_us"].tolist() == pytest.approx([200, 400])


# ---- skipped combinations ----


def test_skip_reasons(monkeypatch):
    monkeypatch.setattr(C.dist, "is_nccl_available", lambda: True)  # as on a CUDA build
    assert C.skip_reason("gloo", "cpu", 6, gpus=0) is None
    assert "no CUDA" in C.skip_reason("gloo", "cuda", 2, gpus=0)
    assert "one GPU per rank" in C.skip_reason("nccl", "cuda", 4, gpus=2)
    assert "CUDA tensors" in C.skip_reason("nccl", "cpu", 2, gpus=8)
    todo = C.plan((2, 4), (("gloo", "cpu"), ("gloo", "cuda"), ("nccl", "cuda")), gpus=2).set_index(
        ["backend", "device", "world_size"]
    )
    assert todo["run"].tolist() == [True, True, True, True, True, False]
    monkeypatch.setattr(C.dist, "is_nccl_available", lambda: False)
    assert "no NCCL" in C.skip_reason("nccl", "cuda", 2, gpus=2)
    assert "share 2 GPU" in todo.loc[("gloo", "cuda", 4), "reason"] and todo.loc[("gloo", "cuda", 2), "reason"] == ""


def test_grid_runs_only_what_can_run_here(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    df, todo = C.run_grid(TINY[:1], ("all_reduce",), (2,), (("gloo", "cpu"), ("nccl", "cuda")), warmup=5, iters=2)
    assert df[["backend", "world_size", "wrong"]].values.tolist() == [["gloo", 2, 0]]
    assert todo[~todo["run"]]["reason"].tolist() == ["no CUDA GPU here"]


def test_a_failing_configuration_is_reported_and_the_grid_goes_on(monkeypatch):
    def fake_launch(fn, world_size, *args, **kwargs):
        if world_size == 4:
            raise C.L.RankError("rank 3 of 4 raised RuntimeError: unsupported\n\ntraceback", rank=3)
        return [[{"op": "all_reduce", "size_bytes": 4096, "samples": [1e-3] * 3, "wrong": [False] * 3}]] * world_size

    monkeypatch.setattr(C.L, "launch", fake_launch)
    df, todo = C.run_grid(TINY[:1], ("all_reduce",), (2, 4), (("gloo", "cpu"),))
    assert df["world_size"].tolist() == [2] and df["busbw_GBps"].iloc[0] == pytest.approx(4096 / 1e-3 / 1e9)
    assert todo["run"].tolist() == [True, False] and todo["reason"].iloc[1].startswith("failed: rank 3 of 4")


# ---- command line ----


def _saved(path):
    lines = [json.loads(line) for line in Path(path).read_text().splitlines()]
    return lines[0]["provenance"], lines[1:]


def test_bench_main_spawned_writes_results_with_provenance(tmp_path, capsys):
    code = C.bench_main(
        [
            "--profile",
            "cpu",
            "--sizes",
            "4KB",
            "--ops",
            "all_reduce",
            "all_gather",
            "--world-sizes",
            "2",
            "--iters",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    prov, rows = _saved(tmp_path / "collectives.jsonl")
    assert code == 0 and prov["profile"] == "cpu" and prov["method"] == C.METHOD
    assert [(r["op"], r["world_size"], r["wrong"]) for r in rows] == [("all_reduce", 2, 0), ("all_gather", 2, 0)]


# ---- comparisons that know their noise, and two nodes ----


def _row(op, calls, backend="gloo", device="cpu", size=4096, n=2):
    return {
        "backend": backend,
        "device": device,
        "world_size": n,
        "op": op,
        "size_bytes": size,
        "calls_s": calls,
        "time_s": float(np.median(calls)),
        "p25_s": float(np.percentile(calls, 25)),
        "p75_s": float(np.percentile(calls, 75)),
    }


def test_summary_keeps_each_calls_slowest_rank_time():
    r0 = [{"op": "all_reduce", "size_bytes": 1000, "samples": [1.0, 5.0, 2.0], "wrong": [False] * 3}]
    r1 = [{"op": "all_reduce", "size_bytes": 1000, "samples": [3.0, 1.0, 2.0], "wrong": [False] * 3}]
    assert C.summarize([r0, r1], "gloo", "cpu")[0]["calls_s"] == [3.0, 5.0, 2.0]


def test_op_ratios_pair_calls_and_name_a_winner_only_outside_the_noise():
    base = list(np.linspace(1.0, 2.0, 20))
    df = C.pd.DataFrame(
        [
            _row("all_reduce", base),
            _row("all_gather", [t / 2 for t in base]),
            _row("broadcast", base[::-1]),  # same values, paired the other way round: noise only
            _row("all_reduce", [9.0] * 5, size=1024),
        ]
    )  # smaller size: left out by default
    ratios = C.op_ratios(df).set_index("op")
    assert ratios.loc["all_gather", "ratio"] == pytest.approx(0.5) and ratios.loc["all_gather", "measurable"]
    assert (
        not ratios.loc["broadcast", "measurable"] and "no measurable difference" in ratios.loc["broadcast", "verdict"]
    )
    assert (ratios["pairs"] == 20).all() and (ratios["size"] == "4 KiB").all()
    with pytest.raises(ValueError, match="calls_s"):
        C.op_ratios(df.drop(columns="calls_s"))
    few = df[df["size_bytes"] == 4096].assign(calls_s=lambda d: [c[: C.MIN_PAIRS - 1] for c in d["calls_s"]])
    few_ratios = C.op_ratios(few).set_index("op")  # all_gather is half, every call, but 5 pairs cannot tell
    assert not few_ratios["measurable"].any() and "too few" in few_ratios.loc["all_gather", "verdict"]


def test_op_ratios_default_to_the_largest_size_with_enough_calls():
    df = C.pd.DataFrame(
        [_row(op, [1.0] * 20) for op in ("all_reduce", "all_gather")]
        + [_row(op, [1.0] * 3, size=8192) for op in ("all_reduce", "all_gather")]
    )
    assert C.op_ratios(df)["size"].tolist() == ["4 KiB"]


def test_unpaired_ratios_call_a_winner_only_where_quartiles_do_not_overlap():
    df = C.pd.DataFrame(
        [
            _row("all_reduce", [10.0, 11.0, 12.0, 13.0]),
            _row("all_reduce", [2.0, 3.0, 30.0], size=8192),
            _row("all_reduce", [1.0, 1.1, 1.2, 1.3], "nccl", "cuda"),
            _row("all_reduce", [1.0, 2.0, 3.0], "nccl", "cuda", size=8192),
        ]
    )
    vs = C.unpaired_ratios(df, ("gloo", "cpu")).set_index("size_bytes")
    assert vs.loc[4096, "apart"] and vs.loc[4096, "ratio"] == pytest.approx(11.5 / 1.15)
    assert not vs.loc[8192, "apart"]  # gloo's p25-p75 (2.5-16.5) overlaps NCCL's (1.5-2.5)


def test_two_node_recipe_and_a_failed_rehearsal_reports_the_agents_stderr(monkeypatch):
    head, other = C.two_node_recipe("head:29500", nproc_per_node=4)
    assert "--nnodes 2 --node-rank 0 --nproc-per-node 4" in head and "--node-rank 1" in other
    assert all(
        "--rdzv-endpoint head:29500" in c and "--backend nccl --device cuda --reference" in c for c in (head, other)
    )
    failed = [
        subprocess.CompletedProcess(["a"], 0, "", ""),
        subprocess.CompletedProcess(["b"], 1, "", "rendezvous timed out"),
    ]
    monkeypatch.setattr(C.L, "run_simulated_nodes", lambda argv, **kw: failed)
    with pytest.raises(RuntimeError, match="agent 1 \\(exit 1\\):\nrendezvous timed out"):
        C.two_node_rehearsal(["4KB"])


def test_on_cuda_a_sample_is_a_batch_of_calls_between_one_event_pair(monkeypatch):
    """Issue 39 item 12: NCCL times with a host sync per call put the sync's latency into α (several times
    nccl-tests'). On CUDA a sample is BATCH_CALLS calls between one event pair, per call; stub events on a simulated
    device clock where each call queues 40 µs of device work and returns at once."""
    from types import SimpleNamespace as NS

    clock, calls = NS(ms=0.0), []

    class Event:
        def __init__(self, enable_timing=False):
            self.ms = None

        def record(self, stream=None):
            self.ms = clock.ms

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.ms - self.ms

    def collective(op, work, out):
        calls.append(op)
        clock.ms += 0.040

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(C, "run_collective", collective)
    seconds = C._timed_batch("all_reduce", None, None, C.BATCH_CALLS)
    assert calls == ["all_reduce"] * C.BATCH_CALLS and seconds == pytest.approx(40e-6)


# ---- notebook 03's sections: one call each, a Result whose sentences come from its rows ----


def test_grid_section_names_what_the_profile_leaves_out():
    from helpers.experiments import collectives_sections as S

    cpu, gpu = S.grid_section("cpu"), S.grid_section("gpu")
    assert cpu.notes[1].startswith("left out of the seed's grid here: {") and "'process counts': [6]" in cpu.notes[1]
    assert gpu.notes[1] == "left out of the seed's grid here: nothing"  # the seed's grid is the gpu profile
    assert cpu.values["runnable"] == int(cpu.table["run"].sum()) == 2


def test_run_section_saves_checks_and_its_readers_narrate_the_rows(tmp_path, monkeypatch):
    from helpers import results
    from helpers.experiments import collectives_sections as S

    monkeypatch.setattr(results, "DATA_DIR", tmp_path)
    grid = dict(C.PROFILE_GRID["cpu"], sizes=(4 * F.KiB, 16 * F.KiB, 64 * F.KiB), world_sizes=(2,), iters=6)
    run = S.run_section("cpu", grid)
    saved = results.load_results(run.saved)
    assert run.saved.name == "03_collectives.jsonl" and saved.provenance["method"] == C.METHOD
    assert len(saved.rows) == len(C.OPS) * 3 and run.values == {"wrong": 0, "timed_calls": int(run.df["iters"].sum())}
    assert f"all {run.values['timed_calls']} timed results were exactly right" in run.notes[0]
    assert list(run.table.index) == ["4 KiB", "16 KiB", "64 KiB"]
    fits = C.fit_table(run.df)
    fit = S.fit_section(fits)
    assert f"{fit.values['worst_median_rel_err']:.1%}" in fit.notes[0]
    for section in (S.steadiness_section, S.slopes_section, S.ranks_section, S.ops_section):
        assert section(run.df).notes, section.__name__
    assert "α·β ≈" in S.latency_section(run.df, fits).notes[0]
    wrong = run.df.assign(wrong=[0] * (len(run.df) - 1) + [1])  # one wrong call in the last row
    with pytest.raises(AssertionError):
        S.check_rows(wrong)
    with pytest.raises(AssertionError):  # busbw not size / time x factor: a wrong factor
        S.check_rows(run.df.assign(busbw_GBps=run.df["algbw_GBps"]))


def test_ops_and_backends_sections_name_a_winner_only_outside_the_noise():
    from helpers.experiments import collectives_sections as S

    base = list(np.linspace(1.0, 2.0, 20))
    df = C.pd.DataFrame([_row("all_reduce", base), _row("all_gather", [t / 2 for t in base])])
    df["size"] = "4 KiB"
    ops = S.ops_section(df)
    assert "all_gather takes 0.50x all_reduce's time" in ops.notes[0] and ops.values["medians_inside_intervals"]
    assert S.backends_section(df).notes[0].startswith("not measurable here: NCCL needs one GPU per rank")
    both = C.pd.DataFrame(
        [_row("all_reduce", [10.0, 11.0, 12.0, 13.0]), _row("all_reduce", [1.0, 1.1, 1.2, 1.3], "nccl", "cuda")]
    )
    vs = S.backends_section(both)
    assert vs.notes == [
        "gloo+cpu / NCCL: median 10x (10x to 10x) over 1 points; NCCL faster (quartile ranges apart) at 1, "
        "within each other's quartiles at 0"
    ]


def test_the_handouts_bucket_optimum_is_the_models_under_its_assumption():
    """With T_b = S/β (a bucket computes as long as it sends), bucket_overhead is n·α + S/(n·β): its integer argmin
    is next to sqrt(S/(α·β)), and b* = S/n* = sqrt(S·β·α) (the handout's sqrt(s·w·o))."""
    import math

    import numpy as np

    from helpers import formulas as F

    S, alpha, beta = 25_642_240.0, 1.6e-4, 9.05e8
    n = np.arange(1, 2000)
    best = n[np.argmin(F.bucket_overhead(n, S, S / beta, alpha, beta))]
    n_star = math.sqrt(S / (alpha * beta))
    assert abs(best - n_star) <= 1
    assert math.isclose(S / n_star, F.handout_bucket_size(S, alpha, beta), rel_tol=1e-12)
