"""The course's test models and procedures, written here from the tests' description (each edition's tests/common.py,
test_ddp*.py, test_sharded_optimizer.py, test_fsdp.py): what `yours` checks a student's DDP, sharded optimizer and
FSDP on within the handout's contract (helpers.course.yours.distributed). Our own code, the same architectures.

    torch.manual_seed(rank); model = ToyModel()            # or ToyModelWithTiedWeights(); fsdp_model(layers)
    x, y = ddp_data()                                      # 20 rows: 10 per rank
    loss = reference_loss(net, ids, labels, torch.float16, shard_types)   # one process, FSDP's mixed precision
"""

from __future__ import annotations

import inspect

import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers.model import RMSNormTorch


class ToyModel(nn.Module):
    """(B, 10) -> (B, 5): fc1 (no bias), fc2 (its bias frozen), fc3 (no bias), ReLUs between, and a frozen parameter
    the forward never reads. The course's DDP and sharded-optimizer tests (2024-2026) train it."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 10, bias=False)
        self.fc2 = nn.Linear(10, 50)
        self.fc2.bias.requires_grad_(False)
        self.fc3 = nn.Linear(50, 5, bias=False)
        self.no_grad_fixed_param = nn.Parameter(torch.tensor([2.0, 2.0]), requires_grad=False)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))  # (B, 5)


class ToyModelWithTiedWeights(nn.Module):
    """(B, 10) -> (B, 5): five bias-free Linears 10-10-50-10-50-5 with ReLUs between; fc4's weight is fc2's (one
    Parameter used twice). The 2025/2026 DDP and sharded-optimizer tests train it beside ToyModel."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(10, 10, bias=False), nn.Linear(10, 50, bias=False)
        self.fc3, self.fc4 = nn.Linear(50, 10, bias=False), nn.Linear(10, 50, bias=False)
        self.fc5 = nn.Linear(50, 5, bias=False)
        self.fc4.weight = self.fc2.weight

    def forward(self, x):
        for fc in (self.fc1, self.fc2, self.fc3, self.fc4):
            x = torch.relu(fc(x))
        return self.fc5(x)  # (B, 5)


MODELS = {"ToyModel": ToyModel, "ToyModelWithTiedWeights": ToyModelWithTiedWeights}
DDP_STEPS, DDP_LR, DDP_ROWS = 5, 0.1, 20  # the DDP tests: 5 SGD steps, lr 0.1, 20 rows (10 per rank), MSE
SHARDING_STEPS, SHARDING_ROWS = 10, 32  # the sharded-optimizer test: 10 AdamW steps on 32 rows, the same on every rank
SHARDING_ADAMW = dict(lr=0.1, weight_decay=0.1, betas=(0.9, 0.999), eps=1e-8)
FSDP_STEPS, FSDP_LR, FSDP_ROWS, FSDP_SEQ, FSDP_VOCAB = 3, 0.01, 20, 8, 100  # the 2026 FSDP test


def ddp_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The DDP tests' pool of data: inputs (20, 10) and targets (20, 5), the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(DDP_ROWS, 10, generator=gen), torch.randn(DDP_ROWS, 5, generator=gen)


def shuffled(step: int, *tensors) -> tuple[torch.Tensor, ...]:
    """The tensors' rows permuted by a seed of the step, the same on every rank (the tests shuffle after each step)."""
    perm = torch.randperm(tensors[0].shape[0], generator=torch.Generator().manual_seed(42 + step))
    return tuple(t[perm] for t in tensors)


class FSDPToyModel(nn.Module):
    """ids (B, T) -> logits (B, T, vocab) from a cs336_basics-style `layers` module's Embedding, RMSNorm and Linear:
    embedding, norm, Linear d->d_ff, ReLU, norm, Linear d_ff->d, LM head. The 2026 FSDP test's model."""

    def __init__(self, layers, vocab: int = FSDP_VOCAB, d_model: int = 64, d_ff: int = 128):
        super().__init__()
        self.embedding = layers.Embedding(vocab, d_model)
        self.norm1 = layers.RMSNorm(d_model)
        self.linear1 = layers.Linear(d_model, d_ff)
        self.norm2 = layers.RMSNorm(d_ff)
        self.linear2 = layers.Linear(d_ff, d_model)
        self.lm_head = layers.Linear(d_model, vocab)

    def forward(self, ids):
        h = self.linear1(self.norm1(self.embedding(ids)))  # (B, T, d_ff)
        return self.lm_head(self.linear2(self.norm2(torch.relu(h))))  # (B, T, vocab)


def fsdp_data(seed: int = 123) -> tuple[torch.Tensor, torch.Tensor]:
    """The FSDP test's data: token ids (20, 8) and one label per row (its last position's target)."""
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, FSDP_VOCAB, (FSDP_ROWS, FSDP_SEQ), generator=gen),
        torch.randint(0, FSDP_VOCAB, (FSDP_ROWS,), generator=gen),
    )


def last_position_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the last position's logits (in fp32) against one label per row, as the FSDP test trains."""
    return F.cross_entropy(logits[:, -1, :].float(), labels)


def reference_loss(net: nn.Module, ids, labels, compute_dtype, shard_types) -> torch.Tensor:
    """One process's loss with FSDP's mixed precision: the weights of `shard_types` modules cast to compute_dtype for
    forward and backward (their gradients come back fp32 through the cast), the others and the master weights fp32."""
    if compute_dtype is None:
        return last_position_loss(net(ids), labels)
    owners = {
        f"{m_name}.{p_name}" if m_name else p_name: m
        for m_name, m in net.named_modules()
        for p_name, _ in m.named_parameters(recurse=False)
    }
    params = {n: p.to(compute_dtype) if isinstance(owners[n], shard_types) else p for n, p in net.named_parameters()}
    return last_position_loss(torch.func.functional_call(net, params, (ids,)), labels)


# ---- the course's own language model (cs336-basics' BasicsTransformerLM), on which the handouts run DDP ----

LM_CONFIG = dict(vocab_size=64, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=64, rope_theta=1e4)
#            a CPU-sized configuration: seconds for every flavour and bucket size, every step checked
LM_STEPS, LM_LR, LM_ROWS_PER_RANK = 3, 0.1, 2  # SGD steps, its lr, sequences of context_length tokens per rank


class CourseLMBlock(nn.Module):
    """A pre-norm block registered in the course's order: attention's q, k, v, output projections, the SwiGLU's w1,
    w2, w3, then ln1 and ln2 (2025's cs336-basics), so the gains' gradients are not ready in reverse registration
    order."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int):
        super().__init__()
        self.num_heads = num_heads
        self.attn = nn.ModuleDict({k: nn.Linear(d_model, d_model, bias=False) for k in ("q_proj", "k_proj", "v_proj")})
        self.attn["output_proj"] = nn.Linear(d_model, d_model, bias=False)
        self.ffn = nn.ModuleDict(
            {"w1": nn.Linear(d_model, d_ff, bias=False), "w2": nn.Linear(d_ff, d_model, bias=False)}
        )
        self.ffn["w3"] = nn.Linear(d_model, d_ff, bias=False)
        self.ln1, self.ln2 = RMSNormTorch(d_model), RMSNormTorch(d_model)

    def forward(self, x):  # (B, T, C)
        b, t, c = x.shape
        h = self.ln1(x)
        q, k, v = (
            self.attn[n](h).view(b, t, self.num_heads, -1).transpose(1, 2) for n in ("q_proj", "k_proj", "v_proj")
        )  # (B, heads, T, C / heads) each
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)  # (B, T, C)
        x = x + self.attn["output_proj"](a)
        h = self.ln2(x)
        return x + self.ffn["w2"](F.silu(self.ffn["w1"](h)) * self.ffn["w3"](h))  # (B, T, C)


class CourseLM(nn.Module):
    """The course's BasicsTransformerLM layout with torch layers (token embeddings, blocks, final norm, LM head; its
    constructor's arguments): `yours` runs a student's DDP on it where their cs336-basics has no BasicsTransformerLM."""

    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta=None):
        super().__init__()
        self.context_length = context_length
        self.token_embeddings = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(CourseLMBlock(d_model, num_heads, d_ff) for _ in range(num_layers))
        self.ln_final = RMSNormTorch(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, ids):  # (B, T) -> (B, T, vocab)
        x = self.token_embeddings(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


def course_lm_class() -> tuple[type, str]:
    """The student's cs336_basics.model.BasicsTransformerLM (the handouts' benchmarks build it) and where it came
    from; CourseLM, our copy of its layout, when it is not importable (a ModuleNotFoundError or a missing name)."""
    try:
        from cs336_basics.model import BasicsTransformerLM
    except ImportError:  # no cs336-basics, or another model there
        return CourseLM, "our copy of the course's layout (no cs336_basics.model.BasicsTransformerLM to import)"
    return BasicsTransformerLM, "BasicsTransformerLM from your cs336_basics.model"


def course_lm(cls: type, seed: int) -> nn.Module:
    """A small course LM (LM_CONFIG) built with torch seeded by `seed`; the 2024 constructor (no rope_theta, dropout
    off by default) and the 2025/2026 one both accepted."""
    accepted = inspect.signature(cls).parameters
    torch.manual_seed(seed)
    return cls(**{k: v for k, v in LM_CONFIG.items() if k in accepted})


def lm_batches(world: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """LM_STEPS global batches of token ids (world * LM_ROWS_PER_RANK, context_length) and their next tokens, the same
    on every rank."""
    gen = torch.Generator().manual_seed(seed)
    rows, t, vocab = world * LM_ROWS_PER_RANK, LM_CONFIG["context_length"], LM_CONFIG["vocab_size"]
    out = []
    for _ in range(LM_STEPS):
        tokens = torch.randint(vocab, (rows, t + 1), generator=gen)  # (B, T+1)
        out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))  # (B, T), (B, T)
    return out


class StaffLayers:
    """Our copy of the staff cs336_basics layers the 2026 FSDP test builds its model from (weights stored (out, in)
    and (vocab, d), truncated-normal init, RMSNorm in fp32 with eps 1e-5): the course's model when the student's
    tree has no cs336_basics.model (FSDP is judged on the course's model whatever the student's package holds)."""

    class Linear(nn.Module):
        def __init__(self, in_features, out_features, device=None, dtype=None):
            super().__init__()
            std = (2.0 / (in_features + out_features)) ** 0.5
            w = torch.empty(out_features, in_features, device=device, dtype=dtype)
            self.weight = nn.Parameter(nn.init.trunc_normal_(w, 0.0, std, -3 * std, 3 * std))

        def forward(self, x):
            return x @ self.weight.T  # (..., out)

    class Embedding(nn.Module):
        def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
            super().__init__()
            w = torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype)
            self.weight = nn.Parameter(nn.init.trunc_normal_(w, 0.0, 1.0, -3.0, 3.0))

        def forward(self, ids):
            return self.weight[ids]  # (..., d)

    class RMSNorm(nn.Module):
        def __init__(self, d_model, eps=1e-5, device=None, dtype=None):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

        def forward(self, x):
            dtype, x = x.dtype, x.to(torch.float32)
            rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return (x / rms * self.weight).to(dtype)


STAFF_SOURCE = "our copy of the staff cs336_basics layers: your tree has no importable cs336_basics.model"


def course_layers_source() -> str:
    """Whose layers the 2026 FSDP test's model is built from here (one line for the report)."""
    layers, _ = course_layers()
    return STAFF_SOURCE if layers is StaffLayers else "your cs336_basics.model's Linear, Embedding and RMSNorm"


def course_layers():
    """The student's cs336_basics.model (the 2026 FSDP test builds its model from it) and its sharded layer types;
    our copy of the staff layers (StaffLayers) when it does not import or lacks a layer."""
    import importlib

    try:
        layers = importlib.import_module("cs336_basics.model")
        layers.Linear, layers.Embedding, layers.RMSNorm  # noqa: B018 - the three the test's model is built from
    except (ImportError, AttributeError):
        layers = StaffLayers
    return layers, (layers.Linear, layers.Embedding)
