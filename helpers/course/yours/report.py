"""What a topic's checks found and what it measured: Check rows (pass/fail with what differed) and side-by-side rows
(yours, ours, PyTorch's), the terminal tables and the saved results."""

from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass, field

PASS, FAIL, ERROR, NOT_IMPLEMENTED, SKIPPED = "pass", "fail", "error", "not implemented", "skipped"
NEEDS_GPU, NEEDS_TRITON, NEEDS_ENV = (
    "needs a GPU",
    "needs another Triton",
    "needs your environment",  # a module your code imports is not importable where the check ran
)  # the check cannot run in this environment: not a failure
FAILED = (FAIL, ERROR)
CANNOT_RUN = (NEEDS_GPU, NEEDS_TRITON, NEEDS_ENV)
DIFFERS, RAISES = "differs", "raises"  # how FAIL and ERROR read beyond the handout (the saved status stays FAIL/ERROR)


@dataclass
class Check:
    """One property of one implementation. `detail` says what differed: where (parameter, index, step), by how much,
    against which bound, and the likely mistake when the signature is recognisable."""

    topic: str
    impl: str  # which of the file's implementations ("triton", "bucketed", ...)
    prop: str  # the property checked, named so a failure reads on its own ("forward vs float64, bf16, H=1000")
    status: str  # PASS | FAIL | ERROR | NOT_IMPLEMENTED | SKIPPED | NEEDS_GPU | NEEDS_TRITON | NEEDS_ENV
    detail: str = ""
    beyond: bool = False  # a probe beyond the handout's promises (other shapes, dtypes, models): reported, never
    #                       part of the exit status
    why: str = ""  # beyond the handout: why the handout does not require it (empty: why_not_required's reading)


@dataclass
class TopicResult:
    """A topic's checks, and its side-by-side rows: dicts with at least topic, measure, who ('yours' | 'ours' |
    'pytorch' | 'formula'), value, unit; timing rows also the paired-ratio columns (timing.ratio_columns)."""

    topic: str
    checks: list[Check] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    poisoned: bool = False  # a CUDA error stopped the checks: what is left must run in a fresh process
    timing_fault: str | None = None  # the timing row ("who:impl") whose CUDA error stopped the timing here

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
    if " before or outside the worker's Python code" in head:  # a signal: the launcher's hint is for scripts
        rank, others = head.split(" before or outside", 1)[0], head.partition(" (rank ")[2]
        head = (
            f"{rank} while running your code: a crash outside Python, not an exception (e.g. a Triton kernel that "
            "reads or writes outside its tensors in the interpreter, out of memory, os._exit)"
            + (f" (rank {others}" if others else "")
        )
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


CHECK_COLUMNS = ["topic", "impl", "prop", "status", "detail", "beyond", "why"]


def checks_table(results: list[TopicResult]):
    """One row per check: topic, implementation, property, status, what differed, beyond the handout or not, and
    (beyond it) why the handout does not require it."""
    import pandas as pd

    rows = [r for res in results for r in res.as_rows()]
    for r in rows:
        r["why"] = why_not_required(r) if r["beyond"] else ""
    return pd.DataFrame(rows, columns=CHECK_COLUMNS)


# ---- beyond the handout: information, in words that do not say "fail" ----

BEYOND_WHY = (  # (topic, "" for any; words in a probe's name, lower case; why the handout does not require it)
    ("", ("float64", "derived bound", "tighter"), "a bound derived from the dtype, tighter than the course's tests'"),
    ("attention", ("4-d",), "the handout's inputs are 3-D (batch, N, d)"),
    ("attention", ("tile multiple",), "the handout's lengths are powers of two, at least 16"),
    ("attention", ("causal mask applied",), "the handout lets the PyTorch version ignore is_causal"),
    ("attention", ("saved for backward",), "the course's tests do not look at what autograd keeps"),
    ("attention", ("bf16", "fp16"), "the course's tests run this implementation in fp32"),
    ("rmsnorm", ("bf16", "fp16"), "the course's tests run RMSNorm in fp32"),
    ("rmsnorm", ("non-contiguous", "transposed"), "the course's tests pass contiguous inputs"),
    ("rmsnorm", ("wider than",), "wider rows than the course's tests use"),
    ("ddp", ("our toy model",), "our toy model has what the course's lack: tied, frozen, unused parameters, a buffer"),
    ("sharding", ("toy model",), "bitwise, on our toy model: the course's test compares within a tolerance"),
    ("fsdp", ("sgd steps", "transformerlm"), "our TransformerLM seeded per rank, a bound derived from the dtype"),
    ("", ("timing",), "a measurement to read, not a rule"),
    ("", ("formula", "state per rank", "peak", "bytes", "memory"), "our closed form, not a bound the handout sets"),
)
LEFT_OPEN = "the handout leaves this open"


def why_not_required(check: dict) -> str:
    """Why a probe beyond the handout is not required: its own `why`, else BEYOND_WHY's reading of its topic and
    name, else LEFT_OPEN."""
    if check.get("why"):
        return check["why"]
    name = str(check.get("prop", "")).lower()
    for topic, words, why in BEYOND_WHY:
        if topic in ("", check.get("topic")) and any(w in name for w in words):
            return why
    return LEFT_OPEN


def shown_status(check: dict) -> str:
    """The word a reader sees: within the handout the status itself; beyond it DIFFERS for FAIL and RAISES for
    ERROR (information about what the handout leaves open, not a failure)."""
    if check.get("beyond") and check["status"] in FAILED:
        return DIFFERS if check["status"] == FAIL else RAISES
    return check["status"]


def beyond_name(check: dict) -> str:
    """A probe's name without the "beyond the handout: " its section already says."""
    return str(check["prop"]).removeprefix("beyond the handout: ")


PLURAL = {
    DIFFERS: "differ",
    RAISES: "raise",
    NEEDS_GPU: "need a GPU",
    NEEDS_TRITON: "need another Triton",
    NEEDS_ENV: "need your environment",
}


def beyond_counts(checks: list[dict]) -> str:
    """'6 probes: 3 pass, 2 differ, 1 raises' (the words beside a folded group of probes)."""
    words = [shown_status(c) for c in checks]
    order = {PASS: 0, DIFFERS: 1, RAISES: 2}
    shown = sorted(set(words), key=lambda w: (order.get(w, len(order)), w))
    parts = [f"{words.count(w)} {w if words.count(w) == 1 else PLURAL.get(w, w)}" for w in shown]
    return f"{len(words)} probe{'' if len(words) == 1 else 's'}: {', '.join(parts)}"


def summary(checks: list[dict]) -> tuple[str, bool]:
    """("N implemented: P pass, F fail, G need a GPU or another Triton; M not implemented", ok) over the checks within
    the handout's contract (rows of checks_table); ok only when something was checked and nothing failed."""
    within = [c for c in checks if not c.get("beyond")]
    count = {s: sum(c["status"] == s for c in within) for s in (PASS, FAIL, ERROR, *CANNOT_RUN, NOT_IMPLEMENTED)}
    failed, cannot = count[FAIL] + count[ERROR], sum(count[s] for s in CANNOT_RUN)
    implemented = count[PASS] + failed + cannot
    if not implemented:
        return (
            f"nothing implemented yet: {count[NOT_IMPLEMENTED]} adapters raise NotImplementedError and the "
            "others are absent, so there was nothing to check",
            False,
        )
    text = (
        f"{implemented} checks of what you implemented: {count[PASS]} pass, {failed} fail, {cannot} need a GPU "
        f"or another Triton{' or your environment' if count[NEEDS_ENV] else ''}; {count[NOT_IMPLEMENTED]} not "
        "implemented"
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


# ---- the terminal ----


def _wrap(text: str, width: int = 100) -> str:
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="      ")) if text else ""


def print_report(results: list) -> None:
    """The terminal report of `python -m helpers yours`: each topic's checks within the handout (failures in full);
    the probes beyond it folded per topic (their counts, then each that differs or raises, with why the handout does
    not require it, in short); then the side-by-side rows."""
    for res in results:
        shown = [c for c in res.checks if not c.beyond]
        if shown:
            print(f"\n== {res.topic}")
        for c in shown:
            print(f"  {c.status:>20}  {c.impl:<11} {c.prop}")
            if c.detail and c.status != PASS:
                print("      " + _wrap(c.detail))
    beyond = [(res.topic, [asdict(c) for c in res.checks if c.beyond]) for res in results]
    if any(rows for _, rows in beyond):
        print(
            "\n==== beyond the handout: information on what it leaves open, never in the exit status (in full on the "
            "page)"
        )
    for topic, rows in beyond:
        if rows:
            print(f"\n== {topic}: {beyond_counts(rows)}")
        for r in rows:
            if shown_status(r) != PASS:
                print(f"  {shown_status(r):>20}  {r['impl']:<11} {beyond_name(r)}")
                short = textwrap.shorten(r["detail"], 160, placeholder=" ...")
                print("      " + _wrap(f"({why_not_required(r)}) {short}"))
    for res in results:
        if res.rows:
            print(f"\n== {res.topic}: side by side (ratios paired in one interleaved loop)")
            print(readable_rows(res.rows).to_string(index=False, max_colwidth=90))
