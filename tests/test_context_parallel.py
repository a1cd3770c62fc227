"""Context parallelism (helpers.context_parallel, notebook 08) on 4 gloo ranks: ring attention's output and
logsumexp within the fp32 bound of naive attention, and its gradients within theirs of autograd's, without a mask,
causal in contiguous and in balanced chunks; RingAttention (the autograd Function) gives the same gradients; bytes
sent and chunk pairs computed, forward and backward, equal to the formulas; mutants (the diagonal chunk pair computed
without its causal mask; dK, dV left on the rank that last held them) break exactly what they touch; a sequence that
does not cut is refused before any rank starts."""

import pytest
import torch

from helpers import context_parallel as CP
from helpers.experiments import model_parallel_context as C

SIZES = dict(batch_heads=2, context_length=64, head_dim=16)
CONFIG = dict(world=4, cp_batch_heads=2, cp_context=64, cp_head_dim=16)


def _mutants_worker(*args):
    """The correct run; RingAttention's gradients against the direct calls'; then two mutants: the diagonal pair's
    causal mask dropped in forward (keys after the query leak in), and dK, dV never sent home."""
    from helpers import context_parallel
    from helpers.experiments import model_parallel_context

    correct = model_parallel_context.context_parallel_worker(*args)
    function = _function_against_direct_calls(*args)
    flash = context_parallel.flash_forward_torch
    context_parallel.flash_forward_torch = lambda q, k, v, causal, cfg: flash(q, k, v, False, cfg)
    unmasked = model_parallel_context.context_parallel_worker(*args)
    context_parallel.flash_forward_torch = flash
    context_parallel.send_home = lambda dk, dv, group=None: (dk, dv)
    return correct, unmasked, model_parallel_context.context_parallel_worker(*args), function


def _function_against_direct_calls(batch_heads, context_length, head_dim):
    """Largest |difference| between RingAttention's backward and ring_attention_backward, causal and balanced."""
    import torch.distributed as dist

    g = torch.Generator().manual_seed(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v, do = (CP.local_chunks(torch.randn(batch_heads, context_length, head_dim, generator=g), rank, world, True)
                   for _ in range(4))  # fmt: skip
    o, lse, _ = CP.ring_attention(q, k, v, True)
    direct = CP.ring_attention_backward(q, k, v, o, lse, do, True)[:3]
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    CP.RingAttention.apply(q, k, v, True).backward(do)
    return max(float((t.grad - d).abs().max()) for t, d in zip((q, k, v), direct, strict=True))


@pytest.fixture(scope="module")
def launched():
    return C.L.launch(_mutants_worker, 4, *SIZES.values(), backend="gloo", device="cpu")


@pytest.fixture(scope="module")
def runs(launched):
    return [C.CPRun([r[i] for r in launched], SIZES, "test", "test") for i in (0, 1, 2)]


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


def test_gradients_left_away_from_home_break_dk_and_dv_only(runs):
    table = C.exactness_section(runs[2]).table.set_index(["tensor", "variant", "rank"])["diff/bound"]
    assert (table.loc[["o", "lse", "dq"]] <= 1).all(), table
    assert (table.loc[["dk", "dv"]] > 10).all(), table  # every rank holds its neighbour's


def test_ring_attention_function_gives_the_direct_calls_gradients(launched):
    assert all(r[3] == 0.0 for r in launched)  # the same ops in the same order: bitwise


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
