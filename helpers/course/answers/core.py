"""What every answer module shares: the question rows, the registry of answer functions, reading this machine's saved
results (`Saved`), and the sentences a comparison gives (one copy, used by every notebook's answers).

A comparison is answered only from rows that carry a paired ratio and its interval (`timing.pairwise_ratios`, saved by
the notebook that timed both sides in one interleaved loop): inside the noise the text says so and names no winner.
"""

from __future__ import annotations

import contextvars
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from helpers.published import Mark
from helpers.results import DATA_DIR, Results, load_results
from helpers.timing import Ratio, ratio_of, verdict

WRITEUP = "004_7287c5c69baef1ef.txt"  # the published full writeup of the 2024 edition (H100s)
ZERO1 = "000_6835ed27c4bcad4a.txt"  # the published ZeRO-1 accounting commentary (H100s)

# ---- comparisons: the rows a notebook saves, and the sentence they give ---------------------------------------------


def compare_text(a: str, b: str, r: Ratio, what: str = "time") -> str:
    """One clause: the measurably faster of a and b with the ratio, or no winner inside the noise."""
    if not r.differs:
        return verdict(a, b, r, what)
    faster, slower = (a, b) if r.median < 1 else (b, a)
    return f"{faster} is measurably faster than {slower}: {a} takes {r.median:.2f}x {b}'s {what} ({r})"


INTERVALS: contextvars.ContextVar[list | None] = contextvars.ContextVar("INTERVALS", default=None)
# while an answer is computed (answer() sets a list), series_text puts its per-value ratios there, for a table under
# the sentence, instead of inside it


def series_text(rows: pd.DataFrame, a: str, b: str, over: str, names: dict | None = None, what: str = "time") -> str:
    """a's time over b's at each value of `over` (rows of pairwise_ratios), then how many are measurable each way; the
    ratios with their intervals go to the answer's table when one is collecting (INTERVALS), else inline."""
    names = names or {}
    na, nb = names.get(a, a), names.get(b, b)
    part = rows[(rows["a"] == a) & (rows["b"] == b)]
    if part.empty:
        raise NotMeasured(f"no {a} vs {b} comparison saved")
    ratios = [(str(key), ratio_of(row)) for key, row in zip(part[over], part.to_dict("records"), strict=True)]
    items = ", ".join(f"{key}: {r.median:.2f}x [{r.low:.2f}-{r.high:.2f}]" for key, r in ratios)
    faster = [k for k, r in ratios if r.differs and r.median < 1]
    slower = [k for k, r in ratios if r.differs and r.median > 1]
    same = [k for k, r in ratios if not r.differs]
    every, any_ = (f"for every {over}", f"for any {over}") if len(ratios) > 1 else (f"for {over} {ratios[0][0]}",) * 2
    if len(faster) == len(ratios):
        head = f"{na} is measurably faster than {nb} {every}"
    elif len(slower) == len(ratios):
        head = f"{nb} is measurably faster than {na} {every}"
    elif len(same) == len(ratios):
        head = f"no measurable difference between {na} and {nb} {any_} on this machine"
    else:
        head = "; ".join(
            text
            for keys, text in (
                (faster, f"{na} is measurably faster than {nb} for {over} {', '.join(faster)}"),
                (slower, f"{nb} is measurably faster than {na} for {over} {', '.join(slower)}"),
                (same, f"no measurable difference between them for {over} {', '.join(same)}"),
            )
            if keys
        )
    collecting = INTERVALS.get()
    if collecting is not None:
        collecting += [
            {
                "comparison": f"{na}'s {what} over {nb}'s",
                over: key,
                "median of paired ratios [95% interval]": f"{r.median:.2f}x [{r.low:.2f}-{r.high:.2f}]",
                "measurable": "faster" if r.differs and r.median < 1 else "slower" if r.differs else "no",
            }
            for key, r in ratios
        ]
        return f"{head} (ratios in the table below)"
    return f"{head} ({na}'s {what} over {nb}'s, median of paired ratios [95% interval] per {over}: {items})"


# ---- reading what this machine saved ---------------------------------------------------------------------------------


class NotMeasured(Exception):
    """A saved result an answer reads is missing, empty, or was saved by the other profile."""


class NeedsGPU(NotMeasured):
    """What the question asks can only be measured on a GPU; the message says what a CPU gives and what to run."""


class Saved:
    """This machine's saved results for one profile, each read once; remembers which ones answers used."""

    def __init__(self, folder: Path, profile: str):
        self.folder, self.profile = Path(folder), profile
        self.used: dict[str, Results] = {}
        self._cache: dict[str, Results | NotMeasured] = {}

    def _get(self, name: str) -> Results | NotMeasured:
        """The saved run, or why there is none (read once)."""
        if name not in self._cache:
            path = self.folder / f"{name}.jsonl"
            run = load_results(path) if path.is_file() else None
            saved_by = None if run is None else run.provenance.get("profile")
            self._cache[name] = (
                NotMeasured(f"nothing saved as {name}")
                if run is None
                else NotMeasured(f"{name} was saved by a {saved_by}-profile run")
                if saved_by not in (None, self.profile)
                else run
                if run.rows
                else NotMeasured(f"{name} has no rows")
            )
        return self._cache[name]

    def run(self, name: str) -> Results:
        """The saved run `name` (marked as used), or NotMeasured."""
        found = self._get(name)
        if isinstance(found, NotMeasured):
            raise found
        self.used[name] = found
        return found

    def frame(self, name: str) -> pd.DataFrame:
        """The rows of the saved run `name` as a DataFrame."""
        return self.run(name).frame()

    def has(self, name: str) -> bool:
        """Whether `name` was saved by this profile (without marking it used)."""
        return not isinstance(self._get(name), NotMeasured)

    def edition_of(self, names) -> str | None:
        """The course edition whose model the first of `names` saved here measured (its provenance's "edition"), or
        None when none records one (results that do not depend on the edition's model)."""
        for name in names:
            found = self._get(name)
            if not isinstance(found, NotMeasured) and found.provenance.get("edition"):
                return str(found.provenance["edition"])
        return None

    def gpu_device(self, names) -> str | None:
        """The GPU that produced the first of `names` saved here, or None when it ran on a CPU (or nothing is saved)."""
        for name in names:
            found = self._get(name)
            if not isinstance(found, NotMeasured) and found.provenance.get("device_type") == "cuda":
                return found.provenance.get("device") or "a GPU"
        return None


def shown(path: Path) -> str:
    """A path relative to the repository when it lies inside it."""
    try:
        return Path(path).resolve().relative_to(DATA_DIR.parent).as_posix()
    except ValueError:
        return Path(path).name


def fmt_s(seconds: float) -> str:
    """Seconds in the unit that suits them: 1.23 s, 12.3 ms, 456 µs."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} µs"


def fmt_mib(mib: float) -> str:
    """MiB, or GiB above 1024 MiB."""
    return f"{mib / 1024:.3g} GiB" if mib >= 1024 else f"{mib:.3g} MiB"


def pct(x: float) -> str:
    """A share as a percentage: one decimal below 10%."""
    return f"{x:.1%}" if abs(x) < 0.1 else f"{x:.0%}"


def cap(text: str) -> str:
    """The text with a capital first letter, unless it opens with a model name ("xl/cpu") or a dtype ("fp32")."""
    keep = not text[:1].islower() or re.match(r"\S*/|fp\d|bf\d", text)
    return text if keep else text[0].upper() + text[1:]


SHORT: contextvars.ContextVar[list | None] = contextvars.ContextVar("SHORT", default=None)
# while an answer is computed (answer() sets a list): what of the handout's configuration did not run (sizes,
# contexts, steps, widths, grid), each said once; a "measured" answer with any becomes "partial", naming them


def short_of(missing: str) -> None:
    """Record that the run behind the answer being computed left part of the handout's configuration out."""
    collecting = SHORT.get()
    if collecting is not None and missing not in collecting:
        collecting.append(missing)


def ran_against(what: str, ran, asked) -> str:
    """ "" when every value the handout asks (`asked`) ran; else records and returns "{what} ran: X of the
    handout's Y"."""
    ran, asked = list(dict.fromkeys(ran)), list(dict.fromkeys(asked))
    if all(a in ran for a in asked):
        return ""
    said = f"{what} ran: {', '.join(map(str, ran))} of the handout's {', '.join(map(str, asked))}"
    short_of(said)
    return said


def coverage(ran, profile: str, edition: str | None = None, limit: str = "the time budget") -> str:
    """ "" when every size of the profile (of the edition's Table 1; 2024's when None) ran; else a clause naming how
    many of them `limit` (what cut them) let run."""
    from helpers.model import sizes_for

    planned = sizes_for(profile, edition or "2024") if profile in ("cpu", "gpu") else []
    ran = [s for s in dict.fromkeys(ran)]
    missing = [s for s in planned if s not in ran]
    if not missing:
        return ""
    short_of(f"sizes: {limit} ran {len(ran)} of the {len(planned)} ({', '.join(missing)} not timed)")
    return (
        f" ({limit} ran {len(ran)} of the {len(planned)} sizes: {', '.join(ran)}; "
        f'{", ".join(missing)} {"was" if len(missing) == 1 else "were"} not timed, so "every" means every size '
        "timed)"
    )


def and_join(items) -> str:
    """ "a", "a and b", "a, b and c": a list in a sentence."""
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def span(values, digits: int = 1) -> str:
    """ "1.2x to 1.9x" over the values, or "1.5x" when they agree to `digits`."""
    lo, hi = f"{min(values):.{digits}f}x", f"{max(values):.{digits}f}x"
    return lo if lo == hi else f"{lo} to {hi}"


# ---- the questions and their answers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """A published figure, cited by its source (a file of the reference writeups, or a source and year)."""

    value: str
    source: str

    @classmethod
    def of(cls, mark: Mark) -> Reference:
        """A helpers.published mark as a reference."""
        return cls(f"{mark.name}: {mark.value:g} {mark.unit} ({mark.setting})", f"{mark.source}, {mark.year}")


PROBLEMS = {  # the 2024 edition's name for each numbered problem
    "2.1.1": "benchmarking_script",
    "2.1.2": "function_call_table",
    "2.1.3": "flame_graph",
    "2.1.4": "benchmarking_mixed_precision",
    "2.1.5": "pytorch_layernorm",
    "2.2.1": "rmsnorm_forward_benchmarking",
    "2.2.2": "rmsnorm_jvp_g",
    "2.2.3": "rmsnorm_jvp_x",
    "2.2.4": "rmsnorm_benchmarking",
    "2.3.1": "torch_compile",
    "2.4.1": "memory_profiling",
    "3.1.1": "distributed_communication_single_node",
    "3.2.1": "distributed_communication_multi_node",
    "3.3.1": "naive_ddp",
    "3.3.2": "naive_ddp_benchmarking",
    "3.4.1": "minimal_ddp_flat_benchmarking",
    "3.4.2": "minimal_ddp_benchmarking",
    "3.4.3": "ddp_overlap_individual_parameters_benchmarking",
    "3.4.4": "ddp_bucketed_benchmarking",
    "3.4.5": "optimizer_state_sharding_accounting",
}


@dataclass(frozen=True)
class Question:
    """One question of the course: what it asks, where it is answered, what it reads, how it carries over."""

    number: str  # the key: "2.1.1(b)" in 2024's numbering; "pytorch_attention(a)" for the later editions
    ask: str  # the question in our words
    notebook: str  # "01"
    section: str  # the notebook section with the details
    reads: tuple[str, ...]  # the saved results the answer reads (empty: computed, the same on every machine)
    gpu: str  # does the answer carry over to a GPU (an answer may replace it from what it measured)
    references: tuple[Reference, ...] = ()
    editions: tuple[int, ...] = (2024,)
    name: str = ""  # the edition's problem name (2025, 2026); 2024's come from PROBLEMS
    also_reads: tuple[str, ...] = ()  # results the answer adds when saved here, never needs (a closed form's check)

    @property
    def group(self) -> str:
        """The problem's key without the part: "2.1.1", "gradient_checkpointing"."""
        return self.number.split("(")[0]

    @property
    def problem(self) -> str:
        """The course's name for the problem: "benchmarking_script", "leaderboard"."""
        return self.name or PROBLEMS[self.group]


def ref(value: str, source: str = WRITEUP) -> tuple[Reference, ...]:
    """One published figure, from the 2024 full writeup unless `source` says otherwise."""
    return (Reference(value, source),)


STATUSES = {  # an answer's status on the page -> what it means (the page's header counts each)
    "measured": "measured here: computed from results this machine saved",
    "closed form": "closed form: computed from the handout's values, the same anywhere",
    "partial": "partial: answered in part, the rest says what is missing",
    "needs a GPU": "needs a GPU: what a CPU can give is shown, the asked measurement needs a GPU",
    "not run": "not run yet: the notebook that measures it has not saved its results here",
}


@dataclass(frozen=True)
class Answer:
    """What an answer function may return instead of a str: its text, the GPU line its measurement chose, a small table
    shown under the text (rows of {column: value}), and a status when it is not a plain measured/closed-form answer
    ("partial" or "needs a GPU", with `missing` saying what is left)."""

    text: str
    gpu: str = ""
    table: tuple = ()
    status: str = ""
    missing: str = ""


@dataclass(frozen=True)
class Answered:
    """An answer on the page: its text, whether it came from this run's results, the GPU line, its table, its status
    (a key of STATUSES) and what is missing when partial."""

    text: str
    measured: bool
    gpu: str
    table: tuple = ()
    status: str = "measured"
    missing: str = ""
    intervals: tuple = ()  # the comparisons' paired ratios, one row per compared value
    model: str = ""  # the edition whose model the results it read measured ("" when they do not depend on one)

    def for_edition(self, year: int, notebook: str = "") -> tuple[str, str]:
        """(status, what is missing) for one edition: an answer measured on another edition's model is partial there
        (how to build that edition's own is said once, at the top of its section of the page)."""
        if not self.model or self.model == str(year) or self.status not in ("measured", "partial"):
            return self.status, self.missing
        return "partial", f"the {self.model} edition's model ran"


QUESTIONS: list[Question] = []  # every edition's, in page order within each edition
BY_NUMBER: dict[str, Question] = {}
ANSWERS: dict[str, object] = {}  # number -> function(question, saved) -> str | Answer


def register(questions) -> None:
    """Add a notebook's questions to the table (each number once)."""
    for q in questions:
        if q.number in BY_NUMBER:
            raise ValueError(f"question {q.number!r} is listed twice")
        BY_NUMBER[q.number] = q
        QUESTIONS.append(q)


def answers(*numbers: str):
    """Register a function as the answer to these question numbers (called with the question and the saved data)."""

    def add(fn):
        for n in numbers:
            if n not in BY_NUMBER:
                raise ValueError(f"{fn.__name__} answers {n!r}, which is not in QUESTIONS")
            ANSWERS[n] = fn
        return fn

    return add


READ_ERRORS = (KeyError, IndexError, ValueError, TypeError)  # a saved result without what an answer reads (old format)


def answer(q: Question, saved: Saved) -> Answered:
    """The answer's text, whether it was measured in this run, and its GPU line; a missing result never raises."""
    collected, short = [], []
    token, token_short = INTERVALS.set(collected), SHORT.set(short)
    try:
        got = ANSWERS[q.number](q, saved)
    except NeedsGPU as why:
        return Answered(f"Needs a GPU: {why}.", False, q.gpu, status="needs a GPU")
    except NotMeasured as why:
        return Answered(f"Not measured in this run (run notebook {q.notebook}; {why}).", False, q.gpu, status="not run")
    except READ_ERRORS as err:
        return Answered(
            f"Not measured in this run (run notebook {q.notebook}: its saved results lack what this answer "
            f"reads, {type(err).__name__}: {err}).",
            False,
            q.gpu,
            status="not run",
        )
    finally:
        INTERVALS.reset(token)
        SHORT.reset(token_short)
    got = got if isinstance(got, Answer) else Answer(got)
    status = got.status or ("measured" if q.reads else "closed form")
    if short and status in ("measured", "partial"):  # what of the handout's configuration did not run
        missing = "; ".join([*short, *([got.missing] if got.missing else [])])
        got = Answer(got.text, got.gpu, got.table, "partial", missing)
        status = "partial"
    if status not in STATUSES or status == "not run":
        raise ValueError(f"answer {q.number}: status {status!r} is not one of {list(STATUSES)[:-1]}")
    gpu = saved.gpu_device(q.reads)
    line = got.gpu or q.gpu if gpu is None else f"Measured on one: this run's {gpu} (the answer above is its own)."
    model = saved.edition_of(q.reads) or ""
    return Answered(cap(got.text), True, line, tuple(got.table), status, got.missing, tuple(collected), model)
