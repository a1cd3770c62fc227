"""The 2025/2026 block is the course's: a plain transcription of the staff's cs336-basics TransformerBlock (2026,
cs336_basics/model.py and nn_utils.py), and helpers.model's "basics" block, save the same bytes for backward, the
published 166.21 MiB at the 2026 xl, batch 4 × context 128, which formulas.block_saved_parts computes. Counted on
the meta device (no memory, no arithmetic) with saved-tensor hooks, one storage once."""

import math

import pytest
import torch

from helpers import formulas
from helpers.model import Block, get_config

MiB = 2**20

# ---- the staff block, transcribed op for op in plain torch (einops' einsum is torch.einsum; rearrange a view) ----


def staff_linear(x, w):
    return torch.einsum("...i,oi->...o", x, w)  # (..., d_out)


def staff_rmsnorm(x, g, eps=1e-5):
    in_dtype = x.dtype
    x = x.to(torch.float32)
    rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1)
    return (g * (x * rms)).to(in_dtype)


def staff_softmax(x, dim=-1):
    e = torch.exp(x - torch.max(x, dim=dim, keepdim=True)[0])
    return e / torch.sum(e, dim=dim, keepdim=True)


def staff_rope(x, cos_sin):
    """RotaryEmbedding.forward without position ids: pairs (2i, 2i+1), rotated halves concatenated."""
    x1, x2 = x.unflatten(-1, (-1, 2)).movedim(-1, 0).unbind(0)  # "... (half_d xy) -> xy ... half_d"
    cos, sin = cos_sin[:, : x.size(-2), :].unbind(0)  # (T, D/2) each
    return torch.concat((cos * x1 - sin * x2, sin * x1 + cos * x2), dim=-1)  # (..., T, D)


def staff_cos_sin(T, D, theta=10_000.0, device=None):
    freqs = torch.outer(
        torch.arange(T, device=device),
        torch.tensor(theta, device=device) ** -(torch.arange(0, D, 2, device=device) / D),
    )
    return torch.stack((torch.cos(freqs), torch.sin(freqs)))  # (2, T, D/2)


def staff_block(x, w, n_heads, cos_sin):
    """TransformerBlock.forward: ln1, q/k/v projections, RoPE, the causal mask made anew, scaled_dot_product_attention
    with the hand-written softmax, output_proj; ln2, SwiGLU with silu = x * sigmoid(x)."""
    B, T, C = x.shape
    h = staff_rmsnorm(x, w["ln1"])
    q, k, v = (staff_linear(h, w[n]).view(B, T, n_heads, -1).transpose(1, 2) for n in "qkv")  # (B, H, T, D)
    q, k = staff_rope(q, cos_sin), staff_rope(k, cos_sin)
    iota = torch.arange(T, device=x.device)
    mask = iota[:, None] >= iota[None, :]  # (T, T)
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(C // n_heads)  # (B, H, T, T)
    att = staff_softmax(torch.where(mask, scores, float("-inf")))
    y = torch.einsum("...qk,...kd->...qd", att, v).transpose(1, 2).reshape(B, T, C).contiguous()  # (B, T, C)
    x = x + staff_linear(y, w["o"])
    h = staff_rmsnorm(x, w["ln2"])
    a = staff_linear(h, w["w1"])  # (B, T, d_ff)
    return x + staff_linear(a * torch.sigmoid(a) * staff_linear(h, w["w3"]), w["w2"])


def staff_weights(block: Block) -> dict:
    """The staff block's weights from one of ours: q, k, v are the thirds of our fused qkv."""
    q, k, v = block.attn.qkv.weight.chunk(3)
    f = block.ffn
    return dict(ln1=block.norm1.weight, ln2=block.norm2.weight, q=q, k=k, v=v, o=block.attn.proj.weight,
                w1=f.w1.weight, w2=f.w2.weight, w3=f.w3.weight)  # fmt: skip


# ---- counting what autograd saves ----


def saved_storages(fn, x, keep=()) -> list[int]:
    """Bytes of each storage the forward `fn(x)` saves for backward (x's included), `keep`'s tensors left out (the
    weights and buffers, which are there anyway), largest first."""
    skip = {t.untyped_storage()._cdata for t in keep}
    seen = {}

    def pack(t):
        key = t.untyped_storage()._cdata
        if key not in skip:
            seen[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    return sorted(seen.values(), reverse=True)


def meta_block(cfg) -> Block:
    with torch.device("meta"):
        return Block(cfg)


def staff_saved(cfg, B, T) -> list[int]:
    block = meta_block(cfg)
    w, cos_sin = staff_weights(block), staff_cos_sin(T, cfg.head_dim, device="meta")
    x = torch.empty(B, T, cfg.d_model, device="meta", requires_grad=True)
    return saved_storages(
        lambda x: staff_block(x, w, cfg.n_heads, cos_sin), x, [*block.parameters(), *w.values(), cos_sin]
    )


def ours_saved(cfg, B, T) -> list[int]:
    block = meta_block(cfg)
    x = torch.empty(B, T, cfg.d_model, device="meta", requires_grad=True)
    return saved_storages(block, x, [*block.parameters(), *block.buffers()])


XL = get_config("xl-2026", context_length=2048)  # contexts past 512 only for the handout's 2048 (RoPE's tables)


def test_the_staff_block_saves_the_published_166_21_mib_at_the_2026_xl():
    """memory_profiling (f), as published from a GPU run: one block of the 2026 xl, batch 4 × context 128, saves
    166.21 MiB, the five largest tensors 60.2% of it (the five (B, T, d_ff) ones); at context 2048 about 6.35 GiB."""
    at_128 = staff_saved(XL, 4, 128)
    assert round(sum(at_128) / MiB, 2) == 166.21 and sum(at_128) == 166.20703125 * MiB
    assert round(100 * sum(at_128[:5]) / sum(at_128), 1) == 60.2 and at_128[:5] == [4 * 128 * 10240 * 4] * 5
    at_2048 = staff_saved(XL, 4, 2048)
    assert round(sum(at_2048) / 2**30, 2) == 6.35 and sum(at_2048) == 6503.0625 * MiB


@pytest.mark.parametrize("T", [128, 2048])
def test_our_basics_block_saves_what_the_staff_block_saves_storage_for_storage(T):
    ours, staff = ours_saved(XL, 4, T), staff_saved(XL, 4, T)
    assert ours == staff
    parts = formulas.block_saved_parts(XL, 4, T)
    assert sum(ours) == sum(parts.values())  # a part may hold several storages (q, k and v: 3 B·T·d)


@pytest.mark.parametrize("T", [128, 2048])
def test_the_fused_block_saves_one_d_ff_and_one_score_sized_tensor_less_and_the_closed_form_follows(T):
    """ops="fused" (F.silu, torch.softmax): no sigmoid (B·T·d_ff), no exp (B·H·T²), no max indices or sum (B·H·T
    each); the page's old 138.02 MiB at 4 × 128."""
    fused = get_config(XL, ops="fused")
    ours = ours_saved(fused, 4, T)
    assert sum(ours) == sum(formulas.block_saved_parts(fused, 4, T).values())
    B, H, d_ff = 4, XL.n_heads, XL.d_ff
    assert sum(staff_saved(XL, 4, T)) - sum(ours) == 4 * (B * T * d_ff + B * H * T * T + B * H * T) + 8 * B * H * T
    assert T != 128 or sum(ours) == 138.01953125 * MiB


def test_our_basics_block_computes_the_staff_block():
    """Same weights, float64: our block (fused qkv, matmul, RoPE's halves concatenated) and the transcription agree
    to rounding, forward and the gradients of the input and of every weight."""
    cfg = get_config("small-2026/cpu", context_length=24)
    torch.manual_seed(0)
    block = Block(cfg).double()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 24, cfg.d_model, dtype=torch.float64, requires_grad=True)
    ours = block(x)
    (gx,) = torch.autograd.grad(ours.square().sum(), x)
    w = {n: t.detach().clone().requires_grad_() for n, t in staff_weights(block).items()}
    staff = staff_block(x, w, cfg.n_heads, staff_cos_sin(24, cfg.head_dim).double())
    torch.testing.assert_close(ours, staff, rtol=1e-12, atol=1e-12)
    gx_staff, *g = torch.autograd.grad(staff.square().sum(), [x, *w.values()])
    torch.testing.assert_close(gx, gx_staff, rtol=1e-10, atol=1e-10)
    g = dict(zip(w, g, strict=True))
    ours_grads = dict(
        zip(
            dict(block.named_parameters()),
            torch.autograd.grad(block(x).square().sum(), list(block.parameters())),
            strict=True,
        )
    )
    as_staff = {"norm1.weight": g["ln1"], "norm2.weight": g["ln2"], "attn.proj.weight": g["o"],
                "attn.qkv.weight": torch.cat([g["q"], g["k"], g["v"]]),
                **{f"ffn.{n}.weight": g[n] for n in ("w1", "w2", "w3")}}  # fmt: skip
    assert as_staff.keys() == ours_grads.keys()
    for n, grad in ours_grads.items():
        torch.testing.assert_close(grad, as_staff[n], rtol=1e-10, atol=1e-10, msg=lambda m, n=n: f"{n}: {m}")
