"""Profiler tables and op classes, the flame-graph builder, FLOPs vs FlopCounterMode, MFU peaks, autocast dtypes,
fp16 accumulation, and notebook 01's table builders and summaries."""

import functools

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch

from helpers import formulas, model, profiling
from helpers.experiments import benchmarking
from helpers.experiments.common import train_step

TOLERANCE = 0.01  # analytic training FLOPs vs FlopCounterMode (they agree exactly for this model)


@pytest.fixture(scope="module")
def tiny():
    cfg = model.get_config("small/cpu", n_layers=1)
    lm = model.build_model(cfg)
    x, y = model.random_batch(cfg, batch_size=2, context_length=16)
    return lm, torch.optim.AdamW(lm.parameters()), x, y


@pytest.fixture(scope="module")
def step_profile(tiny):
    lm, opt, x, y = tiny
    return profiling.run_profiler(lambda: train_step(lm, opt, x, y), steps=2, warmup=1, model=lm)


def test_op_table_has_matmuls_and_shares_sum_to_one(step_profile):
    table = profiling.op_table(step_profile, steps=2, top=1000)
    assert {"aten::mm", "aten::bmm"} <= set(table["op"])
    assert table["share"].sum() == pytest.approx(1.0)
    assert table.loc[table["op"] == "aten::bmm", "calls/step"].item() == 6  # QKᵀ, AV; backward: 2 per matmul
    assert sum(profiling.class_shares(step_profile).values()) == pytest.approx(1.0)


def test_op_class():
    assert profiling.op_class("aten::mm") == "matmul"
    assert profiling.op_class("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize256x128x32") == "matmul"
    assert profiling.op_class("aten::mul") == "elementwise/other"
    assert profiling.op_class("aten::_softmax") == "elementwise/other"


def test_on_cuda_a_kernel_is_classed_by_the_aten_op_that_launched_it():
    """Issue 31 item 10: cuBLAS on sm_90 runs nvjet_* GEMMs, which no name hint knows; the profiler ties each kernel to
    its launching op. A fake CUDA profile: aten::mm launched an nvjet kernel (80 µs), aten::add an elementwise one."""
    from types import SimpleNamespace as NS

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    gemm, add = "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "vectorized_elementwise_kernel<4, add>"
    ops = [
        NS(name="aten::mm", device_type=cpu, self_device_time_total=80.0, kernels=[NS(name=gemm)]),
        NS(name="aten::add", device_type=cpu, self_device_time_total=20.0, kernels=[NS(name=add)]),
    ]
    averages = [
        NS(key=gemm, device_type=cuda, self_device_time_total=80.0, count=1),
        NS(key=add, device_type=cuda, self_device_time_total=20.0, count=1),
    ]
    prof = NS(device_type="cuda", events=lambda: ops, key_averages=lambda: averages)
    assert profiling.class_shares(prof) == {"matmul": pytest.approx(0.8), "elementwise/other": pytest.approx(0.2)}
    table = profiling.op_table(prof, steps=1).set_index("op")
    assert table.loc[gemm, "class"] == "matmul" and table.loc[add, "class"] == "elementwise/other"


def test_module_stacks_cover_the_profile_and_find_rmsnorm_and_softmax(step_profile):
    stacks = profiling.module_stacks(step_profile)
    total_ops = sum(t for _, t, _ in profiling._leaf_times(step_profile))
    assert sum(v for _, v in stacks) == pytest.approx(total_ops)
    assert {s[0] for s, _ in stacks} == {"forward", "backward", "optimizer step"}
    assert any(f.endswith("(RMSNormTorch)") for s, _ in stacks if s[0] == "backward" for f in s)
    assert 0 < profiling.module_share(stacks, "RMSNormTorch") < 1
    assert 0 < profiling.op_share(stacks, "aten::_softmax", "aten::_softmax_backward_data") < 1


def test_flame_rects_from_a_synthetic_collapsed_file():
    stacks = profiling.parse_collapsed(["main;f;g 3", "main;f 1", "main;h 4", "", "other 2"])
    rects = {(r["name"], r["depth"]): r for r in profiling.flame_rects(stacks)}
    assert rects[("main", 0)]["width"] == 8 and rects[("other", 0)]["start"] == 8
    assert rects[("f", 1)]["width"] == 4 and rects[("g", 2)]["width"] == 3
    assert rects[("h", 1)]["start"] == 4  # after f's 4
    assert profiling.module_share([(("a (RMSNorm)", "x"), 1.0), (("b", "y"), 3.0)], "RMSNorm") == 0.25
    ax = profiling.plot_flame(stacks)
    assert len(ax.patches) == 5


def _loss_backward(net, xs, ys) -> None:
    model.lm_loss(net(xs), ys).backward()


def test_train_flops_match_flop_counter(tiny):
    lm, _, x, y = tiny
    for size, B, T in [(lm.cfg, 2, 16), (model.get_config("medium/cpu", n_layers=2), 1, 128)]:
        net = lm if size is lm.cfg else model.build_model(size)
        xs, ys = model.random_batch(size, batch_size=B, context_length=T)
        counted = profiling.counted_flops(functools.partial(_loss_backward, net, xs, ys))
        assert abs(counted - formulas.train_flops(size, B, T)) / counted <= TOLERANCE
    flops = formulas.forward_flops(lm.cfg, 2, 16)
    assert flops["attention"] == 4 * 2 * 16**2 * lm.cfg.d_model * lm.cfg.n_layers


def test_peaks_and_mfu():
    assert formulas.peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert formulas.peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert formulas.peak_flops("NVIDIA H200", "fp32") == 67e12
    assert formulas.peak_flops("Intel(R) Xeon(R) CPU", "fp32") is None
    assert formulas.mfu(989e12, 2.0, "NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(0.5)
    assert formulas.mfu(1e9, 1.0, "AMD EPYC") is None


def test_autocast_dtype_table():
    torch.manual_seed(0)
    seen = benchmarking.autocast_dtypes(
        benchmarking.MixedPrecisionToyModel(), torch.randn(4, 10), torch.randint(5, (4,))
    )
    assert seen["parameters"] == "torch.float32" and seen["gradients"] == "torch.float32"
    assert seen["fc1 output"] == "torch.bfloat16" and seen["logits"] == "torch.bfloat16"
    assert seen["loss"] == "torch.float32"


def test_time_size_rows_per_pass_and_oom_is_recorded(monkeypatch):
    cfg = model.get_config("small/cpu", n_layers=1)
    rows = benchmarking.time_size(cfg, 2, 16, warmup=1, steps=2, autocast_dtype=torch.bfloat16)
    assert [r["pass"] for r in rows] == ["forward", "backward", "both"]
    assert all(r["status"] == "ok" and r["steps"] == 2 and r["precision"] == "autocast bfloat16" for r in rows)
    assert all(r["first_s"] > 0 and r["median_s"] > 0 for r in rows)

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(benchmarking, "build_model", out_of_memory)
    rows = benchmarking.time_size(cfg, 2, 16, warmup=0, steps=1, kinds=("both",))
    assert rows == [
        {
            "size": cfg,
            "pass": "both",
            "warm-up": 0,
            "precision": "fp32",
            "mean_s": None,
            "median_s": None,
            "std_s": None,
            "status": "OOM",
        }
    ]


def test_pass_fn_refuses_unknown_kind(tiny):
    lm, _, x, y = tiny
    with pytest.raises(ValueError, match="forward"):
        benchmarking.pass_fn(lm, x, y, "sideways")


def test_autocast_dtype_table_and_norm_errors():
    table = benchmarking.autocast_dtype_table([torch.bfloat16], "cpu")
    assert list(table.columns) == ["autocast bfloat16 on cpu"]
    assert (table.loc[["parameters", "gradients", "loss"]] == "torch.float32").all().all()
    err = benchmarking.mean_square_errors("cpu")
    assert err["bfloat16"] > 10 * err["float32"] and err["float16"] > 10 * err["float32"]


def test_accumulation_demo_exact_ieee_results():
    table = benchmarking.accumulation_demo()
    a, b, c, d = table["value"]
    assert a == 10.000133514404297 and abs(a - 10) < 2e-4
    assert b == 9.953125 and abs(b - 10) > 0.01
    assert c == d == 1000 * torch.tensor(0.01, dtype=torch.float16).item() == 10.00213623046875
    assert list(table["abs error"]) == [abs(v - 10) for v in table["value"]]
    text = benchmarking.accumulation_text(table)
    assert "0.0078125 = 2^-7" in text and "from 32 on" in text  # fp16 spacing in [8, 16); half of 2^-5 > 0.01


def test_warmup_summary_sees_a_one_time_cost():
    rows = [
        {
            "size": s,
            "pass": p,
            "warm-up": w,
            "status": "ok",
            "first_s": 10.0 if w == 0 else 1.0,
            "mean_s": 4.0 if w == 0 else 1.0,
            "median_s": 1.0,
            "std_s": 5.0 if w == 0 else 0.01,
        }
        for s in ("a", "b")
        for p in ("forward", "both")
        for w in (0, 3)
    ]
    times = pd.DataFrame(rows + [{"size": "c", "pass": "both", "warm-up": 0, "status": "OOM"}])
    cold, warm = benchmarking.warm_cold(times, 3)
    assert len(cold) == len(warm) == 4
    text = benchmarking.warmup_summary(times, warmup=3, cold_steps=3)
    assert "first step costs 10.0x" in text and "cold runs are 1.00x" in text and "one-time cost" in text


def test_speedup_and_stage_shares(step_profile):
    amp = pd.DataFrame(
        [
            {"size": s, "precision": p, "median_s": t}
            for s, t32 in (("a", 2.0), ("b", 4.0))
            for p, t in (("fp32", t32), ("autocast bfloat16", t32 / 2))
        ]
    )
    assert list(benchmarking.speedup_table(amp, ["b", "a"])["speed-up bfloat16"]) == [2.0, 2.0]
    shares = benchmarking.stage_shares(profiling.module_stacks(step_profile))
    assert set(shares.index) == {"forward", "backward", "optimizer step"} and shares.sum() == pytest.approx(1.0)
    classes = benchmarking.class_share_table({"full step": step_profile})
    assert classes.loc["full step"].sum() == pytest.approx(1.0)


def test_flops_table_matches_the_closed_forms():
    h100 = "NVIDIA H100 80GB HBM3"
    table = benchmarking.flops_table({"small": 0.5, "xl": 2.0}, 16, 128, h100, "tf32")
    total = formulas.train_flops("xl", 16, 128)
    assert table.loc["xl", "GFLOPs/step"] == total / 1e9 and table.loc["xl", "achieved GFLOP/s"] == total / 2.0 / 1e9
    assert table.loc["xl", "MFU"] == formulas.mfu(total, 2.0, h100, "tf32") < 1
    assert "MFU up to" in benchmarking.flops_summary(table, h100, "tf32")
    cpu = benchmarking.flops_table({"small/cpu": 0.1}, 2, 16, "Intel(R) Xeon(R) CPU")
    assert cpu["MFU"].isna().all() and "not defined" in benchmarking.flops_summary(cpu, "Intel(R) Xeon(R) CPU", "fp32")


def test_precisions_compared_in_one_loop_and_the_same_quantity_noted():
    cfg = model.get_config("small/cpu", n_layers=1)
    amp, comps = benchmarking.compare_precisions([cfg], 2, 16, [torch.bfloat16], warmup=1, steps=3, device="cpu")
    assert list(amp["precision"]) == ["fp32", "autocast bfloat16"] and (amp["status"] == "ok").all()
    assert all(len(s) == 3 for s in comps[cfg].samples.values())  # one sample per round each
    assert "speed-up bfloat16" in benchmarking.speedup_table(amp, [cfg])
    assert "fp32" in benchmarking.speedup_lines(comps)
    times = pd.DataFrame(
        [r | {"size": "m"} for w in (0, 1) for r in benchmarking.time_size(cfg, 2, 16, warmup=w, steps=3)]
    )
    assert "forward <= forward+backward" in benchmarking.check_forward_le_both(times, 1)
    assert "section 1" in benchmarking.same_quantity_note(times, amp.assign(size="m"), 1)


def test_warmup_summary_claims_equal_cost_only_inside_the_noise():
    def rows(first, rest_mean, warm_std):
        base = dict(size="s", status="ok")
        return pd.DataFrame(
            [
                {
                    **base,
                    "pass": "both",
                    "warm-up": 0,
                    "first_s": first,
                    "mean_s": (first + 2 * rest_mean) / 3,
                    "median_s": rest_mean,
                    "std_s": 0.01,
                },
                {
                    **base,
                    "pass": "both",
                    "warm-up": 2,
                    "first_s": 1.0,
                    "mean_s": 1.0,
                    "median_s": 1.0,
                    "std_s": warm_std,
                },
            ]
        )

    assert "no measurable difference between cold and warm" in benchmarking.warmup_summary(rows(10.0, 1.02, 0.05), 2, 3)
    text = benchmarking.warmup_summary(rows(10.0, 0.4, 0.05), 2, 3)
    assert "no 'same cost' is claimed" in text and "about the same" not in text


def test_write_collapsed_round_trips_through_parse_collapsed(tmp_path):
    stacks = [
        (("forward", "blocks.0 (Block)", "aten::mm"), 7.0),
        (("backward", "MmBackward0"), 3.0),
        (("forward", "blocks.0 (Block)", "aten::mm"), 5.0),
        (("optimizer step", "aten::mul_"), 0.2),
    ]
    path = profiling.write_collapsed(stacks, tmp_path / "new" / "step.collapsed")  # folders made as needed
    # equal stacks merged, values whole, 0.2 rounds to nothing
    assert path.read_text() == "forward;blocks.0 (Block);aten::mm 12\nbackward;MmBackward0 3\n"
    back = profiling.parse_collapsed(path.read_text().splitlines())
    assert back == [(("forward", "blocks.0 (Block)", "aten::mm"), 12.0), (("backward", "MmBackward0"), 3.0)]
    again = profiling.write_collapsed(back, tmp_path / "again")
    assert profiling.parse_collapsed(again.read_text().splitlines()) == back
    with pytest.raises(ValueError, match="a;b"):
        profiling.write_collapsed([(("main", "a;b"), 1.0)], tmp_path / "bad")


def test_flame_labels_are_whole_where_they_fit_else_shortened_with_a_key():
    name = "blocks.1.attn (CausalSelfAttention)"
    assert profiling.flame_label(name, 1000, 7, 1) == name
    wide = profiling._text_pt(name, 7)
    assert profiling.flame_label(name, wide - 1, 7, 3) == "blocks.1.attn [3]"
    assert profiling.flame_label(name, profiling._text_pt("attn [3]", 7) + 1, 7, 3) == "attn [3]"
    assert profiling.flame_label("aten::scaled_dot_product_attention", 60, 7, 2).endswith("… [2]")
    assert profiling.flame_label(name, 5, 7, 3) is None
    stacks = [
        (("forward", name, "aten::scaled_dot_product_attention"), 30.0),
        (("backward", "MmBackward0"), 1.0),
        (("forward", "blocks.1.ffn (FeedForward)", "aten::mm"), 69.0),
    ]
    _, ax = plt.subplots(figsize=(4, 2))  # narrow: some names cannot fit
    profiling.plot_flame(stacks, ax=ax)
    texts = [t.get_text() for t in ax.texts]
    assert "forward" in texts and "aten::mm" in texts  # whole where they fit
    key = [t.get_text() for t in ax.get_legend().get_texts()]  # "[n] full name" per shortened label
    shortened = [t for t in texts if t.endswith("]")]
    frames = {f for stack, _ in stacks for f in stack}
    assert shortened and len(key) == len(shortened) and all(k.split("] ", 1)[1] in frames for k in key)


def test_forward_le_both_is_checked_on_paired_samples():
    cfg = model.get_config("small/cpu", n_layers=1)
    rows = benchmarking.time_size(cfg, 2, 16, warmup=1, steps=3)  # one interleaved loop on one model
    fwd = next(r for r in rows if r["pass"] == "forward")
    assert (
        fwd["pairs_vs_both"] == 3 and 0 < fwd["ratio_low_vs_both"] <= fwd["ratio_vs_both"] <= fwd["ratio_high_vs_both"]
    )
    assert "ratio_vs_both" not in rows[2]  # "both" is the baseline

    def frame(low):
        return pd.DataFrame(
            [
                {
                    "size": "s",
                    "pass": p,
                    "warm-up": w,
                    "status": "ok",
                    "ratio_vs_both": 1.2,
                    "ratio_low_vs_both": low,
                    "pairs_vs_both": 6,
                }
                for p in ("forward", "both")
                for w in (0, 2)
            ]
        )

    with pytest.raises(AssertionError, match="measurably slower"):
        benchmarking.check_forward_le_both(frame(1.1), 2)  # the interval above 1: the bound is broken
    benchmarking.check_forward_le_both(frame(0.9), 2)  # a median above 1 inside the noise is not a violation


def test_module_labels_are_nvtx_ranges_for_nsys(monkeypatch):
    """Issue 31: nsys was suggested but nothing emitted NVTX ranges; each labelled module opens and closes one."""
    ranges = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: ranges.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: ranges.append(("pop", None)))
    lm = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with profiling.label_modules(lm, nvtx=True):
        lm(torch.zeros(1, 2))
    assert ranges == [("push", "model (Sequential)"), ("push", "0 (Linear)"), ("pop", None), ("pop", None)]


@pytest.mark.parametrize("flagged", [True, False])
def test_the_device_copies_of_labelled_ranges_are_not_ops(flagged):
    """Issue 39 item 3: on CUDA the profiler adds a device-side event for every record_function range that launched
    kernels (gpu_user_annotation, PyTorch #130730), its 'self' time the range's whole span. It is no op: counted, it
    would double the kernels' time and could become the 'most expensive op'. Torch builds without the
    is_user_annotation flag: a device event named like a host event is one."""
    from types import SimpleNamespace as NS

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    gemm = "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN"
    flag = {"is_user_annotation": True} if flagged else {}
    averages = [
        NS(key="lm_head (Linear)", device_type=cpu, self_device_time_total=0.0, count=1),
        NS(key="aten::mm", device_type=cpu, self_device_time_total=0.0, count=1),
        NS(key=gemm, device_type=cuda, self_device_time_total=80.0, count=1, **({"is_user_annotation": False})),
        NS(key="lm_head (Linear)", device_type=cuda, self_device_time_total=85.0, count=1, **flag),
    ]
    if not flagged:
        del averages[2].is_user_annotation
    ops = [NS(name="aten::mm", device_type=cpu, self_device_time_total=80.0, kernels=[NS(name=gemm)])]
    prof = NS(device_type="cuda", events=lambda: ops, key_averages=lambda: averages)
    table = profiling.op_table(prof, steps=1)
    assert table["op"].tolist() == [gemm] and table["share"].tolist() == [1.0]


def _event(name, start, end, device="cpu"):
    from types import SimpleNamespace as NS

    kind = torch.autograd.DeviceType.CPU if device == "cpu" else torch.autograd.DeviceType.CUDA
    return NS(name=name, device_type=kind, time_range=NS(start=start, end=end))


def test_ddp_steps_and_fsdp_calls_come_from_the_hosts_ranges():
    """Issue 39 item 3: the device copy of the backward range (later, on the GPU's clock) must not become a step of
    its own, and a module range's device copy must not take a forward call's slot."""
    from helpers.experiments.common import BACKWARD_RANGE
    from helpers.experiments.ddp_speed import step_spans
    from helpers.experiments.fsdp_trace import forward_ranges

    events = [
        _event(BACKWARD_RANGE, 100, 200),
        _event("gloo:all_reduce", 150, 190),
        _event(BACKWARD_RANGE, 180, 260, device="cuda"),  # the GPU's copy of step 1's backward
        _event(BACKWARD_RANGE, 300, 400),
        _event("gloo:all_reduce", 350, 420),
    ]
    steps = step_spans(events)
    assert [s.backward for s in steps] == [(100, 200), (300, 400)]
    assert [s.comm for s in steps] == [[[150, 190]], [[350, 420]]]
    calls = [
        _event("layers.0 (Block)", 10, 20),
        _event("layers.0 (Block)", 12, 30, device="cuda"),
        _event("layers.1 (Block)", 20, 40),
        _event("layers.1 (Block)", 60, 80),  # its backward recomputation: past the forward calls
    ]
    got = forward_ranges(calls, {"layers.0", "layers.1"}, calls=2)
    assert [(e.name, e.time_range.start) for e in got] == [("layers.0 (Block)", 10), ("layers.1 (Block)", 20)]


def test_attention_parts_time_the_three_ops_and_count_their_flops():
    """Notebook 01 §3 / 2025 nsys_profile(e): the matmuls' FLOPs are FlopCounterMode's; the ratio pairs each round's
    softmax with that round's QKᵀ + PV; the saved rows end with the ratio."""
    from helpers.experiments import benchmarking_attention as BA

    cfg = model.get_config("small/cpu")
    parts = BA.attention_parts(cfg, batch=2, context=16, steps=6, warmup=1)
    b, h, t, d = parts.shape
    q, k = torch.randn(b, h, t, d), torch.randn(b, h, t, d)
    flops = BA.attention_flops(b, h, t, d)
    assert profiling.counted_flops(lambda: q @ k.transpose(-2, -1)) == flops["QKᵀ"] == flops["PV"]
    assert parts.flop_ratio == pytest.approx(5 / (4 * d))
    assert list(parts.table.index) == ["QKᵀ", "softmax", "PV"] and parts.ratio.pairs == 6
    assert (parts.table["median_s"] > 0).all() and parts.rows()[-1]["op"] == "softmax / (QKᵀ + PV)"
    assert parts.summary().startswith(f"At batch 2 x {h} heads x 16 x d_head {d}, softmax does")


def test_trace_ranges_read_the_chrome_trace_as_the_profilers_events(tmp_path):
    """ddp_speed.traced_steps reads its ranges from the Chrome trace (prof.events() cost seconds per traced step):
    the same host ranges, the same durations and gaps as prof.events(), on the trace's absolute clock; a GPU-side
    copy of a range is not the host's."""
    import json

    from torch.profiler import record_function

    with profiling.quiet_profiler(torch.device("cpu")) as prof:
        for _ in range(3):
            with record_function("## span ##"):
                torch.randn(64, 64) @ torch.randn(64, 64)
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    want = [e.time_range for e in prof.events() if e.name == "## span ##" and profiling.is_host_event(e)]
    got = [e.time_range for e in profiling.trace_ranges(tmp_path / "t.json", lambda n: n == "## span ##")]
    assert len(got) == len(want) == 3
    for g, w in zip(got, want, strict=True):
        assert g.end - g.start == pytest.approx(w.end - w.start, abs=0.01)  # µs; the trace keeps ns
        assert g.start - got[0].start == pytest.approx(w.start - want[0].start, abs=0.01)
    events = [{"ph": "X", "cat": "gpu_user_annotation", "name": "r", "ts": 5.0, "dur": 1.0}]
    events += [{"ph": "X", "cat": "user_annotation", "name": "r", "ts": 1.0, "dur": 2.0}]
    (tmp_path / "d.json").write_text(json.dumps({"traceEvents": events}))
    ranges = profiling.trace_ranges(tmp_path / "d.json", lambda n: True)
    assert [profiling.is_host_event(e) for e in ranges] == [False, True] and ranges[1].time_range.end == 3.0
