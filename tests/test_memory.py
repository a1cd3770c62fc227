"""The memory tracker on allocation patterns with known byte counts, and the analytic accounting of a step."""

import pytest
import torch

from helpers import formulas, memory, model
from helpers.experiments import benchmarking
from helpers.experiments.common import train_step

KiB = 1024


def test_tracker_exact_peak_and_current():
    def pattern():
        a = torch.empty(256, dtype=torch.float32)  # 1 KiB
        b = torch.empty(512, dtype=torch.float32)  # 2 KiB
        c = torch.empty(1024, dtype=torch.float64)  # 8 KiB -> 11 KiB live
        del b  # 9 KiB
        d = torch.empty(128, dtype=torch.int64)  # 1 KiB -> 10 KiB
        return a, c, d

    trace = memory.track(pattern)
    assert trace.peak_bytes == 11 * KiB
    assert trace.current_bytes == 10 * KiB
    assert max(b for _, b in trace.timeline) == trace.peak_bytes
    assert [round(r["MiB"] * 2**20) for r in trace.largest(3)] == [8 * KiB, 1 * KiB, 1 * KiB]
    assert [round(r["MiB"] * 2**20) for r in trace.largest(3, at_peak=True)] == [8 * KiB, 2 * KiB, 1 * KiB]


def test_the_storages_live_at_the_peak_are_those_a_snapshot_at_each_new_peak_finds():
    """peak_ids (rebuilt from the order of allocations and frees) against the sizes live at each new peak: the i-th
    allocation is i + 1 floats, so its bytes name it."""
    gen, live, snapshot = torch.Generator().manual_seed(0), [], {}

    def pattern():
        peak = 0
        for i in range(300):
            if live and torch.rand((), generator=gen) < 0.45:
                live.pop(int(torch.randint(len(live), (), generator=gen)))
            else:
                live.append(torch.empty(i + 1, dtype=torch.float32))
            now = sum(t.untyped_storage().nbytes() for t in live)
            if now > peak:
                peak, snapshot["sizes"] = now, sorted(t.untyped_storage().nbytes() for t in live)

    trace = memory.track(pattern)
    assert sorted(trace.history[i].nbytes for i in trace.peak_ids) == snapshot["sizes"]
    assert trace.peak_bytes == sum(snapshot["sizes"])


def test_a_tensor_a_backend_thread_drops_just_after_the_run_is_not_counted_live(monkeypatch):
    """Under a process group, track() lets the backend's threads finish releasing what the run gave them before it
    reads what is live (gloo drops a finished work, and what it allocated here, from its own thread, which needs the
    GIL): here a thread stands for it, dropping 4 MiB made in the run as soon as it gets the GIL after the run."""
    import threading

    monkeypatch.setattr(memory, "_backend_threads", lambda: True)
    held, done = [], threading.Event()

    def backend():
        done.wait()
        held.clear()  # the tensor dies here, on this thread

    def run():
        held.append(torch.ones(1 << 20))  # (2**20,) fp32, made under the tracker
        threading.Thread(target=backend).start()
        done.set()

    trace = memory.track(run)
    assert trace.peak_bytes == 4 * 2**20 and trace.current_bytes == 0  # read once the thread let go


def test_tracker_views_and_inplace_are_not_new_storage():
    base = torch.zeros(1000)
    trace = memory.track(lambda: (base.view(10, 100), base.add_(1), base[::2]), existing=[base])
    assert trace.baseline_bytes == trace.peak_bytes == trace.current_bytes == 4000


def test_tracker_names_op_and_module():
    lin = torch.nn.Linear(8, 16, bias=False)
    trace = memory.track(lambda: lin(torch.ones(64, 8)), existing=lin.parameters(), model=lin)
    out = trace.largest(1)[0]
    assert out["op"] == "mm" and out["module"] == "Linear" and out["MiB"] * 2**20 == 64 * 16 * 4


def test_analytic_state_bytes_match_a_measured_adamw_step():
    cfg = model.get_config("small/cpu", n_layers=1)
    lm = model.build_model(cfg)
    opt = torch.optim.AdamW(lm.parameters())
    x, y = model.random_batch(cfg, batch_size=2, context_length=16)
    trace = memory.track(lambda: train_step(lm, opt, x, y), existing=memory.model_state(lm, None, x, y), model=lm)
    params = list(lm.parameters())
    state = [t for s in opt.state.values() for t in s.values()]
    assert trace.baseline_bytes == formulas.param_bytes(cfg) + formulas.buffer_bytes(cfg) + 2 * 2 * 16 * 8
    assert sum(trace.live[memory.storage_key(p.grad)].nbytes for p in params) == formulas.param_bytes(cfg)
    assert sum(t.untyped_storage().nbytes() for t in state) == formulas.adamw_state_bytes(cfg)
    # everything the step leaves live is parameters, gradients and optimizer state (loss is a 4-byte scalar)
    assert trace.current_bytes == trace.baseline_bytes + formulas.param_bytes(cfg) + formulas.adamw_state_bytes(cfg) + 4


@pytest.mark.parametrize("size", ["small/cpu", "small-2026/cpu"])  # GELU and learned positions; SwiGLU and RoPE
def test_saved_activations_and_peak_match_analytic(size):
    cfg = model.get_config(size)
    lm = model.build_model(cfg)
    opt = torch.optim.AdamW(lm.parameters())
    B, T = 8, 64
    x, y = model.random_batch(cfg, batch_size=B, context_length=T)
    train_step(lm, opt, x, y)  # creates the AdamW state
    lm.zero_grad(set_to_none=True)
    fwd = memory.track(lambda: model.lm_loss(lm(x), y), existing=memory.model_state(lm, opt, x, y))
    saved = fwd.current_bytes - fwd.baseline_bytes
    expected = sum(formulas.activation_bytes(cfg, B, T).values())
    assert saved == expected
    step = memory.track(lambda: train_step(lm, opt, x, y), existing=memory.model_state(lm, opt, x, y))
    predicted = sum(formulas.peak_breakdown(cfg, B, T).values())
    if cfg.arch == "basics":  # the peak comes later, in the last block's SwiGLU backward: up to 3 d_ff-wide gradients
        assert predicted < step.peak_bytes <= predicted + 3 * B * T * cfg.d_ff * 4  # while its saved ones still live
        return
    assert step.peak_bytes == predicted  # activations dominate at this shape: the peak is backward's start
    table = benchmarking.breakdown_table(step, lm, opt, x, y)  # notebook 01's table: measured == analytic, per kind
    assert table["live at the peak (measured)"].tolist() == table["live at the peak (analytic)"].tolist()
    assert table.loc["total", "live at the peak (measured)"] == step.peak_bytes / 2**20


def test_residual_stream_formula():
    assert formulas.residual_stream_bytes(16, 128, 2560) == 20 * 2**20  # 2.7B, fp32: 20 MiB
    assert formulas.residual_stream_bytes(2, 3, 4, torch.bfloat16) == 48


def test_timeline_from_a_synthetic_cuda_snapshot():
    trace = [
        {"action": "alloc", "size": 512},
        {"action": "alloc", "size": 1024},
        {"action": "free_requested", "size": 512},
        {"action": "free_completed", "size": 512},
        {"action": "alloc", "size": 2048},
    ]
    points = memory.timeline_from_snapshot({"device_traces": [trace]})
    assert [b for _, b in points] == [512, 1536, 1536, 1024, 3072]


def test_step_peaks_full_step_above_forward_and_state_counted():
    cfg = model.get_config("small/cpu", n_layers=1)
    traces = benchmarking.step_peaks(cfg, 2, 16)
    state = formulas.param_bytes(cfg) + formulas.buffer_bytes(cfg) + formulas.adamw_state_bytes(cfg) + 2 * 2 * 16 * 8
    assert traces["forward"].baseline_bytes == traces["full step"].baseline_bytes == state  # exact
    assert traces["full step"].peak_bytes > traces["forward"].peak_bytes > state


def test_peak_rows_and_timelines_of_a_tiny_model():
    cfg = model.get_config("small/cpu", n_layers=1)
    peaks = benchmarking.peak_rows([cfg], 2, 16, [torch.bfloat16])
    assert peaks[["precision", "pass"]].values.tolist() == [
        ["fp32", "forward"],
        ["fp32", "full step"],
        ["autocast bfloat16", "forward"],
        ["autocast bfloat16", "full step"],
    ]
    assert (peaks["status"] == "ok").all() and peaks["allocator_peak_MiB"].isna().all()  # CPU: no allocator peak
    table = peaks.assign(size="tiny").pivot_table(index="size", columns=["pass", "precision"], values="peak_MiB")
    assert (table["full step"] > table["forward"]).all().all()
    assert "autocast bfloat16: full-step peak" in benchmarking.peak_summary(table)
    fig = benchmarking.plot_timelines(benchmarking.step_peaks(cfg, 2, 16))
    assert len(fig.axes[0].lines) == 2


def test_track_resizing_sees_a_storage_grown_and_freed_in_place():
    from helpers.memory import track_resizing

    buf = torch.empty(0)

    def gather_and_free():
        buf.untyped_storage().resize_(1024 * 4)  # 1024 fp32 elements' worth, as FSDP's gathered buffer
        y = torch.ones(10)  # an op after the growth: the watcher re-reads every storage's size
        buf.untyped_storage().resize_(0)
        return y + 1

    trace = track_resizing(gather_and_free, existing=[buf])
    assert trace.peak_bytes >= 4096 and trace.current_bytes < 4096


def test_one_blocks_saved_bytes_and_gradients_are_the_closed_forms_and_a_wrong_form_is_caught(monkeypatch, tmp_path):
    """memory_profiling (f) on the handout's model: what block 0 keeps after the forward, by op, equals
    formulas.block_saved_parts byte for byte (SwiGLU's four d_ff-wide tensors, RoPE's rotated q and k), its
    gradients its parameters' bytes; a closed form off by one byte fails the section."""
    from helpers.experiments import block_memory as BM

    monkeypatch.setattr("helpers.results.DATA_DIR", tmp_path)
    r = BM.block_memory_section("small-2026/cpu", batch_size=2, contexts=(8, 16), profile="cpu")
    assert [row["saved_MiB"] for row in r.values["rows"]] == [row["saved_formula_MiB"] for row in r.values["rows"]]
    assert "mul" in r.values["rows"][0]["top5_ops"] and "byte for byte" in r.notes[0]
    right = formulas.block_saved_parts
    monkeypatch.setattr(BM.formulas, "block_saved_parts", lambda *a: {**right(*a), "one byte more": 1})
    with pytest.raises(AssertionError, match="formula"):
        BM.block_memory_section("small-2026/cpu", batch_size=2, contexts=(8,), profile="cpu")


def test_optimizer_state_is_found_in_whatever_holds_the_optimizers():
    """A torch optimizer, a plain class keeping one per shard, and a wrapper that is an optimizer holding another
    (torch's ZeroRedundancyOptimizer: its .optim): the state of each found once, and nothing in a holder of none."""
    net = torch.nn.Linear(4, 3)  # weight (3, 4), bias (3,)
    net(torch.randn(2, 4)).sum().backward()
    inner = [torch.optim.AdamW([p]) for p in net.parameters()]
    for opt in inner:
        opt.step()
    moments = {id(t) for opt in inner for s in opt.state.values() for t in s.values() if t.dim()}

    class Plain:  # no torch.optim.Optimizer: an inner one per shard
        def __init__(self):
            self.shards = {"mine": inner}

    class Wrapper(torch.optim.SGD):
        def __init__(self):
            super().__init__(net.parameters(), lr=0.1)
            self.optim = inner[0]

    for holder, want in ((inner[0], 3), (Plain(), 6), (Wrapper(), 3)):
        got = memory.optimizer_state(holder)  # exp_avg, exp_avg_sq and step per parameter
        assert len(got) == want and len({id(t) for t in got}) == want
    assert {id(t) for t in memory.optimizer_state(Plain()) if t.dim()} == moments
    assert memory.optimizer_state(object()) == [] and memory.model_state(net, Plain())[:2] == list(net.parameters())
