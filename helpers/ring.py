"""Ring all-reduce by hand with send/recv, and an alternate ring that forwards the original tensors (notebook 07).

Runbook (inside a worker started by helpers.launch.launch):

    sent = ring_all_reduce(t)               # in place: t becomes the sum over ranks; returns the bytes this rank sent
    sent = ring_all_reduce(t, group=dist.new_group([0, 1]))          # over a subgroup (called by its ranks only)
    sent = alternate_ring_all_reduce(t)     # the same sum, by passing every rank's original tensor around the ring
    ring_time(S, N, alpha, W), alternate_ring_time(S, N, alpha, W)      # alpha-beta model: S bytes, W bytes/s
    ring_bytes_sent(S, N), alternate_ring_bytes_sent(S, N)              # bytes each rank sends

Standard ring: cut the tensor into N chunks of ~S/N (the first numel % N chunks one element longer). Reduce-scatter,
N-1 steps: at step s rank r sends its partial sum of chunk (r-s) mod N to rank r+1 and adds the chunk (r-s-1) mod N
that arrives from rank r-1; after them rank r holds the finished sum of chunk (r+1) mod N. All-gather, N-1 more steps:
the finished chunks go once around the ring. Every step moves one chunk, so

    time  2 (N-1) (alpha + S / (N W))          bytes sent per rank  2 (N-1)/N S

Alternate ring: at step s rank r sends on, unchanged, the original tensor of rank (r-s) mod N (its own at step 0,
afterwards the one it received the step before). After N-1 steps every rank holds all N originals and adds them
itself, in rank order, so every rank gets the same bits (at the price of N·S bytes of buffer). Every step moves a
whole tensor, so

    time  (N-1) (alpha + S / W)                bytes sent per rank  (N-1) S

Half the latency terms, about N/2 times the bytes: it wins for small messages (alpha > S (N-2) / (N W),
`crossover_bytes`), and always at N = 2, where both move S bytes per rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def ring_time(S: float, N: int, alpha: float, W: float) -> float:
    """Modelled seconds of the standard ring all-reduce of S bytes on N ranks: 2 (N-1) (alpha + S / (N W))."""
    return 2 * (N - 1) * (alpha + S / (N * W))


def alternate_ring_time(S: float, N: int, alpha: float, W: float) -> float:
    """Modelled seconds of the alternate ring (original tensors forwarded): (N-1) (alpha + S / W)."""
    return (N - 1) * (alpha + S / W)


def ring_bytes_sent(S: float, N: int) -> float:
    """Bytes each rank sends in the standard ring (the mean over ranks when N does not divide S): 2 (N-1)/N S."""
    return 2 * (N - 1) / N * S


def alternate_ring_bytes_sent(S: float, N: int) -> float:
    """Bytes each rank sends in the alternate ring: (N-1) S."""
    return (N - 1) * S


def crossover_bytes(N: int, alpha: float, W: float) -> float:
    """Message size below which the alternate ring is the faster one: alpha N W / (N - 2) (always faster at N = 2)."""
    return float("inf") if N <= 2 else alpha * N * W / (N - 2)


def chunk_sizes(numel: int, world: int) -> list[int]:
    """Elements per ring chunk: numel // N each, the first numel % N chunks one more (zeros when numel < N)."""
    return [numel // world + (1 if i < numel % world else 0) for i in range(world)]


def _ring(group) -> tuple[int, int, int, int]:
    """(rank, world size, next rank, previous rank) in `group`; next and previous as global ranks, for send/recv."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    return rank, world, peer((rank + 1) % world), peer((rank - 1) % world)


def _exchange(send: torch.Tensor, recv: torch.Tensor, nxt: int, prev: int, group) -> None:
    """Send `send` to the next rank while receiving `recv` from the previous one; an empty chunk is skipped on both
    sides (sender and receiver agree on every chunk's size)."""
    ops = []
    if send.numel():
        ops.append(dist.P2POp(dist.isend, send, nxt, group))
    if recv.numel():
        ops.append(dist.P2POp(dist.irecv, recv, prev, group))
    for request in dist.batch_isend_irecv(ops) if ops else []:
        request.wait()


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """A 1-D view of `tensor`, or a contiguous copy (written back by the caller) when it has no such view."""
    return tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()


def ring_all_reduce(tensor: torch.Tensor, group=None) -> int:
    """Sum `tensor` over ranks in place: reduce-scatter, then all-gather, N-1 send/recv steps each.
    Returns the bytes this rank sent."""
    rank, world, nxt, prev = _ring(group)
    flat = _flat(tensor)  # (S,)
    sizes = chunk_sizes(flat.numel(), world)
    chunks = flat.split(sizes)  # N views, ~S/N each
    received = torch.empty(max(sizes), dtype=flat.dtype, device=flat.device)  # (ceil(S/N),)
    sent = 0
    for s in range(world - 1):  # reduce-scatter: partial sums travel, growing by one rank's share per step
        out, into = (rank - s) % world, (rank - s - 1) % world
        _exchange(chunks[out], received[: sizes[into]], nxt, prev, group)
        chunks[into].add_(received[: sizes[into]])
        sent += chunks[out].numel() * flat.element_size()
    for s in range(world - 1):  # all-gather: rank r starts with the finished chunk (r+1) mod N
        out, into = (rank + 1 - s) % world, (rank - s) % world
        _exchange(chunks[out], chunks[into], nxt, prev, group)
        sent += chunks[out].numel() * flat.element_size()
    if not tensor.is_contiguous():  # flat was a copy
        tensor.copy_(flat.view_as(tensor))
    return sent


def alternate_ring_all_reduce(tensor: torch.Tensor, group=None) -> int:
    """Sum `tensor` over ranks in place by forwarding every rank's original tensor around the ring (N-1 steps of S
    bytes), then adding the N originals locally in rank order. Returns bytes sent."""
    rank, world, nxt, prev = _ring(group)
    flat = _flat(tensor)  # (S,)
    originals = torch.empty((world, flat.numel()), dtype=flat.dtype, device=flat.device)  # (N, S)
    originals[rank] = flat
    sent = 0
    for s in range(world - 1):
        out, into = (rank - s) % world, (rank - s - 1) % world  # pass on what arrived last step; receive the next
        _exchange(originals[out], originals[into], nxt, prev, group)
        sent += originals[out].numel() * flat.element_size()
    flat.copy_(originals.sum(dim=0))  # (S,) the same additions in the same order on every rank
    if not tensor.is_contiguous():  # flat was a copy
        tensor.copy_(flat.view_as(tensor))
    return sent
