"""Context parallelism: ring attention over the sequence, built on notebook 06's online softmax, forward and backward.

Runbook (inside a worker started by helpers.launch.launch):

    order = chunk_order(world, causal=True)           # [[0, 7], [1, 6], [2, 5], [3, 4]] for 4 ranks: balanced
    q_r, k_r, v_r = (local_chunks(t, rank, world, causal=True) for t in (q, k, v))   # (BH, T/N, d) each
    o_r, lse_r, stats = ring_attention(q_r, k_r, v_r, causal=True)     # this rank's rows of softmax(qk^T/√d) v
    o = from_local_chunks([o_0, o_1, ...], world, causal=True)         # back in sequence order
    dq_r, dk_r, dv_r, stats = ring_attention_backward(q_r, k_r, v_r, o_r, lse_r, do_r, causal=True)
    o_r = RingAttention.apply(q_r, k_r, v_r, True)                     # the two as one autograd Function

Each rank keeps the queries of its chunks and starts with its own keys and values; at each of N − 1 steps it passes
the K, V block it holds to the next rank and receives the previous rank's (Liu et al., 2023, "Ring Attention with
Blockwise Transformers"). Each (query chunk, key chunk) pair is notebook 06's FlashAttention-2 forward in PyTorch
tiles (`flash_forward_torch`), which returns the block's output O and its rows' logsumexp L; two blocks over
disjoint keys merge exactly through their logsumexps:

    L = log(e^L1 + e^L2),    O = e^(L1 − L) O1 + e^(L2 − L) O2

Causal: a key chunk after the query chunk is skipped, the same chunk is causal within, an earlier one is whole. With
N contiguous chunks, rank r computes r + 1/2 chunk pairs: the last rank does 2N − 1 times the first's work. Cut
the sequence into 2N chunks and give rank r chunks r and 2N − 1 − r (the "zigzag" order of Brandon et al., 2023,
"Striped Attention", and Llama 3's context parallelism): every rank computes the same N/2 pairs (in (T/N)² units).

Backward: with the final output O and logsumexp L of its rows, each (query chunk, key chunk) pair's share of the
gradients is notebook 06's FlashAttention-2 backward on that pair alone (`flash_backward_torch`: P = exp(S − L) is
the pair's block of the whole softmax, D = rowsum(dO ∘ O) the whole row's). dQ stays on its rank; dK and dV travel
around the ring with their K and V, gathering every rank's share, and one more step brings them home: K and V go
N − 1 steps, dK and dV N.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from helpers.attention import _launch_config, flash_backward_torch, flash_forward_torch
from helpers.comm import InFlight, wait_all
from helpers.pipeline import staged


def chunk_order(world: int, causal: bool, balanced: bool = True) -> list[list[int]]:
    """The sequence chunks each rank holds: causal and balanced, 2N chunks, rank r holding r and 2N − 1 − r;
    otherwise N contiguous chunks, rank r holding chunk r."""
    if causal and balanced:
        return [[r, 2 * world - 1 - r] for r in range(world)]
    return [[r] for r in range(world)]


def check_sequence(length: int, world: int, causal: bool, balanced: bool = True) -> None:
    """Raise a ValueError naming the constraint when the sequence does not cut into the chunks."""
    chunks = 2 * world if causal and balanced else world
    if length % chunks:
        raise ValueError(
            f"context parallelism over {world} ranks cuts the sequence into {chunks} chunks: its length "
            f"({length}) must be divisible by {chunks}"
        )


def local_chunks(x: Tensor, rank: int, world: int, causal: bool, balanced: bool = True) -> Tensor:
    """This rank's positions of a (..., T, d) tensor, its chunks concatenated in order: (..., T/N, d)."""
    order = chunk_order(world, causal, balanced)
    pieces = x.chunk(sum(len(c) for c in order), dim=-2)
    return torch.cat([pieces[c] for c in order[rank]], dim=-2)


def from_local_chunks(parts: list[Tensor], world: int, causal: bool, balanced: bool = True) -> Tensor:
    """The inverse of local_chunks: every rank's (..., T/N, ...) rows back in sequence order along dim -2 (for
    (..., T) tensors such as the logsumexp, pass x.unsqueeze(-1))."""
    order = chunk_order(world, causal, balanced)
    by_chunk = {}
    for rank, part in enumerate(parts):
        for c, piece in zip(order[rank], part.chunk(len(order[rank]), dim=-2), strict=True):
            by_chunk[c] = piece
    return torch.cat([by_chunk[c] for c in sorted(by_chunk)], dim=-2)


def merge(o1: Tensor | None, lse1: Tensor | None, o2: Tensor, lse2: Tensor) -> tuple[Tensor, Tensor]:
    """Attention over the union of two disjoint key sets from each one's output (..., Tq, d) and logsumexp (..., Tq)."""
    if o1 is None:
        return o2, lse2
    lse = torch.logaddexp(lse1, lse2)  # (..., Tq)
    return torch.exp(lse1 - lse)[..., None] * o1 + torch.exp(lse2 - lse)[..., None] * o2, lse


def _pass_on(blocks: list[Tensor], group) -> list[Tensor]:
    """Send `blocks` to the next rank of the ring, return the previous rank's (isend/irecv, then wait on both)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    if group is not None:
        nxt, prev = dist.get_global_rank(group, nxt), dist.get_global_rank(group, prev)
    out = [staged(b.contiguous()) for b in blocks]  # CPU copies where gloo runs on a GPU
    received = [torch.empty_like(b) for b in out]
    ops = [dist.P2POp(dist.isend, b, nxt, group) for b in out] + [
        dist.P2POp(dist.irecv, r, prev, group) for r in received
    ]
    flight = InFlight()
    flight.launching(*out, *received)
    wait_all(dist.batch_isend_irecv(ops))
    del ops
    flight.settle()  # gloo's threads have let go of the buffers (helpers.comm.InFlight)
    return [r.to(b.device) for r, b in zip(received, blocks, strict=True)]


def ring_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, balanced: bool = True, group=None):
    """This rank's rows of attention over the whole sequence: (o (BH, T/N, d), lse (BH, T/N), stats). q, k, v are
    this rank's chunks (local_chunks). stats: bytes this rank sent, and the chunk pairs it computed (a causal
    diagonal pair counts 1/2), in (T/N)² units."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    order = chunk_order(world, causal, balanced)
    cfg = _launch_config(q.shape[-1], q.dtype, q.device)
    qs = q.chunk(len(order[rank]), dim=-2)
    acc = [(None, None)] * len(qs)
    sent, work, unit = 0, 0.0, (q.shape[-2] / len(qs)) ** 2 / q.shape[-2] ** 2
    for step in range(world):
        src = (rank - step) % world  # whose K, V this rank holds now
        ks, vs = k.chunk(len(order[src]), dim=-2), v.chunk(len(order[src]), dim=-2)
        for a, (qa, ca) in enumerate(zip(qs, order[rank], strict=True)):
            for kb, vb, cb in zip(ks, vs, order[src], strict=True):
                if causal and cb > ca:
                    continue  # keys after every query of this chunk
                o_part, lse_part = flash_forward_torch(qa, kb, vb, causal and cb == ca, cfg)
                acc[a] = merge(*acc[a], o_part, lse_part)
                work += unit * (0.5 if causal and cb == ca else 1.0)
        if step < world - 1:
            k, v = _pass_on([k, v], group)
            sent += k.nbytes + v.nbytes
    o = torch.cat([o for o, _ in acc], dim=-2)  # (BH, T/N, d)
    lse = torch.cat([lse for _, lse in acc], dim=-1)  # (BH, T/N)
    return o, lse, {"bytes_sent": sent, "work": work}


def ring_attention_backward(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, causal: bool, balanced: bool = True, group=None
):
    """The gradients of this rank's chunks, (dq, dk, dv) each (BH, T/N, d), and stats (bytes sent, chunk pairs
    computed), from its q, k, v, its rows' final o and lse (ring_attention's) and their gradient do."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    order = chunk_order(world, causal, balanced)
    cfg = _launch_config(q.shape[-1], q.dtype, q.device)
    n = len(order[rank])
    qs, os, dos, lses = q.chunk(n, dim=-2), o.chunk(n, dim=-2), do.chunk(n, dim=-2), lse.chunk(n, dim=-1)
    dq = torch.zeros_like(q)  # (BH, T/N, d): stays here
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)  # the held K, V blocks' gradients: they travel with them
    sent, work, unit = 0, 0.0, (q.shape[-2] / n) ** 2 / q.shape[-2] ** 2
    for step in range(world):
        src = (rank - step) % world  # whose K, V (and dK, dV so far) this rank holds now
        parts = [t.chunk(len(order[src]), dim=-2) for t in (k, v, dk, dv)]  # dk, dv chunks: views, summed in place
        for a, ca in enumerate(order[rank]):
            for kb, vb, dkb, dvb, cb in zip(*parts, order[src], strict=True):
                if causal and cb > ca:
                    continue
                dq_p, dk_p, dv_p = flash_backward_torch(qs[a], kb, vb, os[a], lses[a], dos[a], causal and cb == ca, cfg)
                dq.chunk(n, dim=-2)[a].add_(dq_p)
                dkb.add_(dk_p)
                dvb.add_(dv_p)
                work += unit * (0.5 if causal and cb == ca else 1.0)
        if step < world - 1:
            k, v, dk, dv = _pass_on([k, v, dk, dv], group)
            sent += k.nbytes + v.nbytes + dk.nbytes + dv.nbytes
    dk, dv = send_home(dk, dv, group)
    return dq, dk, dv, {"bytes_sent": sent + dk.nbytes + dv.nbytes, "work": work}


def send_home(dk: Tensor, dv: Tensor, group=None) -> tuple[Tensor, Tensor]:
    """After the last step a rank holds the next rank's dK, dV: one more step of the ring brings each home."""
    return tuple(_pass_on([dk, dv], group))


class RingAttention(torch.autograd.Function):
    """Ring attention as an autograd Function: o = RingAttention.apply(q, k, v, causal, balanced, group) on this
    rank's chunks (local_chunks); backward returns this rank's chunks' dq, dk, dv."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, balanced: bool = True, group=None):
        o, lse, _ = ring_attention(q, k, v, causal, balanced, group)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.balanced, ctx.group = causal, balanced, group
        return o

    @staticmethod
    def backward(ctx, do):
        dq, dk, dv, _ = ring_attention_backward(*ctx.saved_tensors, do, ctx.causal, ctx.balanced, ctx.group)
        return dq, dk, dv, None, None, None
