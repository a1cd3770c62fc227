"""What helpers.fsdp.FSDP moved and held, for notebook 07's tables: the bytes of each collective, the gathered bytes
alive and their peak, the prefetches, and the seconds spent waiting for collectives."""

from __future__ import annotations

import torch

from helpers.timing import WaitClock


class Accounting:
    """One FSDP's counters. `comm_log` holds (op, bytes) per collective of the training steps (all-gather: its output,
    reduce-scatter: its input, all-reduce: its buffer, as helpers.comm counts them)."""

    def __init__(self):
        self.comm_log: list[tuple[str, int]] = []  # (op, bytes) per collective of the training steps
        self.clock = WaitClock()  # waits for collectives (CUDA events on a GPU: NCCL's wait() only orders streams)
        self.gathered_bytes = self.peak_gathered_bytes = 0  # bytes of gathered weights alive now, and the most so far
        self.prefetched = 0  # gathers started ahead of their module (overlapping the one before it)

    def collective(self, op: str, tensor: torch.Tensor) -> None:
        """Log one collective moving `tensor` (the tensor helpers.comm counts for `op`)."""
        self.comm_log.append((op, tensor.numel() * tensor.element_size()))

    def allocated(self, flat: torch.Tensor) -> None:
        """A gathered buffer got its bytes back."""
        self.gathered_bytes += flat.numel() * flat.element_size()
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)

    def released(self, flat: torch.Tensor) -> None:
        """A gathered buffer gave its bytes up."""
        self.gathered_bytes -= flat.numel() * flat.element_size()
