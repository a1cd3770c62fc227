"""DDP wrappers: every one trains exactly like one process on the full batch (gloo, CPU, 2 ranks), on a toy model
with a frozen, a tied and an unused parameter and ranks that start from different weights, with 1, 2, 3 and
unbounded buckets, and on a small Transformer; bucket planning; bad bucket sizes."""
import pytest
import torch

from helpers import ddp as D
from helpers import formulas as F
from helpers.experiments import common
from helpers.experiments import ddp as R
from helpers.launch import launch

STEPS, BATCH, CONTEXT = 3, 8, 6
TOY_SIZES = [p.numel() * p.element_size() for p in common.TiedToyModel().parameters() if p.requires_grad]


def _mb_for(n_buckets: int) -> float:
    """A bucket size (MB) that makes plan_buckets give the toy model exactly n_buckets."""
    for limit in sorted(set(TOY_SIZES) | {sum(TOY_SIZES[-k:]) for k in range(1, len(TOY_SIZES) + 1)}):
        if len(D.plan_buckets(TOY_SIZES, limit)) == n_buckets:
            return limit / D.MB
    raise AssertionError(f"no bucket size gives {n_buckets} buckets for sizes {TOY_SIZES}")


TOY_VARIANTS = [("naive", "naive", None), ("flat", "flat", None), ("per_parameter", "per_parameter", None),
                ("bucketed x1", "bucketed", _mb_for(1)), ("bucketed x2", "bucketed", _mb_for(2)),
                ("bucketed x3", "bucketed", _mb_for(3)), ("bucketed unbounded", "bucketed", None),
                ("torch_ddp", "torch_ddp", None)]


@pytest.fixture(scope="module")
def toy_runs():
    """One launch: every variant trained on 2 ranks; plus the single-process reference."""
    per_rank = launch(R.equivalence_worker, 2, "toy", TOY_VARIANTS, STEPS, BATCH, CONTEXT, backend="gloo", device="cpu")
    return per_rank, R.reference_training("toy", STEPS, BATCH, CONTEXT)


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
    trained = R.reference_training("toy", STEPS, BATCH, CONTEXT)
    assert not torch.equal(trained["fc.weight"], rank0["fc.weight"])
    assert not torch.equal(trained["emb.weight"], rank0["emb.weight"])
    assert torch.equal(trained["frozen.weight"], rank0["frozen.weight"])
    assert torch.equal(trained["unused"], rank0["unused"])


@pytest.mark.parametrize("label", [v[0] for v in TOY_VARIANTS])
def test_toy_equals_single_process(toy_runs, label):
    per_rank, reference = toy_runs
    for rank, out in enumerate(per_rank):
        state = out[label]["state"]
        assert state.keys() == reference.keys()
        for name in reference:
            torch.testing.assert_close(state[name], reference[name], msg=lambda m: f"{label}, rank {rank}, {name}: {m}")


@pytest.mark.parametrize("label, n", [("bucketed x1", 1), ("bucketed x2", 2), ("bucketed x3", 3),
                                      ("bucketed unbounded", 1)])
def test_bucket_counts(toy_runs, label, n):
    assert all(out[label]["buckets"] == n for out in toy_runs[0])


def test_transformer_equals_single_process():
    """small/8 with AdamW, 3 steps: naive, flat, per-parameter, bucketed (0.05 MB and one bucket)."""
    variants = [("naive", "naive", None), ("flat", "flat", None), ("per_parameter", "per_parameter", None),
                ("bucketed small", "bucketed", 0.05), ("bucketed one", "bucketed", None)]
    per_rank = launch(R.equivalence_worker, 2, "small/8", variants, 2, 4, 16, 0, "adamw", backend="gloo", device="cpu")
    reference = R.reference_training("small/8", 2, 4, 16, optimizer="adamw")
    assert per_rank[0]["bucketed small"]["buckets"] > 3
    for rank, out in enumerate(per_rank):
        for label, _, _ in variants:
            for name in reference:
                torch.testing.assert_close(out[label]["state"][name], reference[name],
                                           msg=lambda m: f"{label}, rank {rank}, {name}: {m}")


def test_overlap_fraction():
    assert R.overlap_fraction((0.0, 1.0), [(0.5, 1.5)]) == pytest.approx(0.5)
    assert R.overlap_fraction((0.0, 1.0), [(1.0, 2.0), (1.5, 3.0)]) == 0.0
    assert R.overlap_fraction((0.0, 1.0), [(0.2, 0.4), (0.3, 0.6), (0.9, 1.1)]) == pytest.approx(0.5 / 0.6)


def test_parameter_unused_on_one_rank_only():
    """Rank 1 skips a layer rank 0 uses: every wrapper still averages (rank 1 adds zeros), without hanging;
    launching in the order gradients arrive would pair different tensors across ranks here (gloo aborts)."""
    kinds = [("naive", None), ("flat", None), ("per_parameter", None), ("bucketed", None), ("bucketed", 1e-6),
             ("bucketed", 300 / D.MB)]
    per_rank = launch(R.uneven_worker, 2, kinds, backend="gloo", device="cpu", timeout_s=60)
    for rank, out in enumerate(per_rank):
        assert len(out) == len(kinds)
        for label, diff in out.items():
            assert diff < 1e-6, (rank, label, diff)


def test_profiler_traces_show_overlap_only_for_overlapped_variants(tmp_path):
    """speed_worker's traced steps: gloo's own all-reduce events vs the backward range, and a Chrome trace per rank."""
    variants = [("local", None, None), ("naive", "naive", None), ("per parameter", "per_parameter", None)]
    per_rank = launch(R.speed_worker, 2, "small/8", variants, 1, 0, 4, 16, 0, 1, 2, str(tmp_path),
                      backend="gloo", device="cpu")
    for rank, out in enumerate(per_rank):
        assert "traced" not in out["local"]
        for label in ("naive", "per parameter"):
            steps = out[label]["traced"]
            assert len(steps) == 2 and all(s["comm"] for s in steps), (rank, label)
            assert (tmp_path / f"{label.replace(' ', '_')}.rank{rank}.json").stat().st_size > 0
        naive = [R.overlap_fraction(s["backward"], s["comm"]) for s in out["naive"]["traced"]]
        ours = [R.overlap_fraction(s["backward"], s["comm"]) for s in out["per parameter"]["traced"]]
        assert naive == [0.0, 0.0] and min(ours) > 0.0, (rank, naive, ours)
        calls = len([p for p in R.make_model("small/8", 0).parameters() if p.requires_grad])
        assert all(len(s["comm"]) == calls for s in out["naive"]["traced"])  # one gloo event per all-reduce


def zeroed_views_worker(steps: int) -> dict:
    """DDPBucketed driven with zero_grad(set_to_none=False) and no on_train_batch_start: backward adds into zeroed
    bucket views in place; the weights must match the usual set_to_none loop."""
    import torch.distributed as dist

    rank, out = dist.get_rank(), {}
    for mode in ("set_to_none", "zeroed views"):
        model = R.make_model("toy", 0)
        ddp = D.DDPBucketed(model, _mb_for(2))
        opt = R.make_optimizer(ddp.parameters(), "sgd")
        for x, y in R.make_batches("toy", steps, BATCH, CONTEXT, 0):
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
            for p in ddp.params)
    return out


def test_zeroed_gradient_views_accumulate_in_place():
    for rank, out in enumerate(launch(zeroed_views_worker, 2, STEPS, backend="gloo", device="cpu")):
        assert out["set_to_none grads are views"] and out["zeroed views grads are views"], rank
        for key, value in out["set_to_none"].items():
            torch.testing.assert_close(out["zeroed views"][key], value, rtol=0, atol=0, msg=f"rank {rank} {key}")


def rewrap_worker(steps: int) -> dict:
    """Wrap one model twice (as a re-run notebook cell does) and train through the second wrapper."""
    import torch.distributed as dist

    model = R.make_model("toy", dist.get_rank())
    D.DDPBucketed(model, None)  # the first wrapper: its hooks must go when the model is wrapped again
    ddp = D.DDPBucketed(model, None)
    opt = R.make_optimizer(ddp.parameters(), "sgd")
    for batch in R.make_batches("toy", steps, BATCH, CONTEXT):
        common.train_step(model, opt, *common.rank_share(batch), grad_sync=ddp)
    ddp.close()
    hooks_left = sum(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters())
    return {"state": R.cpu_state(model), "hooks_left": hooks_left}


def test_wrapping_a_model_twice_trains_like_one_process():
    per_rank = launch(rewrap_worker, 2, STEPS, backend="gloo", device="cpu")
    reference = R.reference_training("toy", STEPS, BATCH, CONTEXT)
    for out in per_rank:
        assert out["hooks_left"] == 0
        for key, want in reference.items():
            torch.testing.assert_close(out["state"][key], want, msg=lambda m: f"{key}: {m}")
