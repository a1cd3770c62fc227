"""Profiler tables and op classes, the flame-graph builder, FLOPs vs FlopCounterMode, MFU peaks, autocast dtypes."""
import pytest
import torch

from helpers import formulas, model, profiling
from helpers.experiments import benchmarking
from helpers.experiments.common import train_step

TOLERANCE = 0.01  # analytic training FLOPs vs FlopCounterMode (they agree exactly for this model)


@pytest.fixture(scope="module")
def tiny():
    cfg = model.get_config("small/8", n_layers=1)
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


def test_train_flops_match_flop_counter(tiny):
    lm, _, x, y = tiny
    for size, B, T in [(lm.cfg, 2, 16), (model.get_config("medium/8", n_layers=2), 1, 128)]:
        net = lm if size is lm.cfg else model.build_model(size)
        xs, ys = model.random_batch(size, batch_size=B, context_length=T)
        counted = profiling.counted_flops(lambda: model.lm_loss(net(xs), ys).backward())
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
    seen = benchmarking.autocast_dtypes(benchmarking.MixedPrecisionToyModel(), torch.randn(4, 10), torch.randint(5, (4,)))
    assert seen["parameters"] == "torch.float32" and seen["gradients"] == "torch.float32"
    assert seen["fc1 output"] == "torch.bfloat16" and seen["logits"] == "torch.bfloat16"
    assert seen["loss"] == "torch.float32"


def test_time_size_rows_per_pass_and_oom_is_recorded(monkeypatch):
    cfg = model.get_config("small/8", n_layers=1)
    rows = benchmarking.time_size(cfg, 2, 16, warmup=1, steps=2, autocast_dtype=torch.bfloat16)
    assert [r["pass"] for r in rows] == ["forward", "backward", "both"]
    assert all(r["status"] == "ok" and r["steps"] == 2 and r["precision"] == "autocast bfloat16" for r in rows)
    assert all(0 < r["first_s"] and 0 < r["median_s"] for r in rows)

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(benchmarking, "build_model", out_of_memory)
    rows = benchmarking.time_size(cfg, 2, 16, warmup=0, steps=1, kinds=("both",))
    assert rows == [{"size": cfg, "pass": "both", "warm-up": 0, "precision": "fp32", "mean_s": None,
                     "median_s": None, "std_s": None, "status": "OOM"}]


def test_pass_fn_refuses_unknown_kind(tiny):
    lm, _, x, y = tiny
    with pytest.raises(ValueError, match="forward"):
        benchmarking.pass_fn(lm, x, y, "sideways")
