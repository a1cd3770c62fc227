"""The 2026 leaderboard plan (formulas.leaderboard_plan) checked where a CPU can: on a Llama-like model of the
leaderboard's shape scaled down with its ratios kept (head_dim 128, d_ff/d_model 2.6875, the LM head's share of the
parameters), its parameters exactly, the bytes saved for backward against helpers.memory's tracker, the peak of a
steady-state forward+backward within a stated bound, and the step's FLOPs against FlopCounterMode."""

import helpers  # noqa: F401  (first: sets TRITON_INTERPRET before torch's flop counter imports triton)

# isort: split

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from helpers import formulas
from helpers.memory import track

FULL = formulas.LEADERBOARD_MODEL
D = 256  # d_model: 2 heads of head_dim 128, as the leaderboard's 32 heads of 128
SHAPE = dict(
    d_model=D,
    d_ff=D * FULL["d_ff"] // FULL["d_model"],
    n_layers=4,
    n_heads=D // 128,
    context_length=64,
    batch_size=2,
    world_size=1,
)
# the vocabulary that keeps the embedding + head's share of the parameters (about 15%)
_share = 2 * FULL["vocab_size"] * FULL["d_model"] / sum(formulas.llama_params(**FULL).values())
_blocks = formulas.llama_params(**SHAPE, vocab_size=0)["blocks"]
SHAPE["vocab_size"] = round(_share * _blocks / (1 - _share) / (2 * D))


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


class Block(nn.Module):
    """The plan's block: RMSNorm, q/k/v/o, causal SDPA (FlashAttention on CPU; `math`: softmax(q kᵀ) v written out,
    which FlopCounterMode counts, having no formula for the CPU flash kernel), RMSNorm, SwiGLU."""

    def __init__(self, d, f, h, math_attention=False):
        super().__init__()
        self.h, self.math, self.norm1, self.norm2 = h, math_attention, RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.w1, self.w3, self.w2 = (
            nn.Linear(d, f, bias=False),
            nn.Linear(d, f, bias=False),
            nn.Linear(f, d, bias=False),
        )

    def forward(self, x):
        B, T, d = x.shape
        a = self.norm1(x)
        q, k, v = (
            m(a).view(B, T, self.h, d // self.h).transpose(1, 2) for m in (self.q, self.k, self.v)
        )  # (B, H, T, hd)
        if self.math:
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            y = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(d // self.h)).masked_fill(~mask, -1e9), -1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, d)
        x = x + self.o(y)
        b = self.norm2(x)
        return x + self.w2(F.silu(self.w1(b)) * self.w3(b))


class LlamaLike(nn.Module):
    """Embedding, blocks (checkpointed in segments of `segment` blocks; 0: none), final norm, untied head."""

    def __init__(self, s, segment=0, math_attention=False):
        super().__init__()
        self.segment = segment
        self.emb = nn.Embedding(s["vocab_size"], s["d_model"])
        self.blocks = nn.ModuleList(
            Block(s["d_model"], s["d_ff"], s["n_heads"], math_attention) for _ in range(s["n_layers"])
        )
        self.norm, self.head = RMSNorm(s["d_model"]), nn.Linear(s["d_model"], s["vocab_size"], bias=False)

    def _run(self, lo, hi, x):
        for block in self.blocks[lo:hi]:
            x = block(x)
        return x

    def forward(self, idx):
        x, n, k = self.emb(idx), len(self.blocks), self.segment
        for lo in range(0, n, k or n):
            x = checkpoint(self._run, lo, lo + k, x, use_reentrant=False) if k else self._run(0, n, x)
        return self.head(self.norm(x))  # (B, T, V)


def batch(s):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, s["vocab_size"], (s["batch_size"], s["context_length"]), generator=g) for _ in range(2)]


def loss_of(model, x, y):
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def plan_row(strategy="DDP", checkpointing="none", head="plain", precision="fp32 master"):
    plan = formulas.leaderboard_plan(SHAPE, gpus={"any": dict(memory=1e12, flops=1e12, link=1e9)}, bytes_per_element=4)
    return next(
        r
        for r in plan
        if (r["strategy"], r["checkpointing"], r["head"], r["precision"]) == (strategy, checkpointing, head, precision)
    )


def test_the_preset_keeps_the_leaderboards_ratios():
    full, small = (formulas.llama_params(**s) for s in (FULL, SHAPE))
    share = lambda p: (p["embedding"] + p["lm_head"]) / sum(p.values())  # noqa: E731
    assert D // SHAPE["n_heads"] == FULL["d_model"] // FULL["n_heads"] == 128
    assert abs(SHAPE["d_ff"] / D - FULL["d_ff"] / FULL["d_model"]) < 1 / D  # rounded to whole columns
    assert abs(share(small) - share(full)) < 0.01, (share(small), share(full))


def test_parameters_match_the_model():
    model = LlamaLike(SHAPE)
    assert sum(p.numel() for p in model.parameters()) == sum(formulas.llama_params(**SHAPE).values())
    assert plan_row()["params"] == sum(p.numel() for p in model.parameters())


def test_a_block_saves_what_the_formula_counts_byte_for_byte():
    s, tokens = SHAPE, SHAPE["batch_size"] * SHAPE["context_length"]
    block = Block(s["d_model"], s["d_ff"], s["n_heads"])
    x = torch.randn(s["batch_size"], s["context_length"], s["d_model"], requires_grad=True)
    t = track(lambda: block(x), existing=[*block.parameters(), x])
    # live after forward: what backward needs, less the block's input (existing), plus its output (as big)
    assert t.current_bytes - t.baseline_bytes == formulas.llama_block_saved_bytes(
        d_model=s["d_model"], d_ff=s["d_ff"], n_heads=s["n_heads"], tokens=tokens, bytes_per_element=4
    )


@pytest.mark.parametrize("checkpointing, segment", [("none", 0), ("every block", 1), ("sqrt(L) segments", 2)])
def test_the_models_saved_activations_match_the_plan(checkpointing, segment):
    s, tokens = SHAPE, SHAPE["batch_size"] * SHAPE["context_length"]
    assert plan_row(checkpointing=checkpointing)["segment"] == segment  # √4 = 2
    model = LlamaLike(s, segment)
    x, y = batch(s)
    t = track(lambda: loss_of(model, x, y), existing=[*model.parameters(), x, y])
    A = formulas.llama_block_saved_bytes(
        d_model=D, d_ff=s["d_ff"], n_heads=s["n_heads"], tokens=tokens, bytes_per_element=4
    )
    kept = s["n_layers"] * A if segment == 0 else math.ceil(s["n_layers"] / segment) * tokens * D * 4
    head = formulas.llama_head_bytes(d_model=D, vocab_size=s["vocab_size"], tokens=tokens, bytes_per_element=4)
    scalars = 64  # the loss and cross_entropy's total weight: a few 0-d tensors
    assert 0 <= t.current_bytes - t.baseline_bytes - (kept + head["saved"]) <= scalars


def test_the_peak_of_a_steady_state_step_is_the_plans_memory_within_its_transients():
    s, tokens = SHAPE, SHAPE["batch_size"] * SHAPE["context_length"]
    model = LlamaLike(s)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    x, y = batch(s)
    loss_of(model, x, y).backward()
    opt.step()  # AdamW state exists; gradients stay allocated (zeroed, not None) as the plan counts them
    opt.zero_grad(set_to_none=False)
    state = [
        *model.parameters(),
        *(p.grad for p in model.parameters()),
        *(v for st in opt.state.values() for v in st.values()),
        x,
        y,
    ]
    t = track(lambda: loss_of(model, x, y).backward(), existing=state)
    planned = plan_row()["memory_GB"] * 1e9
    steps = 4 * len(opt.state)  # AdamW's fp32 step counter per tensor, not in 16 bytes per parameter
    # Above the plan, as backward runs: one gradient before it is added into .grad (at most the largest parameter,
    # V·d) and the gradients flowing between layers (a few (B, T, d) and (B, T, d_ff) tensors).
    transients = s["vocab_size"] * D * 4 + tokens * (4 * D + 2 * s["d_ff"]) * 4
    assert planned + steps <= t.peak_bytes <= planned + steps + transients, (t.peak_bytes, planned, transients)


@pytest.mark.parametrize("segment", [0, 1, 2])
def test_flops_match_flop_counter_mode(segment):
    s = SHAPE
    model = LlamaLike(s, segment, math_attention=True)
    x, y = batch(s)
    with FlopCounterMode(display=False) as counter:
        loss_of(model, x, y).backward()
    segments = math.ceil(s["n_layers"] / segment) if segment else 0
    # plain matmuls compute attention's full T × T square, whatever the mask: causal_fraction 1
    assert counter.get_total_flops() == formulas.llama_train_flops(**s, segments=segments, causal_fraction=1.0)


def test_the_plan_for_the_leaderboard():
    plan = formulas.leaderboard_plan()
    assert len(plan) == 4 * 3 * 2 * 3 and {r["strategy"] for r in plan} == set(formulas.PLAN_STRATEGIES)
    assert 8.0e9 < plan[0]["params"] < 8.3e9  # "~8B"
    by = {(r["strategy"], r["checkpointing"], r["head"], r["precision"]): r for r in plan}
    # sharding only lowers memory; checkpointing every block only lowers it further here
    for ckpt in formulas.PLAN_CHECKPOINTING:
        mem = [by[st, ckpt, "plain", "fp32 master"]["memory_GB"] for st in formulas.PLAN_STRATEGIES]
        assert mem == sorted(mem, reverse=True), (ckpt, mem)
    # with fp32 master weights two H100s cannot hold this step at all; without them, FSDP with a chunked head can, and
    # the tie goes to the handout's all-bf16 Config, the least memory at the same predicted time
    assert not any(r["fits"]["H100 80 GB"] for r in plan if r["precision"] == "fp32 master")
    h100 = formulas.fastest_plan(plan, "H100 80 GB")
    assert (h100["strategy"], h100["head"], h100["precision"]) == ("FSDP", "chunked", formulas.HANDOUT_PRECISION)
    best = formulas.fastest_plan(plan, "B200 ~180 GB")
    assert best is not None and best["fits"]["B200 ~180 GB"]
    assert all(best["step_s"]["B200 ~180 GB"] <= r["step_s"]["B200 ~180 GB"] for r in plan if r["fits"]["B200 ~180 GB"])
    g = formulas.LEADERBOARD_GPUS["B200 ~180 GB"]
    assert best["step_s"]["B200 ~180 GB"] >= best["flops"] / 2 / g["flops"]  # no faster than the peak
    with pytest.raises(ValueError, match="multiple of world_size"):
        formulas.leaderboard_plan({"batch_size": 3})


def test_the_plan_keeps_a_margin_breaks_ties_by_memory_and_offers_the_head_and_precision_variants():
    plan = formulas.leaderboard_plan()
    gpu = "B200 ~180 GB"
    card = formulas.LEADERBOARD_GPUS[gpu]["memory"] / 1e9
    for r in plan:  # fits only with the stated margin free
        assert r["fits"][gpu] == (r["memory_GB"] <= (1 - formulas.PLAN_MARGIN) * card)
    ddp = next(
        r
        for r in plan
        if (r["strategy"], r["checkpointing"], r["head"], r["precision"])
        == ("DDP", "every block", "plain", "fp32 master")
    )
    assert ddp["memory_GB"] > (1 - formulas.PLAN_MARGIN) * card and not ddp["fits"][gpu]  # 175 GB: 2.6% headroom
    # DDP and FSDP are predicted equally fast here: the tie goes to the plan with less memory
    pair = [
        r
        for r in plan
        if r["checkpointing"] == "every block"
        and r["head"] == "plain"
        and r["precision"] == "fp32 master"
        and r["strategy"] in ("DDP", "FSDP")
    ]
    roomy = {gpu: dict(formulas.LEADERBOARD_GPUS[gpu], memory=1e15)}
    pair = [
        r
        for r in formulas.leaderboard_plan(gpus=roomy)
        if any(
            (r["strategy"], r["checkpointing"], r["head"], r["precision"])
            == (p["strategy"], p["checkpointing"], p["head"], p["precision"])
            for p in pair
        )
    ]
    assert abs(pair[0]["step_s"][gpu] / pair[1]["step_s"][gpu] - 1) < formulas.PLAN_TIE
    assert formulas.fastest_plan(pair, gpu)["strategy"] == "FSDP"
    assert formulas.fastest_plan(list(reversed(pair)), gpu)["strategy"] == "FSDP"  # not list order
    # the chunked head never holds the (tokens, V) logits and gradients: 30.7 GB -> a few GB
    head = {r["head"]: r["head + loss (GB)"] for r in plan}
    assert round(head["plain"], 1) == 30.7 and head["chunked"] < 3
    # bf16 weights without an fp32 master: 12 bytes of state per parameter instead of 16 (DDP, unsharded); the
    # handout's all-bf16 Config (bf16 AdamW moments too): 8
    states = {
        r["precision"]: sum(v for k, v in r.items() if k.startswith(("bf16 ", "fp32 ", "AdamW")))
        for r in plan
        if r["strategy"] == "DDP"
    }
    assert states["bf16 weights"] / states["fp32 master"] == pytest.approx(12 / 16)
    assert states["all bf16"] / states["fp32 master"] == pytest.approx(8 / 16)
    # the time band over MFU: slower at lower MFU
    band = plan[0]["step_band_s"][gpu]
    assert [band[u] for u in sorted(band)] == sorted(band.values(), reverse=True)
    with pytest.raises(ValueError, match="margin"):
        formulas.leaderboard_plan(margin=1.0)


def test_the_mfu_the_published_best_implies():
    from helpers.published import MARKS

    best, lm, g = MARKS["leaderboard_2026_best"], formulas.LEADERBOARD_MODEL, formulas.LEADERBOARD_GPUS["B200 ~180 GB"]
    lo, hi = (
        formulas.implied_mfu(
            best.value / 1e3, formulas.llama_train_flops(**lm, segments=s), peak_flops=g["flops"], world_size=2
        )
        for s in (0, lm["n_layers"])
    )
    assert round(lo, 2) == 0.27 and round(hi, 2) == 0.35
    assert "self-reported" in best.status
