"""Units: binary byte multiples and the bytes per element of a dtype (used by every family of closed forms)."""

from __future__ import annotations

import torch

KiB, MiB, GiB = 2**10, 2**20, 2**30  # binary units: torch's bucket_cap_mb, nccl-tests' sizes, memory tables


def dtype_bytes(dtype: torch.dtype) -> int:
    """Bytes per element of `dtype`."""
    return torch.empty((), dtype=dtype).element_size()
