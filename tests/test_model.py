"""TransformerLM: analytic parameter counts, sizes and presets, forward/backward, causality, norms, batches."""

import dataclasses
import math

import pytest
import torch
import torch.nn as nn

from helpers import model as M
from helpers.model import (
    CPU_SIZES,
    MODEL_SIZES,
    REFERENCE_SIZES,
    ModelConfig,
    RMSNormTorch,
    TransformerLM,
    build_model,
    count_parameters,
    get_config,
    lm_loss,
    parameter_breakdown,
    random_batch,
    register_norm,
    sizes_for,
)

TOY = ModelConfig("toy", 32, 64, 2, 4, vocab_size=50, context_length=16)


def _numel(model):
    return sum(p.numel() for p in model.parameters())


# ---- sizes and parameter counts ----


@pytest.mark.parametrize("name", list(MODEL_SIZES))
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_analytic_count_matches_the_built_model(name, norm):
    model = build_model(name, device="meta", norm=norm)
    assert all(p.is_meta for p in model.parameters())
    assert count_parameters(get_config(name, norm=norm)) == _numel(model)
    assert count_parameters(name) == _numel(model)


@pytest.mark.parametrize("cfg", [TOY, MODEL_SIZES["small/cpu"], MODEL_SIZES["2.7B"]], ids=lambda c: c.name)
def test_breakdown_sums_to_count_and_matches_the_modules(cfg):
    parts = parameter_breakdown(cfg)
    assert set(parts) == {"embeddings", "attention", "feed_forward", "norms", "lm_head"}
    assert sum(parts.values()) == count_parameters(cfg)
    model = build_model(cfg, device="meta")
    measured = {
        "embeddings": _numel(model.tok_emb) + _numel(model.pos_emb),
        "attention": sum(_numel(b.attn) for b in model.blocks),
        "feed_forward": sum(_numel(b.ffn) for b in model.blocks),
        "norms": sum(_numel(b.norm1) + _numel(b.norm2) for b in model.blocks) + _numel(model.norm_f),
        "lm_head": _numel(model.lm_head),
    }
    assert parts == measured


def test_reference_sizes_have_the_stated_shapes():
    shapes = {n: (c.d_model, c.d_ff, c.n_layers, c.n_heads) for n, c in MODEL_SIZES.items() if n in REFERENCE_SIZES}
    assert shapes == {
        "small": (768, 3072, 12, 12),
        "medium": (1024, 4096, 24, 16),
        "large": (1280, 5120, 36, 20),
        "xl": (1600, 6400, 48, 25),
        "2.7B": (2560, 10240, 32, 32),
    }
    assert set(MODEL_SIZES) == set(REFERENCE_SIZES) | set(CPU_SIZES)
    assert MODEL_SIZES["small"].vocab_size == 10_000 and MODEL_SIZES["small"].context_length == 128
    assert all(c.norm == "rmsnorm" and c.name == n for n, c in MODEL_SIZES.items())


@pytest.mark.parametrize("ref", REFERENCE_SIZES)
def test_cpu_preset_keeps_head_dim_ffn_ratio_and_lm_head_share(ref):
    r, s = MODEL_SIZES[ref], MODEL_SIZES[ref + "/cpu"]
    assert s.name == ref + "/cpu"
    assert s.head_dim == r.head_dim and s.n_heads == max(1, round(r.n_heads / 4))
    assert s.d_ff * r.d_model == r.d_ff * s.d_model
    assert s.n_layers == math.ceil(r.n_layers / 8)
    # the LM head's share d·V / (12·L·d² + d·V) is kept when V / (L·d) is: up to rounding V to a whole token
    assert s.vocab_size / (s.n_layers * s.d_model) == pytest.approx(
        r.vocab_size / (r.n_layers * r.d_model), abs=0.5 / (s.n_layers * s.d_model) + 1e-12
    )
    assert (s.context_length, s.norm) == (r.context_length, r.norm)


def test_large_preset_rounds_layers_up():
    assert MODEL_SIZES["large/cpu"].n_layers == 5  # 36 / 8 = 4.5


def test_sizes_for_profiles():
    assert sizes_for("cpu") == ["small/cpu", "medium/cpu", "large/cpu", "xl/cpu", "2.7B/cpu"]
    assert sizes_for("gpu") == ["small", "medium", "large", "xl", "2.7B"]
    with pytest.raises(ValueError):
        sizes_for("tpu")


def test_get_config_overrides_and_accepts_a_config():
    cfg = get_config("small/cpu", norm="layernorm", context_length=64)
    assert (cfg.norm, cfg.context_length, cfg.d_model) == ("layernorm", 64, 192)
    assert MODEL_SIZES["small/cpu"].norm == "rmsnorm"  # the preset itself is untouched
    assert get_config(TOY) is TOY
    assert get_config(TOY, n_layers=3).n_layers == 3


def test_unknown_size_name_lists_the_known_ones():
    with pytest.raises((KeyError, ValueError)) as info:
        get_config("huge")
    assert "huge" in str(info.value) and "small/cpu" in str(info.value) and "2.7B" in str(info.value)


def test_heads_must_divide_d_model():
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig("bad", 30, 64, 2, 4)
    with pytest.raises(ValueError, match="divisible"):
        get_config(TOY, n_heads=5)
    assert TOY.head_dim == 8


# ---- building ----


def test_model_structure_has_no_biases_and_an_untied_head():
    model = build_model(TOY)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 4 * TOY.n_layers + 1  # qkv, proj, w1, w2 per block + lm_head
    assert all(m.bias is None for m in linears)
    assert model.blocks[0].attn.qkv.weight.shape == (3 * TOY.d_model, TOY.d_model)
    assert model.lm_head.weight.data_ptr() != model.tok_emb.weight.data_ptr()
    assert model.cfg is TOY


def test_causal_mask_is_a_non_persistent_bool_buffer():
    model = build_model(TOY)
    mask = model.blocks[0].attn.mask
    assert mask.dtype == torch.bool and mask.shape == (16, 16)
    assert torch.equal(mask, torch.tril(torch.ones(16, 16, dtype=torch.bool)))
    assert not any(k.endswith("mask") for k in model.state_dict())
    assert all(p.dtype != torch.bool for p in model.parameters())


def test_init_is_normal_002_and_norms_are_ones():
    torch.manual_seed(0)
    model = build_model("small/cpu")
    for w in (model.tok_emb.weight, model.pos_emb.weight, model.blocks[0].attn.qkv.weight, model.lm_head.weight):
        assert abs(w.std().item() - 0.02) < 0.002 and abs(w.mean().item()) < 0.002
    assert torch.equal(model.blocks[0].norm1.weight, torch.ones(model.cfg.d_model))
    assert torch.equal(model.norm_f.weight, torch.ones(model.cfg.d_model))


def test_build_model_device_and_dtype():
    meta = build_model("2.7B", device="meta")
    assert isinstance(meta, TransformerLM) and meta.cfg == MODEL_SIZES["2.7B"]
    assert all(p.device.type == "meta" for p in meta.parameters())
    bf16 = build_model(TOY, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())
    assert bf16.blocks[0].attn.mask.dtype == torch.bool
    assert bf16(torch.zeros(1, 4, dtype=torch.long)).dtype == torch.bfloat16


# ---- forward, backward, causality ----


def test_forward_shape_and_every_parameter_gets_a_grad():
    torch.manual_seed(0)
    model = build_model(TOY)
    x, y = random_batch(TOY, batch_size=3, context_length=10)
    logits = model(x)
    assert logits.shape == (3, 10, 50) and logits.dtype == torch.float32
    loss = lm_loss(logits, y)
    assert loss.ndim == 0 and abs(loss.item() - math.log(50)) < 0.5  # near uniform at init
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_lm_loss_is_mean_cross_entropy_over_positions():
    torch.manual_seed(0)
    logits, targets = torch.randn(2, 3, 5), torch.randint(5, (2, 3))
    expected = torch.stack([-logits[b, t].log_softmax(-1)[targets[b, t]] for b in range(2) for t in range(3)]).mean()
    torch.testing.assert_close(lm_loss(logits, targets), expected)


@pytest.mark.parametrize("t", [0, 5, 15])
def test_causality(t):
    torch.manual_seed(0)
    model = build_model(TOY).eval()
    x = torch.randint(50, (2, 16), generator=torch.Generator().manual_seed(1))
    x2 = x.clone()
    x2[:, t] = (x[:, t] + 1) % 50
    with torch.no_grad():
        a, b = model(x), model(x2)
    torch.testing.assert_close(a[:, :t], b[:, :t])
    assert not torch.allclose(a[:, t], b[:, t])


def test_cpu_preset_forward_backward():
    torch.manual_seed(0)
    model = build_model("small/cpu")
    x, y = random_batch(model.cfg, batch_size=2, context_length=32)
    logits = model(x)
    assert logits.shape == (2, 32, MODEL_SIZES["small/cpu"].vocab_size)
    lm_loss(logits, y).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_context_longer_than_context_length_raises():
    model = build_model(TOY)
    model(torch.zeros(1, 16, dtype=torch.long))  # exactly the context length is fine
    with pytest.raises(ValueError, match="17.*16"):
        model(torch.zeros(1, 17, dtype=torch.long))


# ---- norms ----


def test_layernorm_swap():
    model = build_model(TOY, norm="layernorm")
    norms = [model.norm_f] + [n for b in model.blocks for n in (b.norm1, b.norm2)]
    assert all(isinstance(n, nn.LayerNorm) and n.bias is None for n in norms)
    assert not any(isinstance(m, RMSNormTorch) for m in model.modules())
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 50)
    rms = build_model(TOY)
    assert isinstance(rms.norm_f, RMSNormTorch) and not any(isinstance(m, nn.LayerNorm) for m in rms.modules())


def test_register_norm_makes_a_factory_usable_by_name(monkeypatch):
    monkeypatch.setattr(M, "NORM_LAYERS", dict(M.NORM_LAYERS))

    class MyNorm(RMSNormTorch):
        pass

    register_norm("mine", MyNorm)
    assert "mine" in M.NORM_LAYERS
    model = build_model(TOY, norm="mine")
    assert isinstance(model.norm_f, MyNorm) and isinstance(model.blocks[1].norm2, MyNorm)
    assert count_parameters(model.cfg) == _numel(model)


def test_unknown_norm_raises_listing_known():
    with pytest.raises(ValueError, match="rmsnorm.*layernorm"):
        build_model(TOY, norm="batchnorm")


def test_rmsnorm_matches_formula():
    torch.manual_seed(0)
    norm = RMSNormTorch(8)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8))
    x = torch.randn(3, 8)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), expected)


def test_rmsnorm_computes_in_fp32_under_autocast():
    torch.manual_seed(0)
    norm = RMSNormTorch(256)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(256))
    x = (torch.randn(64, 256) * 3).bfloat16()
    x32 = x.float()
    reference = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight).bfloat16()
    w16 = norm.weight.bfloat16()
    naive_bf16 = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w16
    assert not torch.equal(naive_bf16, reference)  # so the check below can tell the two apart
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = norm(x)
        out32 = norm(x32)
    assert out.dtype == torch.bfloat16 and out32.dtype == torch.float32
    torch.testing.assert_close(out, reference, rtol=0, atol=0)


# ---- random batches ----


def test_random_batch_shapes_range_and_shift():
    x, y = random_batch(TOY, batch_size=4)
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    assert x.min() >= 0 and max(x.max(), y.max()) < 50
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert len(torch.unique(x)) > 10  # actually random, not constant
    x, y = random_batch("small/cpu", batch_size=2, context_length=8)
    assert x.shape == (2, 8) and y.max() < 10_000


def test_random_batch_is_deterministic_with_a_seeded_generator():
    a = random_batch(TOY, 2, generator=torch.Generator().manual_seed(0))
    b = random_batch(TOY, 2, generator=torch.Generator().manual_seed(0))
    c = random_batch(TOY, 2, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("name", ["small", "small/cpu", "2.7B/cpu"])
def test_parameter_shapes_are_the_models_own_named_parameters(name):
    model = build_model(name, device="meta")
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == list(M.parameter_shapes(name).items())


# ---- the attention choice (notebook 06) ----

ATTN_TINY = ModelConfig("attn_tiny", 64, 128, 2, 4, vocab_size=50, context_length=40)  # head dim 16 (Triton's least)


def test_attention_defaults_to_naive_and_rejects_unknown_names():
    assert get_config("small").attention == "naive" and build_model(TOY).blocks[0].attn.impl == "naive"
    assert build_model("small/cpu", device="meta", attention="flash_triton").cfg.attention == "flash_triton"
    with pytest.raises(ValueError, match="unknown attention 'flash'"):
        get_config("small", attention="flash")


@pytest.mark.parametrize("impl", ["sdpa", "flash_pytorch", "flash_triton"])
def test_every_attention_gives_the_naive_logits_and_gradients(impl):
    """Same weights, same batch: logits and every gradient within rtol 1e-4, atol 1e-5 (fp32; the sums run in
    another order), and the causal-mask buffer (formulas.buffer_bytes) is kept whatever the choice."""
    if impl == "flash_triton":
        pytest.importorskip("triton")
    x, y = random_batch(ATTN_TINY, 2, context_length=37, generator=torch.Generator().manual_seed(0))  # ragged T
    runs = {}
    for name in ("naive", impl):
        torch.manual_seed(0)
        model = build_model(ATTN_TINY, attention=name)
        logits = model(x)
        lm_loss(logits, y).backward()
        runs[name] = logits, {n: p.grad for n, p in model.named_parameters()}, sum(b.numel() for b in model.buffers())
    torch.testing.assert_close(runs[impl][0], runs["naive"][0], rtol=1e-4, atol=1e-5)
    for n, g in runs["naive"][1].items():
        torch.testing.assert_close(runs[impl][1][n], g, rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
    assert runs[impl][2] == runs["naive"][2] == ATTN_TINY.n_layers * ATTN_TINY.context_length**2


# ---- the two architectures: 2024's ("gpt") and cs336-basics' of 2025/2026 ("basics", SwiGLU and RoPE) ----

EVERY_EDITION_SIZE = [n for e in ("2025", "2026") for n in M.EDITION_SIZES[e]]  # 2024's: tests above
TOY_BASICS = ModelConfig("toy-basics", 32, 64, 2, 4, vocab_size=50, context_length=16, arch="basics")


@pytest.mark.parametrize("name", EVERY_EDITION_SIZE)
def test_every_editions_sizes_count_and_name_their_parameters_as_built(name):
    model = build_model(name, device="meta")
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == list(M.parameter_shapes(name).items())
    assert count_parameters(name) == _numel(model)


def test_editions_tables_and_architectures():
    """2025 keeps 2024's shapes on the basics model; 2026's xl is the 2.7B's shape, its 10B is 4608/12288/50/36;
    one block's fp32 gradients of the 2026 xl: (4·2560² + 3·2560·10240 + 2·2560)·4 B, about 400 MiB."""
    assert {c.arch for c in M.EDITION_SIZES["2024"].values()} == {"gpt"}
    assert {c.arch for e in ("2025", "2026") for c in M.EDITION_SIZES[e].values()} == {"basics"}
    assert [(c.d_model, c.d_ff, c.n_layers, c.n_heads) for c in M.SIZES_2025.values()] == [
        (c.d_model, c.d_ff, c.n_layers, c.n_heads) for c in map(get_config, REFERENCE_SIZES)
    ]
    xl, big = get_config("xl-2026"), get_config("10B-2026")
    assert (xl.d_model, xl.d_ff, xl.n_layers, xl.n_heads, xl.context_length) == (2560, 10240, 32, 32, 512)
    assert (big.d_model, big.d_ff, big.n_layers, big.n_heads) == (4608, 12288, 50, 36)
    block = sum(math.prod(s) for k, s in M.parameter_shapes(xl).items() if k.startswith("blocks.0."))
    assert block == 4 * 2560**2 + 3 * 2560 * 10240 + 2 * 2560
    assert sizes_for("cpu", "2026") == [n + "/cpu" for n in M.SIZES_2026] and sizes_for("gpu", "2025") == list(
        M.SIZES_2025
    )
    with pytest.raises(ValueError, match="unknown edition"):
        sizes_for("cpu", "2023")
    with pytest.raises(ValueError, match="unknown arch"):
        ModelConfig("x", 32, 64, 1, 4, arch="llama")


def test_basics_model_has_swiglu_and_no_position_table():
    model = build_model(TOY_BASICS)
    assert model.pos_emb is None and model.blocks[0].ffn.w3 is not None
    ffn, x = model.blocks[0].ffn, torch.randn(2, 3, 32)
    a = ffn.w1(x)
    expected = ffn.w2(a * torch.sigmoid(a) * ffn.w3(x))  # SwiGLU as the staff code writes it: silu = x·sigmoid(x)
    torch.testing.assert_close(ffn(x), expected, rtol=0, atol=0)
    fused = build_model(dataclasses.replace(TOY_BASICS, ops="fused"))
    fused.load_state_dict(model.state_dict())
    f = fused.blocks[0].ffn
    torch.testing.assert_close(f(x), f.w2(torch.nn.functional.silu(f.w1(x)) * f.w3(x)), rtol=0, atol=0)


def test_rope_turns_pairs_and_scores_depend_on_relative_position_only():
    """RoPE rotates each pair (2i, 2i+1) by t·theta^(-2i/D): norms are kept, position 0 is unchanged (laid out as
    the staff's code does, the pairs' first members then their second; "fused" interleaves them back), and the score
    of a query at m with a key at n depends on m - n alone (fp32: agreement to a few units of 2^-24 per term)."""
    attn = build_model(TOY_BASICS).blocks[0].attn
    D = attn.head_dim
    q = torch.randn(1, 1, 1, D, dtype=torch.float64).expand(1, 1, 16, D)  # the same vector at every position
    k = torch.randn(1, 1, 1, D, dtype=torch.float64).expand(1, 1, 16, D)
    rq, rk = attn.rotate(q), attn.rotate(k)  # (1, 1, 16, D)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1), rtol=1e-6, atol=0)
    halves = torch.cat((q[..., 0, 0::2], q[..., 0, 1::2]), dim=-1)  # (1, 1, D)
    torch.testing.assert_close(rq[..., 0, :], halves, rtol=0, atol=0)
    fused = build_model(dataclasses.replace(TOY_BASICS, ops="fused")).blocks[0].attn
    torch.testing.assert_close(fused.rotate(q)[..., 0, :], q[..., 0, :], rtol=0, atol=0)
    scores = rq[0, 0] @ rk[0, 0].T  # (16, 16): m, n
    for shift in (0, 3, 7):
        diagonal = torch.diagonal(scores, offset=-shift)  # pairs (m, m - shift)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(scores.diagonal(0)[:1], scores.diagonal(-3)[:1])  # and it does depend on m - n


@pytest.mark.parametrize("t", [0, 5, 15])
def test_basics_model_is_causal_and_every_parameter_gets_a_grad(t):
    torch.manual_seed(0)
    model = build_model(TOY_BASICS)
    x = torch.randint(50, (2, 16), generator=torch.Generator().manual_seed(1))
    x2 = x.clone()
    x2[:, t] = (x[:, t] + 1) % 50
    a, b = model(x), model(x2)
    torch.testing.assert_close(a[:, :t], b[:, :t])
    assert not torch.allclose(a[:, t], b[:, t])
    lm_loss(a, x).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_ops_default_to_the_archs_own_and_the_staff_block_keeps_no_mask_buffer():
    """ "basics" computes as the course's staff code does (no mask buffer: the mask is made each forward); "gpt" and
    ops="fused" keep ours (a mask buffer); same parameters either way."""
    assert TOY_BASICS.block_ops == "staff" and TOY.block_ops == "fused" and get_config("xl-2026").block_ops == "staff"
    fused = dataclasses.replace(TOY_BASICS, ops="fused")
    assert not hasattr(build_model(TOY_BASICS).blocks[0].attn, "mask") and hasattr(
        build_model(fused).blocks[0].attn, "mask"
    )
    assert M.parameter_shapes(fused) == M.parameter_shapes(TOY_BASICS) and count_parameters(fused) == count_parameters(
        TOY_BASICS
    )
    with pytest.raises(ValueError, match="unknown ops"):
        get_config("xl-2026", ops="flash")
    with pytest.raises(ValueError, match="not transcribed"):
        get_config("small", ops="staff")
