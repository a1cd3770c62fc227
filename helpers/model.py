"""The Transformer LM every notebook measures, its sizes, and its analytic parameter count.

    model = build_model("small/cpu")                       # or a ModelConfig; device=, dtype=, **overrides
    x, y = random_batch(model.cfg, batch_size=4)         # (B, T) int64 each, y is x shifted by one
    loss = lm_loss(model(x), y)

A pre-norm decoder: token embeddings, `n_layers` blocks of `x + attn(norm1(x))` and `x + ffn(norm2(x))`, a final
norm and an untied LM head; every Linear is bias-free. Two architectures (`arch`, ARCHS): the 2024 edition's ("gpt":
learned positions, GELU feed-forward w2(gelu(w1 x))) and the cs336-basics model the 2025 and 2026 editions measure
("basics": RoPE on queries and keys, SwiGLU w2(silu(w1 x) * w3 x)); each edition's Table 1 is in EDITION_SIZES
("xl-2026", "small-2025/cpu"). The "basics" block computes as the course's staff code does (`ops`, OPS: SiLU as
x·sigmoid(x), softmax as exp/sum, the mask made each forward), so what autograd saves and what a profiler shows is
what a student's run shows; ops="fused" is ours (F.silu, torch.softmax), one (B, T, d_ff) and one (B, H, T, T) tensor
lighter per block. (2025's staff RoPE gathered cos and sin by position ids and interleaved its output; 2026's,
written here, slices and concatenates.) Attention is written out by default (`attention="naive"`, no fused kernel)
so a profiler shows the softmax as its own ops; `attention="sdpa" | "flash_pytorch" | "flash_triton"` swaps in
F.scaled_dot_product_attention or helpers.attention's FlashAttention-2 (notebook 06), e.g. build_model("small",
attention="flash_triton").

Sizes: the five reference sizes (small ... 2.7B) are for GPUs. Each has a CPU-scale preset
"<name>/cpu" (`cpu_preset`) that keeps the ratios the notebooks' answers depend on: the same head_dim
with a quarter of the heads (width ~÷4), d_ff/d_model kept, layers ÷8 (rounded up), and a vocabulary
chosen so the LM head keeps its share of the matmul FLOPs. Run at a quarter of the reference context
(32 against 128, notebook 01's cpu profile), attention and softmax keep their shares too.
`formulas.shape_ratios` computes those ratios; notebook 00 shows them side by side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

ATTENTION_IMPLS = ("naive", "sdpa", "flash_pytorch", "flash_triton")  # ModelConfig.attention (notebook 06)
ARCHS = {  # ModelConfig.arch: the two architectures the course's editions measure
    "gpt": "2024: GELU feed-forward (w1, w2), learned positions",
    "basics": "2025/2026 (cs336-basics): SwiGLU feed-forward (w1, w2, w3), rotary positions (RoPE)",
}
ARCH_NAMES = {"gpt": "GPT-2 style: GELU, learned positions", "basics": "cs336-basics: SwiGLU, RoPE"}  # in a sentence
OPS = {  # ModelConfig.ops: how a block computes, which decides what autograd saves and what a profiler shows
    "staff": "the course's cs336-basics op for op: SiLU as x·sigmoid(x), softmax as exp(x - max) / sum, the causal "
    "mask built each forward and applied with where, RoPE's rotated halves concatenated (2025/2026 editions)",
    "fused": "ours: F.silu / F.gelu, torch.softmax, a causal-mask buffer and masked_fill, RoPE's pairs interleaved",
}
ARCH_OPS = {"gpt": "fused", "basics": "staff"}  # an arch's ops when ModelConfig.ops is None


@dataclass(frozen=True)
class ModelConfig:
    """The shape of one TransformerLM, as plain data."""

    name: str
    d_model: int
    d_ff: int
    n_layers: int
    n_heads: int
    vocab_size: int = 10_000
    context_length: int = 128
    norm: str = "rmsnorm"
    attention: str = "naive"  # one of ATTENTION_IMPLS
    arch: str = "gpt"  # one of ARCHS
    rope_theta: float = 10_000.0  # "basics" only
    ops: str | None = None  # one of OPS; None: the arch's own (ARCH_OPS)

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}; known: {', '.join(ARCHS)}")
        if self.ops is not None and self.ops not in OPS:
            raise ValueError(f"unknown ops {self.ops!r}; known: {', '.join(OPS)}")
        if self.arch == "gpt" and self.ops == "staff":
            raise ValueError("the 2024 staff block (arch 'gpt') is not transcribed here; use ops='fused'")
        if self.arch == "basics" and self.head_dim % 2:
            raise ValueError(f"RoPE rotates pairs: head_dim ({self.head_dim}) must be even")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"unknown attention {self.attention!r}; known: {', '.join(ATTENTION_IMPLS)}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def block_ops(self) -> str:
        """The ops a block runs: `ops`, or the arch's own ("staff" for "basics", "fused" for "gpt")."""
        return self.ops or ARCH_OPS[self.arch]


CPU_WIDTH, CPU_LAYERS = 4, 8  # the CPU presets: heads ÷ 4 at the reference head_dim, layers ÷ 8


def cpu_preset(cfg: ModelConfig) -> ModelConfig:
    """The CPU-scale preset of `cfg`: heads ÷ 4 (head_dim kept), d_ff/d_model kept, layers ÷ 8 (rounded up), and
    vocab_size such that the LM head's share of the matmul FLOPs, d·V / (L·12d² + d·V), stays the reference's."""
    n_heads = max(1, round(cfg.n_heads / CPU_WIDTH))
    d_model = n_heads * cfg.head_dim
    n_layers = math.ceil(cfg.n_layers / CPU_LAYERS)
    vocab = round(cfg.vocab_size * (n_layers * d_model) / (cfg.n_layers * cfg.d_model))  # keeps V / (L·d)
    return dataclasses.replace(
        cfg,
        name=f"{cfg.name}/cpu",
        d_model=d_model,
        d_ff=cfg.d_ff * d_model // cfg.d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        vocab_size=vocab,
    )


REFERENCE_SIZES = ["small", "medium", "large", "xl", "2.7B"]
CPU_SIZES = [s + "/cpu" for s in REFERENCE_SIZES]
_REFERENCE = [  # name, d_model, d_ff, n_layers, n_heads
    ModelConfig("small", 768, 3072, 12, 12),
    ModelConfig("medium", 1024, 4096, 24, 16),
    ModelConfig("large", 1280, 5120, 36, 20),
    ModelConfig("xl", 1600, 6400, 48, 25),
    ModelConfig("2.7B", 2560, 10240, 32, 32),
]
MODEL_SIZES: dict[str, ModelConfig] = {c.name: c for c in _REFERENCE + [cpu_preset(c) for c in _REFERENCE]}
# The 2025 and 2026 editions measure their assignment 1's model (cs336-basics: SwiGLU, RoPE). 2025's Table 1 has the
# 2024 shapes; 2026's renames them (its xl is the 2.7B's shape) and adds a 10B, at context 512. They live beside
# MODEL_SIZES under their edition's suffix ("xl-2026", "small-2025/cpu"), so "xl" keeps the 2024 meaning.
SIZES_2025: dict[str, ModelConfig] = {
    f"{c.name}-2025": dataclasses.replace(c, name=f"{c.name}-2025", arch="basics") for c in _REFERENCE
}
SIZES_2026: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        ModelConfig("small-2026", 768, 3072, 12, 12, context_length=512, arch="basics"),
        ModelConfig("medium-2026", 1024, 4096, 24, 16, context_length=512, arch="basics"),
        ModelConfig("large-2026", 1280, 5120, 36, 20, context_length=512, arch="basics"),
        ModelConfig("xl-2026", 2560, 10240, 32, 32, context_length=512, arch="basics"),
        ModelConfig("10B-2026", 4608, 12288, 50, 36, context_length=512, arch="basics"),
    )
}
EDITION_SIZES: dict[str, dict[str, ModelConfig]] = {  # each edition's Table 1, then its cpu presets
    "2024": MODEL_SIZES,
    **{
        edition: {**sizes, **{f"{n}/cpu": cpu_preset(c) for n, c in sizes.items()}}
        for edition, sizes in (("2025", SIZES_2025), ("2026", SIZES_2026))
    },
}


def sizes_for(profile: str, edition: str = "2024") -> list[str]:
    """The model sizes a profile runs for an edition: the "/cpu" presets on "cpu", Table 1's sizes on "gpu"."""
    if profile not in ("cpu", "gpu"):
        raise ValueError(f"unknown profile {profile!r}; expected 'cpu' or 'gpu'")
    if edition not in EDITION_SIZES:
        raise ValueError(f"unknown edition {edition!r}; known: {', '.join(EDITION_SIZES)}")
    names = [n for n in EDITION_SIZES[edition] if n.endswith("/cpu") == (profile == "cpu")]
    return names


def edition_arch(edition: str) -> str:
    """The architecture (a key of ARCHS) of an edition's model: "gpt" for 2024, "basics" for 2025 and 2026."""
    return next(iter(EDITION_SIZES[str(edition)].values())).arch


def for_edition(name: str, edition: str) -> str:
    """A size name as an edition's Table 1 names it: "xl/cpu" -> "xl-2026/cpu" (2024's names are the plain ones); a
    size the edition's table lacks (2026 has no 2.7B: its xl has that shape) is an error naming the ones it has."""
    edition = str(edition)
    if edition not in EDITION_SIZES:
        raise ValueError(f"unknown edition {edition!r}; known: {', '.join(EDITION_SIZES)}")
    base, cpu = name.removesuffix("/cpu"), name.endswith("/cpu")
    base = re.sub(r"-20\d\d$", "", base)
    named = (base if edition == "2024" else f"{base}-{edition}") + ("/cpu" if cpu else "")
    if named not in EDITION_SIZES[edition]:
        raise ValueError(
            f"the {edition} edition's Table 1 has no {base!r}; it has {', '.join(sizes_for('gpu', edition))}"
        )
    return named


def size_edition(name: str) -> str:
    """The edition whose Table 1 a size name comes from: "xl-2026/cpu" -> "2026", "small/cpu" -> "2024"."""
    found = re.search(r"-(20\d\d)(/cpu)?$", name)
    return found.group(1) if found else "2024"


def get_config(name_or_cfg: str | ModelConfig, **overrides) -> ModelConfig:
    """A ModelConfig from a MODEL_SIZES name or a config, with fields replaced by `overrides`."""
    if isinstance(name_or_cfg, ModelConfig):
        cfg = name_or_cfg
    else:
        known = {n: c for sizes in EDITION_SIZES.values() for n, c in sizes.items()}
        if name_or_cfg not in known:
            raise ValueError(f"unknown model size {name_or_cfg!r}; known: {', '.join(known)}")
        cfg = known[name_or_cfg]
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


class RMSNormTorch(nn.Module):
    """The model's default norm: root-mean-square norm with a learnable gain, in PyTorch ops, in float32 whatever
    the input dtype. (helpers.rmsnorm.RMSNormLayer is the same layer with a choice of kernel.)"""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()  # (..., C) in fp32, also under autocast
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., C)
        return (y * self.weight).to(x.dtype)


def _rmsnorm_layer(impl: str) -> Callable[[int], nn.Module]:
    """A factory for helpers.rmsnorm.RMSNormLayer(d, impl), imported when a model asks for it (Triton is heavy)."""

    def make(d_model: int) -> nn.Module:
        from helpers.rmsnorm import RMSNormLayer

        return RMSNormLayer(d_model, impl=impl)

    return make


NORM_LAYERS: dict[str, Callable[[int], nn.Module]] = {
    "rmsnorm": RMSNormTorch,
    "layernorm": lambda d: nn.LayerNorm(d, eps=1e-5, bias=False),  # no bias: same count as RMSNorm
    "rmsnorm_triton": _rmsnorm_layer("triton"),  # fused Triton kernels (notebook 02)
    "rmsnorm_torchfn": _rmsnorm_layer("torchfn"),  # the hand-derived autograd Function
}


def register_norm(name: str, factory: Callable[[int], nn.Module]) -> Callable[[int], nn.Module]:
    """Make `factory(d_model)` available as ModelConfig(norm=name); returns the factory."""
    NORM_LAYERS[name] = factory
    return factory


def make_norm(name: str, d_model: int) -> nn.Module:
    """A norm layer of width d_model from NORM_LAYERS."""
    if name not in NORM_LAYERS:
        raise ValueError(f"unknown norm {name!r}; known: {', '.join(NORM_LAYERS)}")
    return NORM_LAYERS[name](d_model)


def _flash(impl: str, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal FlashAttention-2 from helpers.attention, imported on first use (Triton is heavy; no import cycle)."""
    from helpers.attention import FlashAttentionPyTorch, FlashAttentionTriton

    fn = FlashAttentionTriton if impl == "flash_triton" else FlashAttentionPyTorch
    return fn.apply(q, k, v, True)  # (B, H, T, D)


def silu(x: Tensor) -> Tensor:
    """SiLU as the course's staff code writes it, x · sigmoid(x): autograd keeps x and sigmoid(x) (F.silu keeps x)."""
    return x * torch.sigmoid(x)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax as the course's staff code writes it, exp(x - max) / sum: autograd keeps the max's indices, the exp,
    the sum and (for the next matmul) the output, where torch.softmax keeps its output alone."""
    e = torch.exp(x - torch.max(x, dim=dim, keepdim=True)[0])  # (..., N)
    return e / torch.sum(e, dim=dim, keepdim=True)  # (..., N)


class Softmax(nn.Module):
    """softmax(x, -1) as a module, only so that the profiler's module labels (profiling.label_modules) name its five
    ops as one; torch.softmax is one op and needs none."""

    def forward(self, x: Tensor) -> Tensor:
        return softmax(x, dim=-1)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: written out op by op ("naive"), or a fused implementation (cfg.attention).
    ops "staff" (the cs336-basics model) builds the causal mask each forward, as the course's code does; "fused"
    keeps it as a buffer in every attention mode, so buffers (formulas.buffer_bytes) do not depend on the choice."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim, self.impl = cfg.n_heads, cfg.head_dim, cfg.attention
        self.staff = cfg.block_ops == "staff"
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        T = cfg.context_length
        if self.staff:
            self.softmax = Softmax()
        else:
            self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)), persistent=False)
        self.rope = cfg.arch == "basics"
        if self.rope:  # the angles of RoPE (Su et al., 2021): position t turns pair i by t·theta^(-2i/D)
            inv = cfg.rope_theta ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
            angles = torch.outer(torch.arange(T, dtype=torch.float32), inv)  # (T, D/2)
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)

    def rotate(self, t: Tensor) -> Tensor:
        """RoPE on (B, H, T, D): each pair (2i, 2i+1) of a position's vector turned by that position's angle; the
        turned pairs' first and second members concatenated in two halves ("staff", the 2026 staff code), or
        interleaved back in place ("fused"). Scores are the same either way: q and k are laid out alike."""
        T = t.shape[-2]
        cos, sin = self.cos[:T].to(t.dtype), self.sin[:T].to(t.dtype)  # (T, D/2)
        even, odd = t[..., 0::2], t[..., 1::2]  # (B, H, T, D/2) each
        if self.staff:
            return torch.cat((cos * even - sin * odd, sin * even + cos * odd), dim=-1)  # (B, H, T, D)
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)  # (B, H, T, D)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if self.rope:
            q, k = self.rotate(q), self.rotate(k)  # (B, H, T, D)
        if self.impl != "naive":
            y = (
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
                if self.impl == "sdpa"
                else _flash(self.impl, q, k, v)
            )  # (B, H, T, D)
            return self.proj(y.transpose(1, 2).reshape(B, T, C))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, T)
        if self.staff:
            iota = torch.arange(T, device=x.device)  # (T,)
            scores = torch.where(iota[:, None] >= iota[None, :], scores, float("-inf"))  # (T, T) mask, made anew
            att = self.softmax(scores)  # (B, H, T, T)
        else:
            scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))
            att = torch.softmax(scores, dim=-1)  # (B, H, T, T)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.proj(y)


class FeedForward(nn.Module):
    """Position-wise MLP: w2(gelu(w1(x))) ("gpt"), or SwiGLU w2(silu(w1(x)) * w3(x)) ("basics"; SiLU as x·sigmoid(x)
    with ops "staff", F.silu with "fused")."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.silu = silu if cfg.block_ops == "staff" else F.silu
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        self.w3 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False) if cfg.arch == "basics" else None

    def forward(self, x: Tensor) -> Tensor:
        if self.w3 is None:
            return self.w2(F.gelu(self.w1(x)))  # (B, T, d_ff) -> (B, T, C)
        return self.w2(self.silu(self.w1(x)) * self.w3(x))  # (B, T, d_ff) -> (B, T, C)


class Block(nn.Module):
    """One pre-norm Transformer block."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = make_norm(cfg.norm, cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = make_norm(cfg.norm, cfg.d_model)
        self.ffn = FeedForward(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))  # (B, T, C)
        return x + self.ffn(self.norm2(x))  # (B, T, C)


class TransformerLM(nn.Module):
    """Decoder-only language model: token ids (B, T) -> next-token logits (B, T, vocab_size)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context_length, cfg.d_model) if cfg.arch == "gpt" else None  # basics: RoPE
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm_f = make_norm(cfg.norm, cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: Tensor) -> Tensor:
        B, T = idx.shape
        if self.cfg.context_length < T:
            raise ValueError(f"sequence length {T} exceeds context_length {self.cfg.context_length}")
        x = self.embed(idx)  # (B, T, C)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        return self.lm_head(self.norm_f(x))  # (B, T, V)

    def embed(self, idx: Tensor) -> Tensor:
        """Token ids (B, T) -> the first residual (B, T, C): token embeddings, plus learned positions ("gpt")."""
        x = self.tok_emb(idx)  # (B, T, C)
        if self.pos_emb is None:
            return x
        return x + self.pos_emb(torch.arange(idx.shape[1], device=idx.device))  # (B, T, C)


def build_model(name_or_cfg: str | ModelConfig, device=None, dtype=None, **overrides) -> TransformerLM:
    """A TransformerLM allocated directly on `device` ("meta" allocates nothing), optionally cast to `dtype`."""
    cfg = get_config(name_or_cfg, **overrides)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = TransformerLM(cfg)
    return model.to(dtype) if dtype is not None else model


def parameter_shapes(name_or_cfg: str | ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape, named and ordered as TransformerLM.named_parameters(), from the config alone."""
    c = get_config(name_or_cfg)
    d = c.d_model
    shapes = {"tok_emb.weight": (c.vocab_size, d)}
    if c.arch == "gpt":
        shapes["pos_emb.weight"] = (c.context_length, d)
    for i in range(c.n_layers):
        shapes.update(
            {
                f"blocks.{i}.norm1.weight": (d,),
                f"blocks.{i}.attn.qkv.weight": (3 * d, d),
                f"blocks.{i}.attn.proj.weight": (d, d),
                f"blocks.{i}.norm2.weight": (d,),
                f"blocks.{i}.ffn.w1.weight": (c.d_ff, d),
                f"blocks.{i}.ffn.w2.weight": (d, c.d_ff),
            }
        )
        if c.arch == "basics":
            shapes[f"blocks.{i}.ffn.w3.weight"] = (c.d_ff, d)
    shapes.update({"norm_f.weight": (d,), "lm_head.weight": (c.vocab_size, d)})
    return shapes


PARTS = {"emb": "embeddings", "attn": "attention", "ffn": "feed_forward", "norm": "norms", "lm_head": "lm_head"}


def parameter_breakdown(name_or_cfg: str | ModelConfig) -> dict[str, int]:
    """Analytic parameter count per part of the model (embeddings, attention, feed_forward, norms, lm_head)."""
    out = dict.fromkeys(PARTS.values(), 0)
    for name, shape in parameter_shapes(name_or_cfg).items():
        part = next(v for k, v in PARTS.items() if k in name)
        out[part] += math.prod(shape)
    return out


def count_parameters(name_or_cfg: str | ModelConfig) -> int:
    """Analytic total parameter count of the model a config describes (no model is built)."""
    return sum(parameter_breakdown(name_or_cfg).values())


def random_batch(
    cfg: str | ModelConfig,
    batch_size: int,
    context_length: int | None = None,
    device="cpu",
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Random (inputs, targets) token ids, each (B, T) int64; targets are inputs shifted by one."""
    cfg = get_config(cfg)
    T = cfg.context_length if context_length is None else context_length
    draw_on = generator.device if generator is not None else device  # a seeded CPU generator works for any device
    tokens = torch.randint(cfg.vocab_size, (batch_size, T + 1), generator=generator, device=draw_on)  # (B, T+1)
    tokens = tokens.to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # (B, T), (B, T)


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross entropy over every position."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # (B*T, V) vs (B*T,)
