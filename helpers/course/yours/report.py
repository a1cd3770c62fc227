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


def failure_summary(exc: BaseException) -> str:
    """One paragraph from a launch failure: the rank and what happened (signal, timeout, the exception's last line)."""
    text = str(exc).strip()
    head = text.split("\n\n--- traceback", 1)[0].replace("\n", " ")
    tb = getattr(exc, "remote_traceback", None)
    if tb:
        frames = [line.strip() for line in tb.splitlines() if line.strip().startswith("File ")]
        if frames:
            head += f" (last frame: {frames[-1]})"
    return head


def checks_table(results: list[TopicResult]):
    """One row per check: topic, implementation, property, status, what differed."""
    import pandas as pd

    return pd.DataFrame([r for res in results for r in res.as_rows()],
                        columns=["topic", "impl", "prop", "status", "detail"])


def side_by_side(results: list[TopicResult]):
    """The timing/memory/bytes rows of every topic: yours, ours, PyTorch's and the formula, ratios to ours."""
    import pandas as pd

    return pd.DataFrame([row for res in results for row in res.rows])
