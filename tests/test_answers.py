"""The answers page covers the course: every question of the reference writeups and every problem of the 2025 and
2026 editions (../shared/curricula.md) has one answer, in a table that points at real notebooks; a faster side is named
only outside the noise. The page built from data folders: test_answers_page.py; its sentences:
test_answers_sentences.py (both over answers_data's synthetic folder)."""

import os
import re
from pathlib import Path

import pytest

from helpers.course import answers as A
from helpers.timing import Ratio, pairwise_ratios, ratio_of

ROOT = Path(__file__).resolve().parent.parent
SEEDS = Path(os.environ.get("SEEDS_DIR", ROOT.parent / "shared" / "seeds"))
CURRICULA = Path(os.environ.get("CURRICULA", ROOT.parent / "shared" / "curricula.md"))
LETTERS = "abcdefgh"


def course_numbers(text: str) -> set[str]:
    """The numbered questions of sections 2 and 3 of a writeup: "2.1.1(b)" per part, "3.1.1" when it has none.
    A heading is "N.N.N. (name)"; a part is a line opening with "(x)" or "- (x)"; earlier unlabelled bullets count as
    the parts before the first label (the writeup's 2.1.2 labels only its (d))."""
    parts, current = {}, None
    for line in text.splitlines():
        heading = re.match(r"\s*([23]\.\d+\.\d+)\.\s*\(", line)
        if heading:
            current = heading.group(1)
            parts[current] = set()
        elif current and (label := re.match(r"\s*(?:-\s*)?\(([a-h])\)", line)):
            parts[current].add(label.group(1))
    return {f"{n}({c})" for n, found in parts.items() if found for c in LETTERS[: LETTERS.index(max(found)) + 1]} | {
        n for n, found in parts.items() if not found
    }


def accounting_parts(text: str) -> set[str]:
    """The parts of the ZeRO-1 accounting commentary: "## Part (a): ..." -> "a"."""
    return set(re.findall(r"^#+\s*Part \(([a-h])\)", text, flags=re.M))


def seed(name: str) -> str:
    path = SEEDS / name
    if not path.is_file():
        pytest.skip(f"the reference writeups are not at {SEEDS} (set SEEDS_DIR)")
    return path.read_text(encoding="utf-8")


def test_the_parser_reads_headings_parts_and_unlabelled_bullets():
    text = "2.1.1. (script)\n- (a) x\n(b) y\n2.1.2. (table)\n- first\n- (c) z\n3.1.1. (`comm`)\ntext (a) inline\n"
    assert course_numbers(text) == {"2.1.1(a)", "2.1.1(b)", "2.1.2(a)", "2.1.2(b)", "2.1.2(c)", "3.1.1"}


def test_every_question_of_the_full_writeup_is_answered():
    numbers = course_numbers(seed(A.WRITEUP))
    assert len(numbers) > 40, sorted(numbers)  # the parser found the writeup's questions
    of_2024 = {q.number for q in A.QUESTIONS if 2024 in q.editions}
    assert numbers == of_2024, f"missing: {sorted(numbers - of_2024)}; not in the writeup: {sorted(of_2024 - numbers)}"


def test_the_three_accounting_questions_are_answered_and_cite_their_source():
    parts = accounting_parts(seed(A.ZERO1))
    assert parts == {"a", "b", "c"}
    for part in parts:
        q = A.BY_NUMBER[f"3.4.5({part})"]
        assert any(r.source == A.ZERO1 for r in q.references), q


def test_the_table_is_complete_and_points_at_real_notebooks():
    assert len(A.QUESTIONS) == len(A.BY_NUMBER)  # no number twice
    stems = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    for q in A.QUESTIONS:
        assert q.number in A.ANSWERS, q.number
        assert A.NOTEBOOKS[q.notebook] in stems, q
        assert q.ask and q.section and q.gpu and q.problem and set(q.editions) <= set(A.EDITIONS), q
        assert q.reads or 2024 not in q.editions, q  # every 2024 answer reads saved results
        sources = (A.WRITEUP, A.ZERO1) if q.editions == (2024,) else ()
        assert all(r.value and (r.source in sources or re.search(r", 20\d\d$", r.source)) for r in q.references), q


def test_an_answer_for_an_unknown_number_is_refused():
    with pytest.raises(ValueError, match="9.9.9"):
        A.answers("9.9.9")(lambda q, saved: "")


# ---- comparisons -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "low, high, expected",
    [
        (0.9, 1.1, "no measurable difference"),
        (0.7, 0.9, "a is measurably faster than b"),
        (1.1, 1.3, "b is measurably faster than a"),
    ],
)
def test_a_winner_is_named_only_when_the_interval_excludes_one(low, high, expected):
    text = A.compare_text("a", "b", Ratio((low + high) / 2, low, high, pairs=10))
    assert expected in text
    if expected.startswith("no"):
        assert "faster" not in text


def test_too_few_pairs_name_no_winner():
    text = A.compare_text("a", "b", Ratio(0.5, 0.4, 0.6, pairs=3))
    assert "too few" in text and "faster" not in text


def test_pairwise_ratios_round_trip_through_the_saved_columns():
    rows = pairwise_ratios({"a": [2.0] * 8, "b": [1.0] * 8, "c": [1.0, 1.1] * 4}, size="s")
    assert {(r["a"], r["b"]) for r in rows} == {("a", "b"), ("b", "a"), ("a", "c"), ("c", "a"), ("b", "c"), ("c", "b")}
    ab = next(r for r in rows if (r["a"], r["b"]) == ("a", "b"))
    assert ab["size"] == "s" and ratio_of(ab) == Ratio(2.0, 2.0, 2.0, 8)


# ---- every edition ---------------------------------------------------------------------------------------------------


def edition_problems(text: str) -> dict[int, set[str]]:
    """The problems each later edition names in curricula.md: the bold names of its bullets ("**a / b**": two)."""
    found, year = {}, None
    for line in text.splitlines():
        heading = re.match(r"##\s*(20\d\d) edition", line)
        if heading:
            year = int(heading.group(1))
            found[year] = set()
        elif line.startswith("## "):  # another section (the details, the contract): no edition's list
            year = None
        elif year and (bold := re.match(r"\s*-\s*\*\*([^*]+)\*\*", line)):
            found[year] |= {name.strip() for name in bold.group(1).split("/")}
    return found


def test_the_curricula_parser_reads_editions_and_split_names():
    text = (
        "## 2025 edition (adds)\n- **a_b**: x\n- plain\n## 2026 edition\n- **c / d_e**: y\n- **a_b**: z\n"
        "## Details\n- **2026 Table 1**: not a problem\n"
    )
    assert edition_problems(text) == {2025: {"a_b"}, 2026: {"c", "d_e", "a_b"}}


def test_every_problem_of_the_2025_and_2026_editions_is_answered():
    if not CURRICULA.is_file():
        pytest.skip(f"the curricula are not at {CURRICULA} (set CURRICULA)")
    wanted = edition_problems(CURRICULA.read_text(encoding="utf-8"))
    assert set(wanted) == {2025, 2026} and all(len(v) > 5 for v in wanted.values()), wanted
    for year, names in wanted.items():
        have = {q.problem for q in A.QUESTIONS if year in q.editions}
        assert names <= have, f"{year}: missing {sorted(names - have)}"
    shared = {q.problem for q in A.QUESTIONS if set(q.editions) == {2025, 2026}}
    assert {"pytorch_attention", "flash_forward", "flash_backward", "flash_benchmarking"} <= shared


def test_a_problem_both_editions_share_is_one_question():
    seen = {}
    for q in A.QUESTIONS:
        for year in q.editions:
            assert (year, q.number) not in seen, q.number
            seen[year, q.number] = q
    assert len({q.number for q in A.QUESTIONS}) == len(A.QUESTIONS)
