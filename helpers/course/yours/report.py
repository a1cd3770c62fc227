"""What a topic's checks found and what it measured: Check rows (pass/fail with what differed) and side-by-side rows
(yours, ours, PyTorch's), the terminal tables and the saved results."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

PASS, FAIL, ERROR, NOT_IMPLEMENTED, SKIPPED = "pass", "fail", "error", "not implemented", "skipped"


@dataclass
class Check:
    """One property of one implementation. `detail` says what differed: where (parameter, index, step), by how much,
    against which bound, and the likely mistake when the signature is recognisable."""
    topic: str
    impl: str  # which of the file's implementations ("triton", "bucketed", ...)
    prop: str  # the property checked, named so a failure reads on its own ("forward vs float64, bf16, H=1000")
    status: str  # PASS | FAIL | ERROR | NOT_IMPLEMENTED | SKIPPED
    detail: str = ""


@dataclass
class TopicResult:
    """A topic's checks, and its side-by-side rows: dicts with at least topic, measure, who ('yours' | 'ours' |
    'pytorch' | 'formula'), value, unit; timing rows also the paired-ratio columns (timing.ratio_columns)."""
    topic: str
    checks: list[Check] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(c.status in (FAIL, ERROR) for c in self.checks)

    def as_rows(self) -> list[dict]:
        return [asdict(c) for c in self.checks]
