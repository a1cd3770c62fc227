"""Notebook 07 §1's fp32 bound on a device whose matmuls accumulate in an order picked by shape, as cuBLAS does (a
different kernel, blocking and split-K for half a batch than for the whole one), modelled on the CPU: ShapeKernels
computes each fp32 mm/bmm natively, in float64 rounded once, or split-K with the partial products summed in reverse,
chosen by (M, K, N). FSDP's 2 gloo ranks and the one-process references all run under it, as both ranks and the
reference ran on the H200 where the summation-only bound failed (max_diff/bound 208, 543, 1500 at 6e-8 differences).
Checks: the summation-only bound (fsdp_correctness.bound) fails here as it did there; batch_shape_bound holds, and
equals the summation-only bound where the terms are bitwise equal (plain CPU); a gradient not averaged (2x), one
weight's shards swapped, and one rank's rows alone each break it at every step."""

import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.experiments import fsdp as X
from helpers.experiments.common import make_batches, rank_rows
from helpers.launch import launch

CHECK = dict(model="small-2026/cpu", n_layers=2, steps=3, batch_size=4, context_length=16)  # notebook 07's check model
aten = torch.ops.aten


def split_k(a, b, chunk=16):
    """a @ b with the reduced dimension in chunks, each chunk's product summed in from the last one to the first."""
    parts = [a[..., i : i + chunk] @ b[..., i : i + chunk, :] for i in range(0, a.shape[-1], chunk)]
    out = parts[-1]
    for part in reversed(parts[:-1]):
        out = out + part
    return out


class ShapeKernels(TorchDispatchMode):
    """fp32 mm/bmm in an accumulation order picked by the shape (M, K, N), the same for the same shape: native,
    float64 rounded once (correctly rounded dot products), or split-K reversed."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (aten.mm.default, aten.bmm.default) and args[0].dtype == torch.float32:
            a, b = args
            kernel = (a.shape[-2] + 3 * a.shape[-1] + 5 * b.shape[-1]) % 3
            if kernel == 1:
                return func(a.double(), b.double()).float()
            if kernel == 2:
                return split_k(a, b)
        return func(*args, **(kwargs or {}))


def shape_kernels_worker(**kwargs):
    with ShapeKernels():
        return X.equivalence_worker(**kwargs)


@pytest.fixture(scope="module")
def shaped():
    """Per rank {"fp32": EquivalenceRun} of FSDP on 2 ranks, every matmul under ShapeKernels."""
    worker = functools.partial(shape_kernels_worker, dtypes=["fp32"], **CHECK)
    return launch(worker, 2, backend="gloo", device="cpu", timeout_s=300)


def table(per_rank):
    with ShapeKernels():
        return X.equivalence_table(per_rank, **CHECK)


def planted(per_rank, grads):
    """per_rank with rank 0's gradients replaced (the table reads rank 0's)."""
    run = per_rank[0]["fp32"]
    return [{"fp32": X.EquivalenceRun(run.dtype, run.world, run.weights, grads, run.replicated, run.logs)}]


def test_the_summation_only_bound_fails_when_matmul_order_depends_on_shape(shaped):
    """The H200's failure, on the CPU: FSDP's gradients are off the whole batch's by more than n·eps·Σ|term|."""
    run = shaped[0]["fp32"]
    ratios = []
    with ShapeKernels():
        for s, (x, y) in enumerate(make_batches(CHECK["model"], CHECK["steps"], 4, 16, 0)):
            load = functools.partial(X.loaded, CHECK["model"], CHECK["n_layers"], run.weights[s])
            whole, lim = X.reference_grads(load(), x, y, "fp32"), X.bound(load(), x, y, "fp32")
            ratios.append(max(float(((run.grads[s][n] - whole[n]).abs() / lim[n].clamp_min(1e-30)).max()) for n in lim))
    assert min(ratios) > 10, ratios


def test_batch_shape_bound_holds_when_matmul_order_depends_on_shape(shaped):
    t = table(shaped)
    assert (t["max_diff/bound"] <= 1).all() and not t["bitwise"].any(), t
    assert not t["terms_equal"].any() and t["replicated_equal"].all(), t  # the shapes did change the terms


@pytest.mark.parametrize("bug", ["not averaged", "shards swapped", "one rank's rows"])
def test_a_planted_bug_breaks_the_bound_at_every_step(shaped, bug):
    run = shaped[0]["fp32"]
    grads = []
    for s, (x, y) in enumerate(make_batches(CHECK["model"], CHECK["steps"], 4, 16, 0)):
        g = dict(run.grads[s])
        if bug == "not averaged":  # the reduce-scatter's sum, not its mean
            g = {n: 2 * v for n, v in g.items()}
        elif bug == "shards swapped":  # rank 1's half of one sharded weight's gradient written where rank 0's goes
            w = g["blocks.1.ffn.w2.weight"].flatten()
            half = w.numel() // 2
            g["blocks.1.ffn.w2.weight"] = torch.cat([w[half:], w[:half]]).view_as(g["blocks.1.ffn.w2.weight"])
        else:  # rank 0's rows alone: no reduce at all
            rows = rank_rows(x.shape[0], 0, 2)
            with ShapeKernels():
                load = functools.partial(X.loaded, CHECK["model"], CHECK["n_layers"], run.weights[s])
                g = X.reference_grads(load(), x[rows], y[rows], "fp32")
            g = {n: v.detach() for n, v in g.items()}
        grads.append(g)
    t = table(planted(shaped, grads))
    assert (t["max_diff/bound"] > 100).all(), t


def test_with_equal_terms_the_bound_is_the_summation_bound():
    """Plain CPU: a row's activations and upstream gradients do not depend on the batch, so batch_shape_bound adds
    nothing to n·eps·Σ|term| (Σ|term| of the fp32 terms here, of float64 ones there: an upstream gradient made with
    cancellation, as the embedding's, differs by up to ~3e-3 relative in fp32)."""
    model, n_layers = CHECK["model"], CHECK["n_layers"]
    load = functools.partial(X.build, model, n_layers)
    (x, y), *_ = make_batches(model, 1, 4, 16, 0)
    lim, equal = X.batch_shape_bound(load, x, y, 2)
    old = X.bound(load(), x, y, "fp32")
    assert equal and lim.keys() == old.keys()
    for n in lim:
        assert torch.allclose(lim[n], old[n], rtol=1e-2, atol=0), n
