"""Tensor parallelism (Megatron-LM) and sequence parallelism by hand, for notebook 08.

Runbook (inside a worker started by helpers.launch.launch, every rank with the same full model):

    tp = TensorParallelLM(full_model)                       # this rank's shard of every block; the rest replicated
    sp = TensorParallelLM(full_model, sequence_parallel=True)   # norms and residuals on T/N positions
    loss = lm_loss(tp(x), y); loss.backward()               # x, y: the whole batch, the same on every rank
    sync_sequence_parallel_grads(sp)                        # SP only: the norm gains saw T/N positions each
    shard_parameter("blocks.0.ffn.w1.weight", full, rank, world)   # this rank's piece of a full tensor

Megatron's block (Shoeybi et al., 2019, "Megatron-LM", Fig. 3): the feed-forward's first matrix is split by its
output columns (column-parallel: each rank computes d_ff/N of the hidden units), the second by its input rows
(row-parallel: each rank computes a partial sum of the output); attention splits its heads the same way (q, k, v
column-parallel by heads, the output projection row-parallel). Two conjugate operators move the data:

    f = CopyToTensorParallel      forward: identity           backward: all-reduce the gradient
    g = ReduceFromTensorParallel  forward: all-reduce         backward: identity

so a block costs two all-reduces of the (B, T, C) activations in forward and two in backward.

Sequence parallelism (Korthikanti et al., 2022, "Reducing Activation Recomputation in Large Transformer Models",
§4.2.2) keeps the norms and residual stream split along the sequence: g becomes a reduce-scatter along T and f an
all-gather along T (the conjugates of each other), the same bytes on the wire as the all-reduce they replace. The
column-parallel layer saves only this rank's T/N positions and gathers them again for its weight gradient, so every
activation of the block is divided by N.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from helpers.comm import InFlight

SEQ = 1  # activations are (B, T, C): the sequence dimension


def _world(group) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def settled(collective, *tensors: Tensor, **kwargs) -> None:
    """Run a blocking `collective(*tensors, **kwargs)` and return once the backend's threads have let go of the
    tensors (helpers.comm.InFlight): gloo releases a finished work a moment later, and until then its buffers stay
    alive (a memory measurement would count them) and can abort the interpreter at exit (issue 43)."""
    flight = InFlight()
    flight.launching(*tensors)
    collective(*tensors, **kwargs)
    flight.settle()


def all_reduce_sum(x: Tensor, group=None) -> Tensor:
    """The sum of `x` over the group's ranks, in a new tensor."""
    out = x.contiguous().clone()
    settled(dist.all_reduce, out, group=group)
    return out


def gather_sequence(x: Tensor, group=None) -> Tensor:
    """(B, T/N, C) on each rank -> (B, T, C), the ranks' pieces in rank order along T."""
    _, n = _world(group)
    xt = x.transpose(0, SEQ).contiguous()  # (T/N, B, C): all_gather concatenates along dim 0
    out = xt.new_empty((n * xt.shape[0], *xt.shape[1:]))  # (T, B, C)
    settled(getattr(dist, "all_gather_single", dist.all_gather_into_tensor), out, xt, group=group)  # looked up now
    return out.transpose(0, SEQ).contiguous()  # (B, T, C)


def reduce_scatter_sequence(x: Tensor, group=None) -> Tensor:
    """(B, T, C) partial sums on each rank -> (B, T/N, C): this rank's positions of the sum over ranks."""
    _, n = _world(group)
    xt = x.transpose(0, SEQ).contiguous()  # (T, B, C)
    out = xt.new_empty((xt.shape[0] // n, *xt.shape[1:]))  # (T/N, B, C)
    settled(getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor), out, xt, group=group)
    return out.transpose(0, SEQ).contiguous()  # (B, T/N, C)


def split_sequence(x: Tensor, group=None) -> Tensor:
    """This rank's T/N positions of a (B, T, C) tensor."""
    rank, n = _world(group)
    return x.chunk(n, dim=SEQ)[rank].contiguous()  # (B, T/N, C)


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f, before a column-parallel layer: identity forward; backward all-reduces the gradient, since every
    rank's shard of the layer contributed a part of the input's gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce_sum(grad, ctx.group), None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g, after a row-parallel layer: all-reduce of the ranks' partial sums forward; identity backward,
    since every rank needs the whole output's gradient."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce_sum(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """g under sequence parallelism: reduce-scatter along T forward, all-gather of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return gather_sequence(grad, ctx.group), None


class GatherFromSequenceParallel(torch.autograd.Function):
    """The model's exit from the sequence-parallel region: all-gather along T forward, this rank's slice backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return gather_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return split_sequence(grad, ctx.group), None


class ScatterToSequenceParallel(torch.autograd.Function):
    """The model's entry to the sequence-parallel region: this rank's slice forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return split_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return gather_sequence(grad, ctx.group), None


class SequenceParallelColumnLinear(torch.autograd.Function):
    """f and a column-parallel matmul fused under sequence parallelism: all-gather the (B, T/N, C) input along T,
    multiply; save only this rank's T/N positions and gather them again in backward (Korthikanti et al. §4.2.2);
    the input's gradient leaves as a reduce-scatter along T."""

    @staticmethod
    def forward(ctx, x_local, weight, group):
        ctx.group = group
        ctx.save_for_backward(x_local, weight)
        return F.linear(gather_sequence(x_local, group), weight)  # (B, T, out/N)

    @staticmethod
    def backward(ctx, grad):  # grad (B, T, out/N)
        x_local, weight = ctx.saved_tensors
        x_full = gather_sequence(x_local, ctx.group)  # (B, T, C), again
        grad_w = grad.flatten(0, 1).t() @ x_full.flatten(0, 1)  # (out/N, C)
        grad_x = reduce_scatter_sequence(grad @ weight, ctx.group)  # (B, T/N, C)
        return grad_x, grad_w, None


class ColumnParallelLinear(nn.Module):
    """Y_r = X A_r^T: this rank's rows of the weight (output features), the input whole on every rank (f before
    it) or, under sequence parallelism, gathered along T."""

    def __init__(self, weight: Tensor, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())  # (out/N, in)
        self.group, self.sequence_parallel = group, sequence_parallel

    def forward(self, x: Tensor) -> Tensor:
        if self.sequence_parallel:
            return SequenceParallelColumnLinear.apply(x, self.weight, self.group)  # (B, T, out/N)
        return F.linear(CopyToTensorParallel.apply(x, self.group), self.weight)  # (B, T, out/N)


class RowParallelLinear(nn.Module):
    """Y = sum_r X_r B_r^T: this rank's columns of the weight (input features) give a partial sum, completed by g
    (all-reduce) or, under sequence parallelism, by a reduce-scatter along T."""

    def __init__(self, weight: Tensor, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())  # (out, in/N)
        self.group, self.sequence_parallel = group, sequence_parallel

    def forward(self, x: Tensor) -> Tensor:
        partial = F.linear(x, self.weight)  # (B, T, out): this rank's share of the sum
        if self.sequence_parallel:
            return ReduceScatterToSequenceParallel.apply(partial, self.group)  # (B, T/N, out)
        return ReduceFromTensorParallel.apply(partial, self.group)  # (B, T, out)


def shard_parameter(name: str, full: Tensor, rank: int, world: int) -> Tensor:
    """This rank's piece of the full model's tensor `name` (a parameter or its gradient): q, k, v by heads, the
    output projection and w2 by input columns, w1 by output rows; everything else whole."""
    if name.endswith("attn.qkv.weight"):
        three_c, c = full.shape
        return full.view(3, world, three_c // (3 * world), c)[:, rank].reshape(-1, c)  # (3C/N, C)
    if name.endswith(("attn.proj.weight", "ffn.w2.weight")):
        return full.chunk(world, dim=1)[rank]  # (C, in/N)
    if name.endswith("ffn.w1.weight"):
        return full.chunk(world, dim=0)[rank]  # (d_ff/N, C)
    return full


def check_divisible(cfg, world: int, context_length: int | None = None, sequence_parallel: bool = False) -> None:
    """Raise a ValueError naming the constraint when `world` ranks cannot split the model (before any rank starts)."""
    for what, size in [("n_heads", cfg.n_heads), ("d_ff", cfg.d_ff)]:
        if size % world:
            raise ValueError(f"tensor parallelism over {world} ranks needs {what} ({size}) divisible by {world}")
    if sequence_parallel and context_length is not None and context_length % world:
        raise ValueError(
            f"sequence parallelism over {world} ranks needs the sequence length ({context_length}) divisible by {world}"
        )


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(D), causal) v, op by op as helpers.model's naive attention: (B, H, T, D) each."""
    T = q.shape[-2]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # (T, T)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v  # (B, H, T, D)


class TensorParallelAttention(nn.Module):
    """helpers.model.CausalSelfAttention with its heads split over the ranks: H/N heads each."""

    def __init__(self, attn: nn.Module, group=None, sequence_parallel: bool = False):
        super().__init__()
        rank, world = _world(group)
        self.n_heads, self.head_dim = attn.n_heads // world, attn.head_dim
        w = attn.qkv.weight
        self.qkv = ColumnParallelLinear(shard_parameter("attn.qkv.weight", w, rank, world), group, sequence_parallel)
        w = attn.proj.weight
        self.proj = RowParallelLinear(shard_parameter("attn.proj.weight", w, rank, world), group, sequence_parallel)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (B, T, C/N), whole T even under SP
        B, T, _ = q.shape
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, H/N, T, D)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, -1)  # (B, T, C/N)
        return self.proj(y)  # (B, T, C), or (B, T/N, C) under SP


class TensorParallelFeedForward(nn.Module):
    """helpers.model.FeedForward split Megatron's way: w1 column-parallel, gelu on d_ff/N units, w2 row-parallel."""

    def __init__(self, ffn: nn.Module, group=None, sequence_parallel: bool = False):
        super().__init__()
        rank, world = _world(group)
        self.w1 = ColumnParallelLinear(
            shard_parameter("ffn.w1.weight", ffn.w1.weight, rank, world), group, sequence_parallel
        )
        self.w2 = RowParallelLinear(
            shard_parameter("ffn.w2.weight", ffn.w2.weight, rank, world), group, sequence_parallel
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.gelu(self.w1(x)))  # (B, T, d_ff/N) -> (B, T, C) or (B, T/N, C)


class TensorParallelBlock(nn.Module):
    """One pre-norm block: norms replicated (on T/N positions under SP), attention and feed-forward split."""

    def __init__(self, block: nn.Module, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.norm1, self.norm2 = copy.deepcopy(block.norm1), copy.deepcopy(block.norm2)
        self.attn = TensorParallelAttention(block.attn, group, sequence_parallel)
        self.ffn = TensorParallelFeedForward(block.ffn, group, sequence_parallel)
        if sequence_parallel:  # each rank's gain sees T/N positions: its gradient is a partial sum
            for p in (*self.norm1.parameters(), *self.norm2.parameters()):
                p.sequence_parallel_partial = True

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))  # (B, T, C), or (B, T/N, C) under SP
        return x + self.ffn(self.norm2(x))


class TensorParallelLM(nn.Module):
    """helpers.model.TransformerLM with every block tensor-parallel (optionally sequence-parallel); embeddings,
    final norm and LM head replicated. Parameter names are the full model's, so shard_parameter maps between them."""

    def __init__(self, model: nn.Module, group=None, sequence_parallel: bool = False):
        super().__init__()
        check_divisible(model.cfg, dist.get_world_size(group))
        self.cfg, self.group, self.sequence_parallel = model.cfg, group, sequence_parallel
        self.tok_emb, self.pos_emb = copy.deepcopy(model.tok_emb), copy.deepcopy(model.pos_emb)
        self.blocks = nn.ModuleList(TensorParallelBlock(b, group, sequence_parallel) for b in model.blocks)
        self.norm_f, self.lm_head = copy.deepcopy(model.norm_f), copy.deepcopy(model.lm_head)

    def forward(self, idx: Tensor) -> Tensor:
        B, T = idx.shape
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T, device=idx.device))  # (B, T, C)
        if self.sequence_parallel:
            check_divisible(self.cfg, dist.get_world_size(self.group), T, sequence_parallel=True)
            x = ScatterToSequenceParallel.apply(x, self.group)  # (B, T/N, C)
        for block in self.blocks:
            x = block(x)
        if self.sequence_parallel:
            x = GatherFromSequenceParallel.apply(x, self.group)  # (B, T, C)
        return self.lm_head(self.norm_f(x))  # (B, T, V)


def sync_sequence_parallel_grads(model: nn.Module, group=None) -> None:
    """All-reduce the gradients of the gains that saw T/N positions each (after backward, SP only)."""
    for p in model.parameters():
        if getattr(p, "sequence_parallel_partial", False) and p.grad is not None:
            settled(dist.all_reduce, p.grad, group=group)
