"""What a topic's checks found and what it measured: Check rows (pass/fail with what differed) and side-by-side rows
(yours, ours, PyTorch's), the terminal tables and the saved results."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

PASS, FAIL, ERROR, NOT_IMPLEMENTED, SKIPPED = "pass", "fail", "error", "not implemented", "skipped"
NEEDS_GPU, NEEDS_TRITON = (
    "needs a GPU",
    "needs another Triton",
)  # the check cannot run in this environment: not a failure
FAILED = (FAIL, ERROR)
CANNOT_RUN = (NEEDS_GPU, NEEDS_TRITON)


@dataclass
class Check:
    """One property of one implementation. `detail` says what differed: where (parameter, index, step), by how much,
    against which bound, and the likely mistake when the signature is recognisable."""

    topic: str
    impl: str  # which of the file's implementations ("triton", "bucketed", ...)
    prop: str  # the property checked, named so a failure reads on its own ("forward vs float64, bf16, H=1000")
    status: str  # PASS | FAIL | ERROR | NOT_IMPLEMENTED | SKIPPED | NEEDS_GPU | NEEDS_TRITON
    detail: str = ""
    beyond: bool = False  # a probe beyond the handout's promises (other shapes, dtypes, models): reported, never
    #                       part of the exit status


@dataclass
class TopicResult:
    """A topic's checks, and its side-by-side rows: dicts with at least topic, measure, who ('yours' | 'ours' |
    'pytorch' | 'formula'), value, unit; timing rows also the paired-ratio columns (timing.ratio_columns)."""

    topic: str
    checks: list[Check] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    poisoned: bool = False  # a CUDA error stopped the checks: what is left must run in a fresh process

    @property
    def failed(self) -> bool:
        """A check within the handout's contract failed (the probes beyond it never count)."""
        return any(c.status in FAILED and not c.beyond for c in self.checks)

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


def passed(checks: list[Check], impl: str) -> bool:
    """Every check of `impl` within the handout passed (then it is timed)."""
    mine = [c for c in checks if c.impl == impl and not c.beyond]
    return bool(mine) and all(c.status == PASS for c in mine)


CHECK_COLUMNS = ["topic", "impl", "prop", "status", "detail", "beyond"]


def checks_table(results: list[TopicResult]):
    """One row per check: topic, implementation, property, status, what differed, beyond the handout or not."""
    import pandas as pd

    return pd.DataFrame([r for res in results for r in res.as_rows()], columns=CHECK_COLUMNS)


def summary(checks: list[dict]) -> tuple[str, bool]:
    """("N implemented: P pass, F fail, G need a GPU or another Triton; M not implemented", ok) over the checks within
    the handout's contract (rows of checks_table); ok only when something was checked and nothing failed."""
    within = [c for c in checks if not c.get("beyond")]
    count = {
        s: sum(c["status"] == s for c in within) for s in (PASS, FAIL, ERROR, NEEDS_GPU, NEEDS_TRITON, NOT_IMPLEMENTED)
    }
    failed, cannot = count[FAIL] + count[ERROR], count[NEEDS_GPU] + count[NEEDS_TRITON]
    implemented = count[PASS] + failed + cannot
    if not implemented:
        return (
            f"nothing implemented yet: {count[NOT_IMPLEMENTED]} adapters raise NotImplementedError and the "
            "others are absent, so there was nothing to check",
            False,
        )
    text = (
        f"{implemented} checks of what you implemented: {count[PASS]} pass, {failed} fail, {cannot} need a GPU "
        f"or another Triton; {count[NOT_IMPLEMENTED]} not implemented"
    )
    return text, failed == 0


def side_by_side(results: list[TopicResult]):
    """The timing/memory/bytes rows of every topic: yours, ours, PyTorch's and the formula, ratios to ours."""
    import pandas as pd

    return pd.DataFrame([row for res in results for row in res.rows])


def _present(v) -> bool:
    return v is not None and v == v  # not None, not NaN


def format_value(value, unit: str) -> str:
    """A side-by-side value for reading: seconds as ms, bytes as MiB, n/a for a value that could not be measured."""
    if not _present(value):
        return "n/a"
    if unit == "s":
        return f"{value * 1e3:.3f} ms"
    if unit == "B":
        return f"{value / 2**20:.3f} MiB"
    return f"{value:.4g} {unit}".strip()


def format_ratio(row: dict) -> str:
    """'1.16x [1.14, 1.24]' for a row with a paired ratio, else ''."""
    if not _present(row.get("ratio")):
        return ""
    return f"{row['ratio']:.2f}x [{row['ratio_low']:.2f}, {row['ratio_high']:.2f}]"


def readable_rows(rows: list[dict]):
    """The side-by-side rows as a table to read: who, implementation, measure, value, ratio, and a note (the
    shape, why a value is missing, the verdict)."""
    import pandas as pd

    out = []
    for r in rows:
        note = "; ".join(str(r[k]) for k in ("shape", "note", "verdict") if _present(r.get(k)) and r.get(k))
        out.append(
            {
                "who": r.get("who", ""),
                "impl": r.get("impl", ""),
                "measure": r.get("measure", ""),
                "value": format_value(r.get("value"), r.get("unit", "")),
                "ratio [95% interval]": format_ratio(r),
                "note": note,
            }
        )
    return pd.DataFrame(out)
