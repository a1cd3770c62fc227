"""Context parallelism (helpers.context_parallel, notebook 08) on 4 gloo ranks: ring attention's output and
logsumexp within the fp32 bound of naive attention, without a mask, causal in contiguous and in balanced chunks;
bytes sent and chunk pairs computed equal to the formulas; a mutant (the diagonal chunk pair computed without its
causal mask) breaks exactly the causal variants; a sequence that does not cut is refused before any rank starts."""

import pytest
import torch

from helpers import context_parallel as CP
from helpers.experiments import model_parallel_context as C

SIZES = dict(batch_heads=2, context_length=64, head_dim=16)
CONFIG = dict(world=4, cp_batch_heads=2, cp_context=64, cp_head_dim=16)


def _both_worker(*args):
    """The correct run, then the diagonal pair's causal mask dropped (keys after the query leak in)."""
    from helpers import context_parallel
    from helpers.experiments import model_parallel_context

    correct = model_parallel_context.context_parallel_worker(*args)
    flash = context_parallel.flash_forward_torch
    context_parallel.flash_forward_torch = lambda q, k, v, causal, cfg: flash(q, k, v, False, cfg)
    return correct, model_parallel_context.context_parallel_worker(*args)


@pytest.fixture(scope="module")
def runs():
    ranks = C.L.launch(_both_worker, 4, *SIZES.values(), backend="gloo", device="cpu")
    return [C.CPRun([r[i] for r in ranks], SIZES, "test", "test") for i in (0, 1)]


def test_exact_and_costs_equal_the_formulas(runs):
    table = C.exactness_section(runs[0]).table
    assert (table["diff/bound"] <= 1).all(), table
    cost = C.cost_section(runs[0]).table
    assert cost["equal"].all(), cost
    balanced = cost[cost["variant"] == "causal, balanced"]["work"]
    assert balanced.nunique() == 1  # the same pairs on every rank


def test_mutant_breaks_only_the_causal_variants(runs):
    table = C.exactness_section(runs[1]).table.set_index(["variant", "rank", "tensor"])["diff/bound"]
    assert (table.loc["full"] <= 1).all(), table
    for variant in ("causal, contiguous", "causal, balanced"):
        assert (table.loc[variant] > 10).any(), table


def test_chunks_round_trip_and_balanced_order():
    x = torch.arange(16.0).view(1, 16, 1)
    for causal, balanced in [(False, True), (True, False), (True, True)]:
        parts = [CP.local_chunks(x, r, 4, causal, balanced) for r in range(4)]
        assert torch.equal(CP.from_local_chunks(parts, 4, causal, balanced), x)
    assert CP.local_chunks(x, 0, 4, True).flatten().tolist() == [0, 1, 14, 15]  # chunks 0 and 7 of 8


def test_merge_of_two_key_halves_is_attention_over_both():
    from helpers.attention import attention_lse, naive_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    halves = [(naive_attention(q, k[:, s], v[:, s]), attention_lse(q, k[:, s])) for s in (slice(0, 2), slice(2, 5))]
    o, lse = CP.merge(*halves[0], *halves[1])
    torch.testing.assert_close(o, naive_attention(q, k, v))
    torch.testing.assert_close(lse, attention_lse(q, k))


def test_a_sequence_that_does_not_cut_is_refused_before_launch():
    with pytest.raises(ValueError, match="divisible by 8"):
        C.context_parallel_run({**CONFIG, "cp_context": 60}, "test")
