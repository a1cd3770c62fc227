"""Sharded optimizers train bit for bit like the unsharded one (AdamW and SGD with momentum, param groups, a group
added late, odd tensor sizes, a frozen, a tied and an unused parameter; 1 and 2 ranks, gloo, CPU); partitioning;
the bytes handed to collectives; state-dict round trips across world sizes; the memory calculator against a run."""

import copy
from functools import partial

import numpy as np
import pytest
import torch

from helpers import formulas as F
from helpers import sharding as S
from helpers.experiments import common
from helpers.experiments import sharding as SR
from helpers.launch import launch
from helpers.model import count_parameters

KINDS = ["unsharded", "sharded", "naive_sharded", "zero1"]
BATCH, CONTEXT = 8, 16
CONFIGS = [("uneven", "adamw", False, 3), ("toy", "sgd", True, 3), ("small/cpu", "adamw", "late", 2)]


@pytest.fixture(scope="module")
def two_ranks():
    """One 2-rank launch: every config trained by every kind, a checkpointed run, and a measured memory run."""
    calls = [
        partial(
            SR.equivalence_worker,
            model=name,
            kinds=KINDS,
            steps=steps,
            batch_size=BATCH,
            context_length=CONTEXT,
            optimizer=opt,
            groups=groups,
        )
        for name, opt, groups, steps in CONFIGS
    ]
    calls += [
        partial(SR.checkpoint_worker, model="small/cpu", steps=4, batch_size=BATCH, context_length=CONTEXT),
        partial(SR.checkpoint_worker, model="small/cpu", steps=2, batch_size=BATCH, context_length=CONTEXT),
        partial(
            SR.memory_worker,
            model="small/cpu",
            kinds=["unsharded", "sharded", "zero1"],
            batch_size=8,
            context_length=64,
            steps=2,
        ),
    ]  # activations outweigh gradients: the peak is backward's start
    return launch(partial(SR.run_all, calls), 2, backend="gloo", device="cpu")


def _assert_same(a: dict, b: dict, what: str):
    for key in b:
        assert torch.equal(a[key], b[key]), f"{what}: {key} differs (max {float((a[key] - b[key]).abs().max()):.3g})"


def test_partition_balances_bytes_not_counts():
    sizes = [1000, 990, 10, 10, 10, 10]
    owner = S.partition_by_bytes(sizes, 2)
    loads = [sum(s for s, r in zip(sizes, owner, strict=True) if r == k) for k in range(2)]
    assert loads == [1020, 1010] and owner == S.partition_by_bytes(sizes, 2)  # balanced and deterministic
    naive = S.partition_by_count(len(sizes), 2)
    assert naive == [0, 0, 0, 1, 1, 1] and sum(s for s, r in zip(sizes, naive, strict=True) if r == 0) == 2000


@pytest.mark.parametrize("config", range(len(CONFIGS)))
def test_two_ranks_equal_unsharded_exactly(two_ranks, config):
    """Bitwise by construction: every step's averaged gradients are the same values (checked), and AdamW/SGD update
    each element with the same ops in the same order whichever rank owns it."""
    table = SR.equivalence_table([out[config] for out in two_ranks])
    assert table["same_grads"].all() and table["same_weights"].all(), table
    whole = two_ranks[0][config]["unsharded"].state_bytes
    assert sum(out[config]["sharded"].state_bytes for out in two_ranks) == whole  # every tensor's state once


def test_one_rank_equals_unsharded_exactly():
    """No process group: world size 1, everything on this rank (no communication)."""
    for name, opt, groups, steps in CONFIGS[:2]:
        runs = SR.equivalence_worker(
            model=name, kinds=KINDS, steps=steps, batch_size=BATCH, context_length=CONTEXT, optimizer=opt, groups=groups
        )
        table = SR.equivalence_table([runs])
        assert table["same_grads"].all() and table["same_weights"].all(), (name, table)
        assert all(run.collectives == [[]] * steps for run in runs.values())


def test_state_is_one_nth_and_collectives_match_the_formulas(two_ranks):
    psi = count_parameters("small/cpu") * 4
    for rank, out in enumerate(two_ranks):
        runs = out[2]  # small/cpu, two groups
        table = SR.collectives_table(runs, "small/cpu", 2, n_groups=2)
        assert table["matches formula"].all(), table  # every step: the bytes passed are the formula's, exactly
        assert runs["sharded"].state_bytes == F.state_bytes("sharded", "small/cpu", 2, rank)  # the plan's, exactly
        assert runs["sharded"].state_bytes <= runs["unsharded"].state_bytes / 2 + SR.whole_tensor_slack("small/cpu")
        padded = psi + int(table.loc["zero1", "padding B"])
        assert runs["zero1"].state_bytes == 2 * padded // 2 + 4 * 2  # exp_avg + exp_avg_sq of 1/N, a step per group
        assert len(runs["sharded"].collectives[0]) == 1 + 2  # one all-reduce bucket, one broadcast per owner
        assert len(runs["naive_sharded"].collectives[0]) == 1 + len(list(SR.make_model("small/cpu", 0).parameters()))


def test_state_dict_round_trip_across_world_sizes(two_ranks):
    straight, first = two_ranks[0][3], two_ranks[0][4]
    saved = first.state_dict
    # resume at world size 2 from the consolidated dict: the same weights as never stopping
    resume = partial(
        SR.checkpoint_worker,
        model="small/cpu",
        steps=2,
        batch_size=BATCH,
        context_length=CONTEXT,
        resume=first,
        start=2,
    )
    resumed = launch(resume, 2, backend="gloo", device="cpu")
    _assert_same(resumed[0].weights, straight.weights, "resumed at 2 ranks")
    for key, state in straight.state_dict["state"].items():
        _assert_same(resumed[0].state_dict["state"][key], state, f"state {key}")
    # load at world size 1: the sharded optimizer and plain AdamW continue identically, and re-save the same dict
    model, _, opt = SR.build("sharded", "small/cpu", groups=True)
    model.load_state_dict(first.weights)
    opt.load_state_dict(copy.deepcopy(saved))  # torch's load_state_dict may keep the given tensors: one copy each
    again = opt.state_dict()
    assert again["param_groups"] == saved["param_groups"]
    for key, state in saved["state"].items():
        _assert_same(again["state"][key], state, f"re-saved state {key}")
    ref_model, _, ref_opt = SR.build("unsharded", "small/cpu", groups=True)
    ref_model.load_state_dict(first.weights)
    ref_opt.load_state_dict(copy.deepcopy(saved))
    for batch in SR.make_batches("small/cpu", 4, BATCH, CONTEXT)[2:]:
        common.train_step(model, opt, *batch)
        common.train_step(ref_model, ref_opt, *batch)
    _assert_same(model.state_dict(), ref_model.state_dict(), "1 rank after loading")


def test_state_dict_needs_consolidation():
    model, _, opt = SR.build("sharded", "uneven")
    opt.world = 2  # pretend: a multi-rank optimizer must be consolidated first
    with pytest.raises(RuntimeError, match="consolidate_state_dict"):
        opt.state_dict()


def test_calculator_on_meta_matches_counts_and_a_measured_run(two_ranks):
    for name in ("small", "xl", "small/cpu"):
        assert F.meta_numel(name) == count_parameters(name)
    psi = count_parameters("xl")
    mixed = [F.zero_memory("xl", 8, stage, "mixed")["total"] for stage in range(4)]
    assert mixed == [16 * psi, 4 * psi + 12 * psi / 8, 2 * psi + 14 * psi / 8, 16 * psi / 8]
    measured = [out[5] for out in two_ranks]
    calc = SR.calculator_table(measured)  # within SR.CALC_TOL: AdamW's step per tensor and the padding, < 0.1%
    assert calc["within"].all(), calc
    breakdown = SR.memory_breakdown(measured)  # live bytes exact at every point; the fwd/bwd peak within PEAK_TOL
    assert breakdown["within"].all(), breakdown[~breakdown["within"]]


def test_zero1_refuses_a_group_of_mixed_dtypes():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4).double())
    with pytest.raises(ValueError, match="one dtype and device"):
        S.Zero1Optimizer(model.parameters(), torch.optim.AdamW)
    groups = [{"params": model[0].parameters()}, {"params": model[1].parameters()}]
    S.Zero1Optimizer(groups, torch.optim.AdamW)  # one group per dtype is fine


def test_parameters_given_new_storage_are_repacked_or_refused():
    """model.to(dtype) after building the optimizer replaces every parameter's storage: ShardedOptimizer packs them
    again before its step (so its broadcasts still carry the updates); Zero1Optimizer says what to do instead."""
    x, y = SR.make_batches("uneven", 1, BATCH, CONTEXT)[0]
    model, _, opt = SR.build("sharded", "uneven")
    ref_model, _, ref_opt = SR.build("unsharded", "uneven")
    for m in (model, ref_model):
        m.double()
    common.train_step(model, opt, x, y)
    common.train_step(ref_model, ref_opt, x, y)
    _assert_same(model.state_dict(), ref_model.state_dict(), "after .double()")
    assert all(S._lives_in(p, flat) for _, params, flat in opt._buckets for p in params)
    model, _, opt = SR.build("zero1", "uneven")
    model.double()
    with pytest.raises(RuntimeError, match="build the optimizer after"):
        common.train_step(model, opt, x, y)


def _fake_run(per_kind: dict) -> "SR.SpeedRun":
    """A SpeedRun whose kinds took the given seconds per iteration in fwd_bwd, step by step, and a step of 1 ms (a
    real step takes time: the summary's ratios of step medians divide by it)."""
    rest = dict(grad_comm=0.0, step=1e-3, step_comm=0.0)
    return SR.SpeedRun({k: [dict(fwd_bwd=t, **rest) for t in ts] for k, ts in per_kind.items()}, {}, {})


def test_speed_summary_pairs_steps_and_names_no_winner_inside_the_noise():
    kinds = ["unsharded", "sharded", "zero1", "torch_zero"]
    rng = np.random.default_rng(0)
    noisy = {k: list(1.0 + 0.2 * rng.standard_normal(30)) for k in kinds}  # the same distribution: no difference
    launch_ = [[_fake_run(noisy), _fake_run(noisy)]]
    assert not SR.paired_iterations(launch_, "sharded", "unsharded").differs
    text = SR.speed_summary(SR.speed_table(launch_), launch_)
    assert "no measurable difference between ShardedOptimizer and unsharded" in text
    slow = {**noisy, "sharded": [2 * t for t in noisy["unsharded"]]}
    launch_ = [[_fake_run(slow), _fake_run(slow)]]
    assert SR.paired_iterations(launch_, "sharded", "unsharded").median == pytest.approx(2.0, abs=2e-3)  # + 1 ms
    assert "ShardedOptimizer takes 2.00x unsharded's time per iteration" in SR.speed_summary(
        SR.speed_table(launch_), launch_
    )
    apart = [[_fake_run({k: noisy[k]}) for _ in range(2)] for k in kinds]  # one kind per launch: nothing paired
    assert SR.paired_iterations(apart, "sharded", "unsharded") is None
    assert "separate launches" in SR.speed_summary(SR.speed_table(apart), apart)


def test_memory_worker_frees_each_kind_before_building_the_next(monkeypatch):
    """One kind's parameters and optimizer state must be gone when the next kind is built (on a GPU the allocator's
    peak of the next kind's init would count them otherwise); one rank, in this process."""
    import gc
    import weakref

    built, build = [], SR.memory_worker.__globals__["build"]

    def recording_build(*args, **kwargs):
        gc.collect()  # reference cycles aside: only what memory_worker still holds survives this
        assert all(ref() is None for ref in built), "the previous kind's parameters are still referenced"
        net, grad_sync, opt = build(*args, **kwargs)
        built.append(weakref.ref(next(net.parameters())))
        return net, grad_sync, opt

    monkeypatch.setitem(SR.memory_worker.__globals__, "build", recording_build)
    runs = SR.memory_worker(model="toy", kinds=["unsharded", "sharded"], batch_size=2, context_length=6, steps=1)
    assert list(runs) == ["unsharded", "sharded"] and len(built) == 2
