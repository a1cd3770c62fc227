"""Mutant: the file fails to import (a student's typo in an import)."""
from cs336_systems import FlashAttentionPyTorchh  # noqa: F401
