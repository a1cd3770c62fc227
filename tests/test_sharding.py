"""Sharded optimizers train bit for bit like the unsharded one (AdamW and SGD with momentum, param groups, a group
added late, odd tensor sizes, a frozen, a tied and an unused parameter; 1 and 2 ranks, gloo, CPU); partitioning;
the bytes handed to collectives; state-dict round trips across world sizes; the memory calculator against a run."""
import copy

import pytest
import torch

from helpers import comm
from helpers import formulas as F
from helpers import sharding as S
from helpers.experiments import common
from helpers.experiments import sharding as SR
from helpers.launch import launch
from helpers.model import count_parameters

KINDS = ["unsharded", "sharded", "naive_sharded", "zero1"]
BATCH, CONTEXT = 8, 16
CONFIGS = [("uneven", "adamw", False, 3), ("toy", "sgd", True, 3), ("small/8", "adamw", "late", 2)]


@pytest.fixture(scope="module")
def two_ranks():
    """One 2-rank launch: every config trained by every kind, a checkpointed run, and a measured memory run."""
    calls = [(SR.equivalence_worker, (name, KINDS, steps, BATCH, CONTEXT, opt, groups))
             for name, opt, groups, steps in CONFIGS]
    calls += [(SR.checkpoint_worker, ("small/8", 4, BATCH, CONTEXT)),
              (SR.checkpoint_worker, ("small/8", 2, BATCH, CONTEXT)),
              (SR.memory_worker, ("small/8", ["unsharded", "sharded", "zero1"], 4, 32))]
    return launch(SR.run_all, 2, calls, backend="gloo", device="cpu")


def _assert_same(a: dict, b: dict, what: str):
    for key in b:
        assert torch.equal(a[key], b[key]), f"{what}: {key} differs (max {float((a[key] - b[key]).abs().max()):.3g})"


def test_partition_balances_bytes_not_counts():
    sizes = [1000, 990, 10, 10, 10, 10]
    owner = S.partition_by_bytes(sizes, 2)
    loads = [sum(s for s, r in zip(sizes, owner) if r == k) for k in range(2)]
    assert loads == [1020, 1010] and owner == S.partition_by_bytes(sizes, 2)  # balanced and deterministic
    naive = S.partition_by_count(len(sizes), 2)
    assert naive == [0, 0, 0, 1, 1, 1] and sum(s for s, r in zip(sizes, naive) if r == 0) == 2000


@pytest.mark.parametrize("config", range(len(CONFIGS)))
def test_two_ranks_equal_unsharded_exactly(two_ranks, config):
    name, opt, groups, steps = CONFIGS[config]
    for rank, out in enumerate(two_ranks):
        runs = out[config]
        for kind in KINDS[1:]:
            _assert_same(runs[kind]["weights"], runs["unsharded"]["weights"], f"{name} {opt} {kind} rank {rank}")
    whole = two_ranks[0][config]["unsharded"]["state_bytes"]
    assert sum(out[config]["sharded"]["state_bytes"] for out in two_ranks) == whole  # every tensor's state once


def test_one_rank_equals_unsharded_exactly():
    """No process group: world size 1, everything on this rank (no communication)."""
    for name, opt, groups, steps in CONFIGS[:2]:
        runs = SR.equivalence_worker(name, KINDS, steps, BATCH, CONTEXT, opt, groups)
        for kind in KINDS[1:]:
            _assert_same(runs[kind]["weights"], runs["unsharded"]["weights"], f"{name} {kind} 1 rank")
            assert runs[kind]["collectives"] == [[]] * steps


def test_state_is_one_nth_and_collectives_match_the_formulas(two_ranks):
    psi = count_parameters("small/8") * 4
    for rank, out in enumerate(two_ranks):
        runs = out[2]  # small/8, two groups
        assert runs["sharded"]["state_bytes"] <= 1.02 * runs["unsharded"]["state_bytes"] / 2
        padded = sum(b for op, b in runs["zero1"]["collectives"][0] if op == "all_gather")
        assert 0 <= padded - psi <= 4 * 2 * 1  # one element of padding at most per group (2 groups, N = 2)
        assert runs["zero1"]["state_bytes"] == 2 * padded // 2 + 4 * 2  # exp_avg + exp_avg_sq of 1/N, a step per group
        for kind, size in (("unsharded", psi), ("sharded", psi), ("zero1", padded)):
            for log in runs[kind]["collectives"]:
                counted = {}
                for op, b in log:
                    counted[op] = counted.get(op, 0) + b
                assert counted == F.expected_collectives(kind, size, 2), (kind, counted)
        assert len(runs["sharded"]["collectives"][0]) == 1 + 2  # one all-reduce bucket, one broadcast per owner
        assert len(runs["naive_sharded"]["collectives"][0]) == 1 + len(list(SR.make_model("small/8", 0).parameters()))


def test_state_dict_round_trip_across_world_sizes(two_ranks):
    straight, first = two_ranks[0][3], two_ranks[0][4]
    saved = first["state_dict"]
    # resume at world size 2 from the consolidated dict: the same weights as never stopping
    resumed = launch(SR.checkpoint_worker, 2, "small/8", 2, BATCH, CONTEXT, first, 2, backend="gloo", device="cpu")
    _assert_same(resumed[0]["weights"], straight["weights"], "resumed at 2 ranks")
    for key, state in straight["state_dict"]["state"].items():
        _assert_same(resumed[0]["state_dict"]["state"][key], state, f"state {key}")
    # load at world size 1: the sharded optimizer and plain AdamW continue identically, and re-save the same dict
    model, _, opt = SR.build("sharded", "small/8", groups=True)
    model.load_state_dict(first["weights"])
    opt.load_state_dict(copy.deepcopy(saved))  # torch's load_state_dict may keep the given tensors: one copy each
    again = opt.state_dict()
    assert again["param_groups"] == saved["param_groups"]
    for key, state in saved["state"].items():
        _assert_same(again["state"][key], state, f"re-saved state {key}")
    ref_model, _, ref_opt = SR.build("unsharded", "small/8", groups=True)
    ref_model.load_state_dict(first["weights"])
    ref_opt.load_state_dict(copy.deepcopy(saved))
    for batch in SR.make_batches("small/8", 4, BATCH, CONTEXT)[2:]:
        common.train_step(model, opt, *batch)
        common.train_step(ref_model, ref_opt, *batch)
    _assert_same(model.state_dict(), ref_model.state_dict(), "1 rank after loading")


def test_state_dict_needs_consolidation():
    model, _, opt = SR.build("sharded", "uneven")
    opt.world = 2  # pretend: a multi-rank optimizer must be consolidated first
    with pytest.raises(RuntimeError, match="consolidate_state_dict"):
        opt.state_dict()


def test_calculator_on_meta_matches_counts_and_a_measured_run(two_ranks):
    for name in ("small", "xl", "small/8"):
        assert F.meta_numel(name) == count_parameters(name)
    psi = count_parameters("xl")
    mixed = [F.zero_memory("xl", 8, stage, "mixed")["total"] for stage in range(4)]
    assert mixed == [16 * psi, 4 * psi + 12 * psi / 8, 2 * psi + 14 * psi / 8, 16 * psi / 8]
    for rank, out in enumerate(two_ranks):
        measured = out[5]
        for kind, stage in (("unsharded", 0), ("zero1", 1)):
            calc = F.zero_memory("small/8", 2, stage, "fp32")
            parts = measured[kind]["parts"]
            got = {"parameters": parts["parameters"] - F.buffer_bytes("small/8"), "gradients": parts["gradients"],
                   "optimizer state": parts["optimizer state"]}
            for key, value in got.items():  # tolerance: AdamW's 4-byte step per tensor and the padding, < 0.1%
                assert abs(value - calc[key]) <= 1e-3 * calc[key], (kind, key, value, calc[key])
            after = [r for r in measured[kind]["rows"] if r["point"] == "after step"][0]
            expected = F.live_bytes(kind, "small/8", 2, rank, 2, 32, "after step")
            assert after["live"] == sum(expected.values()), (kind, after["live"], expected)


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
