"""DDP wrappers: every one computes the gradient one process computes on the full batch (gloo, CPU, 2 ranks), on a
toy model with a frozen, a tied and an unused parameter and ranks that start from different weights, with 1, 2, 3
and unbounded buckets, and on a small Transformer; bucket planning; bad bucket sizes. Gradients are compared with a
bound derived from float32 summation (helpers.experiments.ddp.gradient_bound), so the checks hold on any CPU."""

import copy
import functools

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers import ddp as D
from helpers.experiments import common
from helpers.experiments import ddp as R
from helpers.launch import launch

TOY = R.EQUIVALENCE["toy"]


@pytest.fixture(scope="module")
def toy_checks():
    """One launch: every toy variant trained on 2 ranks, each step checked against one process."""
    return R.check_equivalence("toy", R.toy_variants()).set_index("variant")


def test_plan_buckets_reverse_order_and_limits():
    sizes = [100, 40, 30, 80, 10]
    assert D.plan_buckets(sizes, float("inf")) == [[4, 3, 2, 1, 0]]
    assert D.plan_buckets(sizes, 100) == [[4, 3], [2, 1], [0]]
    assert D.plan_buckets(sizes, 50) == [[4], [3], [2], [1], [0]]  # larger than the limit: alone
    for limit in (1, 50, 90, 120, 1000):
        buckets = D.plan_buckets(sizes, limit)
        assert sorted(i for b in buckets for i in b) == list(range(len(sizes)))
        assert all(len(b) == 1 or sum(sizes[i] for i in b) <= limit for b in buckets)


@pytest.mark.parametrize("bad", [0, -1, -0.5, float("nan")])
def test_bad_bucket_size_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="bucket_size_mb must be > 0"):
        D.DDPBucketed(common.TiedToyModel(), bucket_size_mb=bad)


def test_ranks_start_different_and_training_moves_weights():
    """Preconditions that make the equivalence checks able to fail: the broadcast matters, training changes weights."""
    rank0, rank1 = R.make_model("toy", 0).state_dict(), R.make_model("toy", 1).state_dict()
    assert all(not torch.equal(rank0[k], rank1[k]) for k in rank0)
    trained = R.reference_training("toy", TOY["steps"], TOY["batch_size"], TOY["context_length"])
    assert not torch.equal(trained["fc.weight"], rank0["fc.weight"])
    assert not torch.equal(trained["emb.weight"], rank0["emb.weight"])
    assert torch.equal(trained["frozen.weight"], rank0["frozen.weight"])
    assert torch.equal(trained["unused"], rank0["unused"])


def test_a_reference_is_reused_only_for_bitwise_equal_weights_and_batch():
    """gradient_checks shares one process's reference between variants by a digest of the weights and the batch: one
    ulp, another dtype or another shape is another reference."""
    from helpers.experiments.ddp_equivalence import _digest

    w = torch.randn(4, 3)
    assert _digest([w, torch.arange(3)]) == _digest([w.clone(), torch.arange(3)])
    bumped = w.clone()
    bumped[1, 2] = torch.nextafter(bumped[1, 2], torch.tensor(float("inf")))
    assert _digest([bumped]) != _digest([w])
    assert _digest([w.view(torch.int32)]) != _digest([w]) and _digest([w.reshape(3, 4)]) != _digest([w])
    assert _digest([w.t()]) == _digest([w.t().contiguous()])  # the values in order, whatever the strides


@pytest.mark.parametrize("name", ["toy", "small/cpu"])
def test_gradient_scale_covers_the_gradient(name):
    """Σ|term| >= |Σ term| per element (so the hooks saw every term), and one process's float32 gradient is within
    half the bound of the float64 one."""
    model, (x, y) = R.make_model(name, 0), R.make_batches(name, 1, 4, 6)[0]
    grads, scale = R.reference_gradients(model, x, y)
    m64 = copy.deepcopy(model).double()
    common.lm_loss(m64(x), y).backward()
    for n, p in m64.named_parameters():
        if n in grads:
            g64 = p.grad if p.grad is not None else torch.zeros_like(p)
            assert (scale[n].double() >= g64.abs() * (1 - 1e-6)).all(), n
            assert ((grads[n].double() - g64).abs() <= R.gradient_bound(scale[n], x.numel()).double() / 2).all(), n


@pytest.mark.parametrize("label", [v[0] for v in R.toy_variants()])
def test_toy_equals_single_process(toy_checks, label):
    R.assert_equivalent(toy_checks.loc[[label]].reset_index())


@pytest.mark.parametrize(
    "label, n", [("bucketed x1", 1), ("bucketed x2", 2), ("bucketed x3", 3), ("bucketed unbounded", 1)]
)
def test_bucket_counts(toy_checks, label, n):
    assert toy_checks.loc[label, "buckets"] == n


def test_transformer_equals_single_process():
    """small/cpu with AdamW: each step's synced gradient vs one process's (weights only checked to agree across ranks:
    AdamW's g/√v turns a rounding difference in a near-zero gradient into one of order lr)."""
    checks = R.check_equivalence("small/cpu", R.transformer_variants())
    assert checks.set_index("variant").loc["bucketed 0.05 MB", "buckets"] > 3
    R.assert_equivalent(checks)


def test_overlap_fraction():
    assert R.overlap_fraction((0.0, 1.0), [(0.5, 1.5)]) == pytest.approx(0.5)
    assert R.overlap_fraction((0.0, 1.0), [(1.0, 2.0), (1.5, 3.0)]) == 0.0
    assert R.overlap_fraction((0.0, 1.0), [(0.2, 0.4), (0.3, 0.6), (0.9, 1.1)]) == pytest.approx(0.5 / 0.6)


def uneven_worker(*, kinds) -> dict[str, float]:
    """Rank 1 skips a layer that rank 0 uses: each kind's synced gradients vs the mean of both ranks' own (max diff)."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))  # (4, 8) per rank
    forward = (lambda m: m[2](m[1](m[0](x)))) if rank == 0 else (lambda m: m[2](m[0](x)))
    forward(base).pow(2).mean().backward()
    own = [p.grad if p.grad is not None else torch.zeros_like(p) for p in base.parameters()]
    mean = []
    for g in own:
        parts = [torch.empty_like(g) for _ in range(2)]
        dist.all_gather(parts, g.contiguous())
        mean.append(torch.stack(parts).mean(0))
    out = {}
    for kind, mb in kinds:
        ddp = D.wrap(kind, copy.deepcopy(base), mb)
        ddp.on_train_batch_start()
        ddp.module.zero_grad(set_to_none=True)  # after it, on purpose: the hooks must copy into the buckets
        forward(ddp.module).pow(2).mean().backward()
        ddp.finish_gradient_synchronization()
        out[f"{kind} {mb}"] = max(
            float((p.grad - m).abs().max()) for p, m in zip(ddp.module.parameters(), mean, strict=True)
        )
    return out


def test_parameter_unused_on_one_rank_only():
    """Rank 1 skips a layer rank 0 uses: every wrapper still averages (rank 1 adds zeros), without hanging;
    launching in the order gradients arrive would pair different tensors across ranks here (gloo aborts)."""
    kinds = [
        ("naive", None),
        ("flat", None),
        ("per_parameter", None),
        ("bucketed", None),
        ("bucketed", 1e-6),
        ("bucketed", 300 / D.MB),
    ]
    per_rank = launch(functools.partial(uneven_worker, kinds=kinds), 2, backend="gloo", device="cpu", timeout_s=60)
    for rank, out in enumerate(per_rank):
        assert len(out) == len(kinds)
        for label, diff in out.items():
            assert diff < 1e-6, (rank, label, diff)  # (a + b)/2 two ways: within a few ulps of values ~1


def test_profiler_traces_show_overlap_only_for_overlapped_variants(tmp_path):
    """speed_worker's traced steps: gloo's own all-reduce events vs the backward range, and a Chrome trace per rank;
    with trace_shown, only §3's variants (flat is not one) are profiled."""
    variants = [("local", None, None), ("naive", "naive", None), ("per_parameter", "per_parameter", None)]
    variants.append(("flat", "flat", None))
    worker = functools.partial(
        R.speed_worker,
        model="small/cpu",
        variants=variants,
        steps=1,
        warmup=0,
        batch_size=4,
        context_length=16,
        timeline_steps=1,
        traced=2,
        trace_dir=str(tmp_path),
        trace_shown=True,
    )
    per_rank = launch(worker, 2, backend="gloo", device="cpu")
    for rank, out in enumerate(per_rank):
        assert out["local"].traced is None and out["flat"].traced is None
        assert not (tmp_path / f"flat.rank{rank}.json").exists()
        for label in ("naive", "per_parameter"):
            steps = out[label].traced
            assert len(steps) == 2 and all(s.comm for s in steps), (rank, label)
            assert (tmp_path / f"{label.replace(' ', '_')}.rank{rank}.json").stat().st_size > 0
        naive = [R.overlap_fraction(s.backward, s.comm) for s in out["naive"].traced]
        ours = [R.overlap_fraction(s.backward, s.comm) for s in out["per_parameter"].traced]
        assert naive == [0.0, 0.0] and min(ours) > 0.0, (rank, naive, ours)
        calls = len([p for p in R.make_model("small/cpu", 0).parameters() if p.requires_grad])
        assert all(len(s.comm) == calls for s in out["naive"].traced)  # one gloo event per all-reduce


def zeroed_views_worker(*, steps: int) -> dict:
    """DDPBucketed driven with zero_grad(set_to_none=False) and no on_train_batch_start: backward adds into zeroed
    bucket views in place; the weights must match the usual set_to_none loop."""
    rank, out = dist.get_rank(), {}
    for mode in ("set_to_none", "zeroed views"):
        model = R.make_model("toy", 0)
        ddp = D.DDPBucketed(model, R.bucket_mb_for(2))
        opt = R.make_optimizer(ddp.parameters(), "sgd")
        for x, y in R.make_batches("toy", steps, TOY["batch_size"], TOY["context_length"], 0):
            x, y = x[rank::2], y[rank::2]  # this rank's half
            if mode == "set_to_none":
                common.train_step(ddp.module, opt, x, y, grad_sync=ddp)
                continue
            opt.zero_grad(set_to_none=False)
            common.lm_loss(ddp(x), y).backward()  # helpers.model.lm_loss
            ddp.finish_gradient_synchronization()
            opt.step()
        out[mode] = {k: v.clone() for k, v in model.state_dict().items()}
        out[mode + " grads are views"] = all(
            p.grad.untyped_storage().data_ptr() in {b.untyped_storage().data_ptr() for b in ddp.bucket_buffers}
            for p in ddp.params
        )
    return out


def test_zeroed_gradient_views_accumulate_in_place():
    """Exact: both loops run the same kernels on the same shapes in the same order in one process (x + 0 == x);
    only where the gradient is stored differs, so the bits must too."""
    for rank, out in enumerate(
        launch(functools.partial(zeroed_views_worker, steps=TOY["steps"]), 2, backend="gloo", device="cpu")
    ):
        assert out["set_to_none grads are views"] and out["zeroed views grads are views"], rank
        for key, value in out["set_to_none"].items():
            torch.testing.assert_close(out["zeroed views"][key], value, rtol=0, atol=0, msg=f"rank {rank} {key}")


def rewrap_worker(*, steps: int) -> dict:
    """Wrap one model twice (as a re-run notebook cell does) and train through the second wrapper, checked each step."""
    model = R.make_model("toy", dist.get_rank())
    D.DDPBucketed(model, None)  # the first wrapper: its hooks must go when the model is wrapped again
    ddp = D.DDPBucketed(model, None)
    opt = R.make_optimizer(ddp.parameters(), "sgd")
    run = R.gradient_checks("toy", ddp, opt, R.make_batches("toy", steps, TOY["batch_size"], TOY["context_length"]))
    ddp.close()
    return {**run, "hooks_left": sum(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters())}


def test_wrapping_a_model_twice_trains_like_one_process():
    for out in launch(functools.partial(rewrap_worker, steps=TOY["steps"]), 2, backend="gloo", device="cpu"):
        assert out["hooks_left"] == 0
        assert out["start_equal"] and out["weight_ratio"] <= 1
        assert all(s.max_ratio <= 1 for s in out["steps"]), out["steps"]


def _runs(per_variant: dict) -> list[dict]:
    """Two ranks' SpeedRuns with the given step seconds (the same on both ranks)."""
    run = lambda t: R.SpeedRun(step=list(t), comm=[0.0] * len(t), backward=list(t), timeline=[], buckets=None)  # noqa: E731
    return [{k: run(t) for k, t in per_variant.items()} for _ in range(2)]


def test_comparisons_name_a_winner_only_outside_the_noise():
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    base = 1.0 + 0.3 * rng.standard_normal(40)
    same = _runs({"a": base, "b": base[::-1].copy(), "c": 3 * base})
    assert not R.paired_variants(same, "a", "b").differs
    assert R.paired_variants(same, "c", "a").median == pytest.approx(3.0)
    assert R.fastest_text(same, ["a", "b"]).startswith("no measurable fastest")
    assert R.fastest_text(same, ["a", "c"]).startswith("fastest a")
    sweep = pd.DataFrame({"variant": ["bucketed 1 MB", "bucketed 5 MB"], "bucket_MB": [1.0, 5.0]})
    text = R.sweep_optimum_text(_runs({"bucketed 1 MB": base, "bucketed 5 MB": base[::-1].copy()}), sweep)
    assert "not measurably slower" in text


def test_alpha_beta_falls_back_to_notebook_03s_grid(monkeypatch):
    from helpers.experiments import collectives

    seen = {}

    def fake_grid(sizes, **kw):
        seen.update(sizes=sizes, **kw)
        import pandas as pd

        t = [1e-4 + s / 1e9 for s in sizes]
        return pd.DataFrame(
            {
                "backend": "gloo",
                "device": "cpu",
                "world_size": 2,
                "op": "all_reduce",
                "size_bytes": list(sizes),
                "time_s": t,
                "p25_s": t,
                "wrong": 0,
            }
        ), None

    monkeypatch.setattr(collectives, "run_grid", fake_grid)
    monkeypatch.setattr("helpers.results.load_results", lambda *a, **k: (_ for _ in ()).throw(FileNotFoundError()))
    fit, source = R.alpha_beta("cpu", "gloo", "cpu")
    grid = collectives.PROFILE_GRID["cpu"]
    assert seen["sizes"] == grid["sizes"] and seen["iters"] == grid["iters"] and seen["budget_s"] == grid["budget_s"]
    assert fit.alpha_s == pytest.approx(1e-4, rel=1e-6) and "notebook 03's cpu grid" in source


def dropped_wrapper_worker() -> dict:
    """Train one step through DDPBucketed, drop it (closed or not) with the garbage collector off: is it freed?"""
    import gc
    import weakref

    gc.disable()
    try:
        freed = {}
        for closed in (True, False):
            model = R.make_model("toy", dist.get_rank())
            ddp = D.DDPBucketed(model, None)
            opt = R.make_optimizer(ddp.parameters(), "sgd")
            R.gradient_checks("toy", ddp, opt, R.make_batches("toy", 1, TOY["batch_size"], TOY["context_length"]))
            if closed:
                ddp.close()
            ref = weakref.ref(ddp)
            del ddp, opt
            freed["closed" if closed else "dropped"] = ref() is None
        return freed
    finally:
        gc.enable()


def test_a_dropped_wrapper_is_freed_without_a_garbage_collection():
    """Issue 31 item 7: notebook 05 builds xl three times on one GPU; a wrapper kept alive by a reference cycle keeps
    its bucket buffers (a model's worth of gradients) until a full collection, which may come too late."""
    for out in launch(dropped_wrapper_worker, 2, backend="gloo", device="cpu"):
        assert out == {"closed": True, "dropped": True}, out


class _FakeEvent:
    """A CUDA event stand-in: a device time in ms, and elapsed_time as torch.cuda.Event gives it."""

    def __init__(self, ms: float):
        self.ms = ms

    def elapsed_time(self, end: "_FakeEvent") -> float:
        return end.ms - self.ms


def test_nccl_spans_and_backward_are_read_on_the_device_clock():
    """Issue 31 item 8: with NCCL the host returns from backward() and Work.wait() at once, so host times read ~0
    communication and 100 % overlap; events put backward and each all-reduce on the device's clock. Here the
    all-reduce runs from 8 to 30 ms of a backward 0-20 ms: 10 of its 22 ms outside backward."""
    times = {"backward": (100.0, 100.001), "backward_events": (_FakeEvent(5.0), _FakeEvent(25.0))}
    step = R.step_intervals(times, [[_FakeEvent(13.0), _FakeEvent(35.0)]])
    assert step.backward == pytest.approx((0.0, 0.020)) and step.comm == [pytest.approx([0.008, 0.030])]
    assert R.overlap_fraction(step.backward, step.comm) == pytest.approx(12 / 22)
    host = R.step_intervals(times, [[100.0002, 100.0008]])  # gloo: perf_counter pairs, as they were
    assert host.backward == (100.0, 100.001) and host.comm == [[100.0002, 100.0008]]


def test_wait_clock_on_the_cpu_counts_host_time():
    import time

    from helpers.timing import WaitClock

    clock = WaitClock()
    with clock.waiting(torch.device("cpu")):
        time.sleep(0.02)
    assert 0.02 <= clock.seconds < 1.0


def test_on_a_gpu_with_host_spans_the_backward_is_timed_as_the_device_ran_it(monkeypatch):
    """Issue 39 item 5: with gloo on CUDA tensors the all-reduce spans are host times, but the host returns from
    backward() once its kernels are queued: all-reduces the GPU's backward hides would count as exposed. With
    device_backward the device is synchronized right before and after backward, so (b0, b1) is when it ran."""
    import contextlib

    order = []
    monkeypatch.setattr(common, "sync", lambda dev: order.append("sync"))

    @contextlib.contextmanager
    def backward_range(name):
        order.append("backward starts")
        yield
        order.append("backward ends")

    monkeypatch.setattr(common, "record_function", backward_range)
    net = common.make_model("toy", seed=0)
    x, y = common.make_batches("toy", 1, 2, 8, seed=0)[0]
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for device_backward, expected in [
        (False, ["backward starts", "backward ends"]),
        (True, ["sync", "backward starts", "backward ends", "sync"]),
    ]:
        order.clear()
        common.train_step(net, opt, x, y, device_backward=device_backward)
        assert order == expected
