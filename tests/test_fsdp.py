"""FSDP by hand (helpers.fsdp), gloo on CPU. One 2-rank launch trains a toy model (a tied, a frozen, an unused and
replicated parameters; every sharded size odd, so padded) and a 2-layer TransformerLM, in fp32 and with fp16
compute, SGD, 3 steps, each rank on half the batch. Checks: at every step the gradients equal one process's on the
whole batch from the same weights, within a bound derived from the sums each side rounds (and a rank's half alone
breaks that bound); the SGD step on the shards is the full-tensor step; replicated gradients bitwise equal across
ranks; gather_full_params after construction is rank 0's unwrapped model; bytes per step = the formula; peak of
gathered bytes. World size 1 runs in this process (bitwise equal to plain PyTorch); every bad input's ValueError."""

import functools
import math
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers import fsdp as F
from helpers.experiments import fsdp as X
from helpers.experiments.fsdp import DTYPES, EPS, LOSS_SCALE, SHARD_TYPES
from helpers.launch import launch
from helpers.model import build_model, lm_loss

pytestmark = pytest.mark.filterwarnings("error")
STEPS, BATCH, CONTEXT, LR = 3, 4, 16, 0.1


class Gain(nn.Module):
    """An elementwise gain, x * weight: a replicated parameter (not in shard_types)."""

    def __init__(self, d: int, value: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.full((d,), value))

    def forward(self, x):
        return x * self.weight


class ToyLM(nn.Module):
    """Embedding tied to the LM head, a Linear with bias, a frozen Linear, replicated gains (one frozen), an unused
    Linear; vocabulary 13, width 7: every sharded tensor has an odd size."""

    def __init__(self, vocab: int = 13, d: int = 7):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.fc = nn.Linear(d, d)
        self.gain = Gain(d, 1.5)
        self.frozen = nn.Linear(d, d, bias=False).requires_grad_(False)
        self.frozen_gain = Gain(d, 0.5).requires_grad_(False)
        self.unused = nn.Linear(d, 3)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        x = self.emb(idx)  # (B, T, d)
        x = x + torch.tanh(self.fc(x))
        return self.head(self.frozen_gain(self.frozen(self.gain(x))))  # (B, T, vocab)


def make_model(kind: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return ToyLM() if kind == "toy" else build_model("small/cpu", n_layers=2, context_length=CONTEXT)


def make_batches(kind: str):
    g = torch.Generator().manual_seed(1234)
    vocab = 13 if kind == "toy" else make_model("lm", 0).cfg.vocab_size
    tokens = [torch.randint(vocab, (BATCH, CONTEXT + 1), generator=g) for _ in range(STEPS)]
    return [(t[:, :-1], t[:, 1:]) for t in tokens]  # (B, T) inputs and targets


def sharded_names(model: nn.Module) -> set[str]:
    """Names (as named_parameters() gives them) of the parameters FSDP shards."""
    ids = {id(p) for m in model.modules() if isinstance(m, SHARD_TYPES) for p in m.parameters(recurse=False)}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def unscale(fsdp: F.FSDP, dtype: str) -> None:
    """Divide every gradient by the loss scale (what torch.amp.GradScaler.unscale_ does)."""
    for p in fsdp.parameters():
        if p.grad is not None:
            p.grad.div_(LOSS_SCALE[dtype])


def train_worker(kinds, dtypes) -> dict:
    """Every (model, dtype) run on this rank: per step the full weights before it, the full gradients, the byte log,
    the local replicated gradients and each trainable parameter's (shape, dtype) with its gradient's."""
    warnings.simplefilter("error")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for kind in kinds:
        for dtype in dtypes:
            fsdp = F.FSDP(make_model(kind, seed=rank), compute_dtype=DTYPES[dtype])  # ranks start different
            opt = torch.optim.SGD(fsdp.parameters(), lr=LR)
            steps = []
            for x, y in make_batches(kind):
                weights, start = fsdp.gather_full_params(), len(fsdp.comm_log)
                opt.zero_grad(set_to_none=True)
                (lm_loss(fsdp(x[rank::world]), y[rank::world]) * LOSS_SCALE[dtype]).backward()  # this rank's half
                fsdp.finish_gradient_synchronization()
                unscale(fsdp, dtype)
                steps.append(
                    {
                        "weights": weights,
                        "grads": fsdp.gather_full_grads(),
                        "log": fsdp.comm_log[start:],
                        "replicated": [p.grad.clone() for p in fsdp.replicated],
                        "meta": [
                            (p.shape, p.dtype, p.grad.shape, p.grad.dtype) for p in fsdp.parameters() if p.requires_grad
                        ],
                    }
                )
                opt.step()
            out[kind, dtype] = {
                "steps": steps,
                "final": fsdp.gather_full_params(),
                "peak": fsdp.peak_gathered_bytes,
                "prefetched": fsdp.prefetched,
                "comm_s": fsdp.comm_s,
            }
    return out


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The references here are tiny: one intra-op thread (a second one only waits for a core on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runs():
    return launch(train_worker, 2, ["toy", "lm"], ["fp32", "fp16"], backend="gloo", device="cpu", timeout_s=300)


# ---- the single-process reference and the error bound ----


def loaded(kind: str, weights: dict) -> nn.Module:
    model = make_model(kind, seed=0)
    named = dict(model.named_parameters())
    assert named.keys() == weights.keys()
    with torch.no_grad():
        for name, p in named.items():
            p.copy_(weights[name])
    return model


def reference_grads(kind: str, weights: dict, x, y, dtype: str) -> dict:
    """One process, whole batch (helpers.experiments.fsdp.reference_grads, which notebook 07 uses too)."""
    return X.reference_grads(loaded(kind, weights), x, y, dtype)


def bound(kind: str, dtype: str, weights: dict, x, y) -> dict:
    """n·eps·Σ|term| per entry (helpers.experiments.fsdp.bound)."""
    return X.bound(loaded(kind, weights), x, y, dtype)


def violations(grads: dict, reference: dict, limits: dict) -> dict:
    """{name: largest excess over the bound} for each parameter where some entry breaks it."""
    out = {}
    for name, ref in reference.items():
        assert torch.isfinite(grads[name]).all() and torch.isfinite(ref).all() and torch.isfinite(limits[name]).all()
        excess = ((grads[name] - ref).abs() - limits[name]).max().item()
        if excess > 0:
            out[name] = excess
    return out


@pytest.mark.parametrize("kind", ["toy", "lm"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_gradients_equal_one_process_on_the_whole_batch(runs, kind, dtype):
    """Every step, from the weights FSDP had then: the gathered gradients vs one process's, within the bound (fp32:
    on the whole batch; fp16: on each rank's rows, averaged, since fp16 upstream gradients depend on the batch's
    shapes); at the first step the gradient of rank 0's half
    of the batch alone breaks the bound for every trained parameter (so this can fail)."""
    for s, ((x, y), step) in enumerate(zip(make_batches(kind), runs[0][kind, dtype]["steps"], strict=True)):
        limits = bound(kind, dtype, step["weights"], x, y)
        whole = reference_grads(kind, step["weights"], x, y, dtype)
        reference = (
            whole
            if dtype == "fp32"
            else X.ranks_reference(
                functools.partial(loaded, kind, step["weights"]), [(x[r::2], y[r::2]) for r in range(2)], dtype
            )
        )
        assert step["grads"].keys() == reference.keys()
        assert not violations(step["grads"], reference, limits), (s, violations(step["grads"], reference, limits))
        if s == 0:
            half = violations(reference_grads(kind, step["weights"], x[0::2], y[0::2], dtype), reference, limits)
            trained = [n for n, g in reference.items() if g.any()]
            assert set(half) == set(trained), set(trained) - set(half)


@pytest.mark.parametrize("kind", ["toy", "lm"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_sgd_on_shards_is_the_full_step(runs, kind, dtype):
    """weights after step s = weights before - lr * gradient, up to one rounding of the update (eps (|w| + lr|g|))."""
    run = runs[0][kind, dtype]
    after = [st["weights"] for st in run["steps"][1:]] + [run["final"]]
    frozen = {n for n, p in make_model(kind, 0).named_parameters() if not p.requires_grad}
    for step, new in zip(run["steps"], after, strict=True):
        for name, w in step["weights"].items():
            g = step["grads"][name]
            expected = w if name in frozen else w - LR * g
            tol = EPS["fp32"] * (w.abs() + LR * g.abs())
            assert ((new[name] - expected).abs() <= tol).all(), name
            if name in frozen:
                assert torch.equal(new[name], w) and not g.any(), name
            elif g.any():  # trained (the unused Linear gets zero gradients and stays)
                assert not torch.equal(new[name], w), name


def test_every_trainable_parameter_has_a_gradient_of_its_own_shape_and_dtype(runs):
    for out in runs:
        for run in out.values():
            for step in run["steps"]:
                assert step["meta"] and all(ps == gs and pd == gd == torch.float32 for ps, pd, gs, gd in step["meta"])


def test_replicated_gradients_and_weights_bitwise_equal_across_ranks(runs):
    for key, run in runs[0].items():
        other = runs[1][key]
        for s, (a, b) in enumerate(zip(run["steps"], other["steps"], strict=True)):
            same = [torch.equal(u, v) for u, v in zip(a["replicated"], b["replicated"], strict=True)]
            assert same and all(same), (key, s)
        assert all(torch.equal(run["final"][n], other["final"][n]) for n in run["final"]), key


def test_gather_full_params_after_construction_is_rank_0s_model(runs):
    """Ranks built different weights; after wrapping, both see rank 0's, under the unwrapped model's names."""
    for kind in ("toy", "lm"):
        rank0, rank1 = dict(make_model(kind, 0).named_parameters()), dict(make_model(kind, 1).named_parameters())
        assert any(not torch.equal(rank0[n], rank1[n]) for n in rank0)
        for out in runs:
            for dtype in ("fp32", "fp16"):
                weights = out[kind, dtype]["steps"][0]["weights"]
                assert list(weights) == list(rank0)
                assert all(torch.equal(weights[n], rank0[n]) and weights[n].dtype == torch.float32 for n in rank0)


def test_bytes_per_step_match_the_formula(runs):
    """TransformerLM (every size even, nothing tied or frozen): (N-1)/N Psi (2 gather bytes + 4) + the replicated
    all-reduce, 1.5x DDP's 2 (N-1)/N Psi 4 in fp32. Toy: one all-gather per use in forward and again in backward
    (tied: twice, frozen included), one reduce-scatter per trainable use, nothing for the unused Linear."""
    world = 2
    model = make_model("lm", 0)
    sharded = sharded_names(model)
    psi = sum(p.numel() for n, p in model.named_parameters() if n in sharded)
    psi_rep = sum(p.numel() for n, p in model.named_parameters() if n not in sharded)
    for dtype, gather_bytes in (("fp32", 4), ("fp16", 2)):
        for step in runs[0]["lm", dtype]["steps"]:
            assert F.bytes_sent(step["log"], world) == F.fsdp_bytes_per_step(psi, world, gather_bytes, 4, psi_rep)
    assert F.fsdp_bytes_per_step(psi, world) / F.ddp_bytes_per_step(psi, world) == 1.5
    padded = {n: math.ceil(p.numel() / world) * world for n, p in make_model("toy", 0).named_parameters()}
    assert all(
        padded[n] % 2 == 0 and padded[n] != p.numel()
        for n, p in make_model("toy", 0).named_parameters()
        if n in sharded_names(make_model("toy", 0))
    )
    for dtype, b in (("fp32", 4), ("fp16", 2)):
        uses = ["emb.weight", "fc.weight", "fc.bias", "frozen.weight", "emb.weight"]  # head uses emb.weight
        expected = sorted(
            [("all_gather", padded[n] * b) for n in uses] * 2
            + [("reduce_scatter", padded[n] * 4) for n in uses if n != "frozen.weight"]
            + [("all_reduce", 7 * 4)]
        )  # gain.weight; frozen_gain is not reduced
        for step in runs[0]["toy", dtype]["steps"]:
            assert sorted(step["log"]) == expected


def test_prefetch_and_at_most_two_gathered_modules_alive(runs):
    """Each gather but the first is started ahead of its module (forward from the 2nd step, once the call order is
    known; backward from the 1st), and the gathered bytes alive never exceed the two largest modules' together."""
    model = make_model("lm", 0)
    per_module = sorted(
        (sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules() if isinstance(m, SHARD_TYPES)),
        reverse=True,
    )  # every one is called once per forward
    for dtype, b in (("fp32", 4), ("fp16", 2)):
        run = runs[0]["lm", dtype]
        # forward: every module but the first, from step 2; backward: the same from step 1, but where two modules'
        # backward become due together (the two embeddings) one of them may start its own gather
        ahead = (STEPS - 1 + STEPS) * (len(per_module) - 1)
        assert ahead - STEPS <= run["prefetched"] <= ahead, run["prefetched"]
        assert per_module[0] * b <= run["peak"] <= (per_module[0] + per_module[1]) * b, (dtype, run["peak"])


# ---- in this process: world size 1 and the errors ----


def test_before_init_process_group_says_to_use_launch():
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(ValueError, match="helpers.launch.launch"):
        F.FSDP(nn.Linear(2, 2))


@pytest.mark.parametrize("kind, dtype", [("toy", "fp32"), ("lm", "fp16")])
def test_world_size_1_is_plain_pytorch(one_rank, kind, dtype):
    """One rank: the same kernels on the same batch, so the gradients are bitwise those of plain PyTorch with the
    same casts, at every step (from FSDP's weights), and the trained weights follow the same SGD steps."""
    fsdp = F.FSDP(make_model(kind, seed=0), compute_dtype=DTYPES[dtype])
    for s, (x, y) in enumerate(make_batches(kind)):
        weights = fsdp.gather_full_params()
        fsdp.zero_grad(set_to_none=True)
        (lm_loss(fsdp(x), y) * LOSS_SCALE[dtype]).backward()
        fsdp.finish_gradient_synchronization()
        unscale(fsdp, dtype)
        grads = fsdp.gather_full_grads()
        reference = reference_grads(kind, weights, x, y, dtype)
        assert all(torch.isfinite(g).all() for g in grads.values())
        differ = {
            n: (grads[n] - reference[n]).abs().max().item()
            for n in reference
            if not torch.equal(grads[n], reference[n])
        }
        assert not differ, (s, differ)
        assert F.bytes_sent(fsdp.comm_log, 1) == 0  # one rank sends nothing
        with torch.no_grad():  # SGD by hand: a torch.optim optimizer would import torch._dynamo here (seconds)
            for p in fsdp.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-LR)


def test_bad_inputs_are_clear_errors(one_rank):
    with pytest.raises(ValueError, match="no parameters to shard"):
        F.FSDP(nn.Sequential(nn.LayerNorm(4)))
    with pytest.raises(ValueError, match="one device"):
        F.FSDP(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2, device="meta")))
    with pytest.raises(ValueError, match="does not move tensors"):
        F.FSDP(nn.Linear(2, 2, device="meta"))
    with pytest.raises(ValueError, match="compute_dtype"):
        F.FSDP(nn.Linear(2, 2), compute_dtype=torch.float64)
    with pytest.raises(ValueError, match="fp32 master weights"):
        F.FSDP(nn.Linear(2, 2).half())
    tied = nn.Sequential(nn.Linear(3, 3), Gain(3))
    tied[1].weight = tied[0].bias
    with pytest.raises(ValueError, match="add Gain to shard_types"):
        F.FSDP(tied)
    F.FSDP(tied, shard_types=(nn.Linear, Gain))  # sharding both uses works
