"""The answers page itself: every edition's questions grouped by edition and problem, each answer with where its
details are, the published figures and the GPU line its measurement chose; then the saved results it read."""

from __future__ import annotations

import functools
import html
import json
import re
from datetime import datetime, timezone
from pathlib import Path

import helpers.course.answers.handouts as handouts
from helpers.course.answers.core import QUESTIONS, STATUSES, Answered, Question, Saved, answer, shown
from helpers.course.answers.nb07_calcs import CALC_VARIABLES
from helpers.env import machine_facts
from helpers.model import ARCH_NAMES, edition_arch
from helpers.results import DATA_DIR, device_slug
from helpers.timing import MIN_PAIRS

NOTEBOOKS = {
    "01": "01_benchmarking_and_profiling",
    "02": "02_rmsnorm_triton",
    "03": "03_collectives",
    "04": "04_ddp",
    "05": "05_optimizer_state_sharding",
    "06": "06_flash_attention",
    "07": "07_fsdp",
    "08": "08_model_parallelism",
}  # number -> file stem (and writeup page)
EDITIONS = {  # year -> (title, what it kept from the one before, as a note)
    2024: (
        "2024 edition: profiling, kernels, data-parallel training (numbered as the reference writeup numbers them)",
        "",
    ),
    2025: (
        "2025 edition: FlashAttention-2, communication accounting",
        "DDP (bucketed included) and optimizer-state sharding are as in 2024: the map lists them and links their "
        "answers in the 2024 section. RMSNorm in Triton is replaced by FlashAttention-2.",
    ),
    2026: (
        "2026 edition: activation checkpointing, FSDP, the parallelism calculators",
        "nsys_profile, mixed_precision_accumulation, attention and FlashAttention-2 are as in 2025: the map lists "
        "them and links their answers in the 2025 section. Bucketed DDP is removed; the hardware in the handout is a "
        "B200; Table 1 redefines the sizes (xl is 2560/10240/32 layers/32 heads, and a 10B is added) on the "
        "cs336-basics model (SwiGLU, RoPE), which the closed forms here use. " + CALC_VARIABLES,
    ),
}
SECTIONS_2024 = {
    "2": "Single-device performance: timing, profiling, mixed precision, norms, kernels, compilation, memory",
    "3": "Distributed data-parallel training: collectives, DDP variants, buckets, optimizer-state sharding",
}


def default_folder() -> Path:
    """This machine's results: data/local/<device>/."""
    return DATA_DIR / "local" / device_slug(machine_facts()["device"])


def _math(expr: str) -> str:
    """An expression as math: italic serif, X_Y as a subscript, ^2 as a superscript (no network, no script)."""
    out = re.sub(r"([A-Za-z])_([A-Za-z0-9]+)", r"\1<sub>\2</sub>", expr)
    out = re.sub(r"\^(\w+)", r"<sup>\1</sup>", out)
    return f'<span class="math">{out}</span>'


def _code(text: str) -> str:
    """HTML-escaped text with `code` spans and $math$ spans."""
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(str(text), quote=False))
    return re.sub(r"\$([^$]+)\$", lambda m: _math(m.group(1)), escaped)


def slug(number: str) -> str:
    """A stable id part without spaces: "2.1.1(b)" -> "2.1.1-b", "2026 leaderboard" -> "2026-leaderboard"."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", number).strip("-")


def answer_id(q: Question) -> str:
    """The answer's anchor on the page: the first edition that shows it, and its number (its year said once:
    "a2025-leaderboard", not "a2025-2025-leaderboard")."""
    year = min(q.editions)
    return f"a{year}-{slug(q.number).removeprefix(f'{year}-')}"


def page_order(qs, year: int) -> list[Question]:
    """An edition's questions in its handout's order: 2024's by problem number (2.4.1 after 2.3.1, though notebook
    01 answers it), the later ones as registered."""
    if year != 2024:
        return list(qs)
    return sorted(qs, key=lambda q: tuple(int(n) for n in q.group.split(".")))


def heading_id(text: str) -> str:
    """The id nbconvert gives a markdown heading in the exported notebook (its text, spaces as "-", URL-quoted)."""
    from urllib.parse import quote

    plain = re.sub(r"[`*$]", "", text).strip()
    return quote(plain.replace(" ", "-"), safe="?/:@!$&'()*+,;=")


@functools.cache
def notebook_headings(notebook: str) -> tuple[str, ...]:
    """The markdown headings of a notebook (text after the #s), in order; () when the file is not there."""
    path = DATA_DIR.parent / "notebooks" / f"{NOTEBOOKS[notebook]}.ipynb"
    if not path.is_file():
        return ()
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return tuple(
        line.lstrip("#").strip()
        for c in cells
        if c["cell_type"] == "markdown"
        for line in "".join(c["source"]).splitlines()
        if line.startswith("#")
    )


def section_anchor(q: Question) -> str:
    """The heading id of the question's notebook section: "§5 ..." -> the heading "5 · ...", a sub-heading whose text
    the section names first; else the first heading the section's text opens; "" when none matches (page top)."""
    heads = notebook_headings(q.notebook)
    m = re.match(r"§(\d+)\s*(.*)", q.section)
    rest = (m.group(2) if m else q.section).split(" and ")[0].strip().lower()
    if rest:
        for h in heads:
            if h.lower().lstrip("0123456789 ·").startswith(rest) or h.lower() == rest:
                return heading_id(h)
    if m:
        for h in heads:
            if re.match(rf"{m.group(1)}\s*·", h):
                return heading_id(h)
    first = rest.split()[0].rstrip(",:") if rest else ""
    for h in heads:
        if first and h.lower().startswith(first):
            return heading_id(h)
    return ""


def _table(rows) -> str:
    """Rows of {column: value} as a small table under an answer."""
    if not rows:
        return ""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_code(r.get(c, ''))}</td>" for c in cols) + "</tr>" for r in rows)
    return f'<table class="ans-table"><tr>{head}</tr>{body}</table>'


def _reference_runs(q: Question) -> str:
    """A line naming the reference runs (data/reference/<device>/) of what the answer reads, by device and date."""
    from helpers.results import reference_rows

    runs = []
    for name in q.reads:
        ref = reference_rows(name)
        for (device, date, profile), _ in ref.groupby(["device", "date", "profile"]) if len(ref) else ():
            runs.append(
                f"<code>{html.escape(name)}</code> on {html.escape(str(device))} ({html.escape(str(date))}, "
                f"profile {html.escape(str(profile))})"
            )
    return f"<li>reference runs beside this one: {'; '.join(runs)}</li>" if runs else ""


def _entry(q: Question, got: Answered, year: int) -> str:
    """One answer: number, question, answer (and its table), where the details are, the published figures, the GPU
    line, its status."""
    page = f"{NOTEBOOKS[q.notebook]}.html"
    anchor = section_anchor(q)
    refs = "".join(f"<li>published reference ({html.escape(r.source)}): {_code(r.value)}</li>" for r in q.references)
    reads = ", ".join(f"<code>{html.escape(n)}</code>" for n in q.reads) or "nothing saved: computed, the same anywhere"
    shared = (
        f"; also in the {' and '.join(str(y) for y in q.editions if y != year)} edition" if len(q.editions) > 1 else ""
    )
    missing = f" ({html.escape(got.missing)})" if got.missing else ""
    years = _maps_listing(q)
    status = f"status: {html.escape(got.status)}{missing}"
    if got.model:  # which edition's model ran, and what that makes this answer for each edition that asks it
        per = [(y, got.for_edition(y)[0]) for y in years]
        status = f"ran on the {got.model} edition's model; " + "; ".join(f"for {y}: {html.escape(st)}" for y, st in per)
        status += f"; missing from this run: {html.escape(got.missing)}" if got.missing else ""
    back = " · ".join(f'<a href="#map{y}">{y}</a>' for y in years)
    return (
        f'<div class="q {slug(got.status)}" id="{answer_id(q)}">'
        f'<p class="ask"><b>{html.escape(q.number)}</b> {_code(q.ask)}</p>'
        f'<p class="ans">{_code(got.text)}</p>{_table(got.table)}{_table(got.intervals)}<ul class="meta">'
        f"<li>{status}</li>"
        f'<li>details: <a href="{page}{"#" + anchor if anchor else ""}">notebook {q.notebook}, '
        f"{html.escape(q.section)}</a>; reads {reads}{shared}</li>{refs}{_reference_runs(q)}"
        f"<li>on a GPU: {_code(got.gpu)}</li><li>back to the map: {back}</li></ul></div>"
    )


STYLE = """body{font:15px/1.5 system-ui,sans-serif;max-width:62rem;margin:2rem auto;padding:0 1rem;color:#222}
h1{font-size:1.5rem}h2{font-size:1.25rem;border-bottom:2px solid #999;margin-top:2.4rem}
h3{font-size:1.05rem;margin:1.4rem 0 .3rem}h4{font-size:1rem;margin:1.1rem 0 .3rem}
.q{margin:.6rem 0 1rem;padding-left:.8rem;border-left:3px solid #4a7}.q.not-run{border-color:#c94}
.q.partial,.q.needs-a-GPU{border-color:#d6b24a}.math{font-family:"Times New Roman",serif;font-style:italic}
.ans-table{margin:.3rem 0}.map{margin:.5rem 0 1rem}
.ask{margin:0}.ans{margin:.2rem 0}.meta{margin:.1rem 0;font-size:13px;color:#555}code{background:#f3f3f3;padding:0 .2em}
.note{color:#555}table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:.15rem .5rem;
text-align:left}"""


def _sources(saved: Saved) -> str:
    """The saved results the answers read: file, device, profile, date, commit."""
    rows = "".join(
        f"<tr><td><code>{html.escape(name)}.jsonl</code></td><td>{html.escape(str(r.label))}</td>"
        f"<td>{html.escape(str(r.provenance.get('commit')))}</td></tr>"
        for name, r in sorted(saved.used.items())
    )
    return (
        "<table><tr><th>result</th><th>device · profile · date</th><th>commit</th></tr>" + rows + "</table>"
        if rows
        else "<p>No saved results were found for this profile.</p>"
    )


def _handout_id(problem: str, letter: str) -> str:
    """The problem id and letter as a handout names them: "benchmarking_script (b)", "leaderboard"."""
    return problem + (f" ({letter})" if letter else "")


def _maps_listing(q: Question) -> list[int]:
    """The editions whose map links answer `q`."""
    return [y for y in EDITIONS if (y == 2024 and 2024 in q.editions) or (y != 2024 and handouts.covers(q, y))]


def _map_row(label: str, qs: list[Question], year: int, got: dict[str, Answered]) -> str:
    if not qs:
        implementation = label.split(" (")[0] in handouts.IMPLEMENTATIONS
        what = (
            "code only: the notebooks show ours; <code>python -m helpers yours</code> checks yours"
            if implementation
            else "not answered here"
        )
        return f"<tr><td><code>{html.escape(label)}</code></td><td colspan=3>{what}</td></tr>"
    links, sections, statuses = [], [], []
    for q in qs:
        where = "" if min(q.editions) == year else f" (in the {min(q.editions)} section)"
        links.append(f'<a href="#{answer_id(q)}">{html.escape(q.number)}</a>{where}')
        nb = f"{NOTEBOOKS[q.notebook]}.html" + (f"#{section_anchor(q)}" if section_anchor(q) else "")
        section = f'<a href="{nb}">notebook {q.notebook}, {html.escape(q.section)}</a>'
        sections += [section] if section not in sections else []
        statuses.append(html.escape(got[q.number].for_edition(year)[0]))
    return (
        f"<tr><td><code>{html.escape(label)}</code></td><td>{'<br>'.join(links)}</td>"
        f"<td>{'<br>'.join(sections)}</td><td>{'<br>'.join(statuses)}</td></tr>"
    )


def _map(year: int, got: dict[str, Answered]) -> str:
    """The edition's map: every part its handout asks (handouts.PARTS; 2024: this page's numbering) -> the answers
    that cover it -> the notebook sections. Answers shown in an earlier edition's section are linked there."""
    if year == 2024:
        letter = lambda q: q.number[-2] if q.number.endswith(")") else ""  # noqa: E731
        rows = [
            _map_row(_handout_id(q.problem, letter(q)), [q], year, got)
            for q in page_order((q for q in QUESTIONS if 2024 in q.editions), 2024)
        ]
    else:
        rows = [_map_row(_handout_id(*part), qs, year, got) for part, qs in handouts.covering(year).items()]
    return (
        f'<table class="map" id="map{year}"><tr><th>{year} handout: problem (part)</th><th>answer</th>'
        f"<th>notebook section</th><th>status</th></tr>{''.join(rows)}</table>"
    )


def _edition(year: int, got: dict[str, Answered]) -> list[str]:
    """One edition's part of the page: its map, then the problems first shown here, each with its questions."""
    title, note = EDITIONS[year]
    body = [f'<h2 id="e{year}">{html.escape(title)}</h2>', f'<p class="ran">{model_line(year, got)}</p>']
    body += [f'<p class="note">{_code(note)}</p>'] if note else []
    body.append(_map(year, got))
    group, section = None, None
    for q in page_order((q for q in QUESTIONS if min(q.editions) == year), year):
        if year == 2024 and q.number[0] != section:
            section = q.number[0]
            body.append(f"<h3>{section} · {html.escape(SECTIONS_2024[section])}</h3>")
        if q.group != group:
            group = q.group
            label = f"{html.escape(q.group)} " if year == 2024 else ""
            pid = f"p{year}-{slug(q.group).removeprefix(f'{year}-')}"
            body.append(f'<h4 id="{pid}">{label}<code>{html.escape(q.problem)}</code></h4>')
        body.append(_entry(q, got[q.number], year))
    return body


def edition_questions(year: int) -> list[Question]:
    """The questions an edition's map links (its handout's parts; 2024: every 2024 question)."""
    return [q for q in QUESTIONS if year in _maps_listing(q)]


def model_line(year: int, got: dict[str, Answered]) -> str:
    """One line at the top of an edition's section: which edition's model the model-dependent answers ran on, and
    how to build this edition's own when it is another."""
    ran = sorted({got[q.number].model for q in edition_questions(year) if got[q.number].model})
    if not ran:
        return "No answer of this edition here depends on which edition's model ran."
    names = " and ".join(f"the {m} edition's ({html.escape(ARCH_NAMES[edition_arch(m)])})" for m in ran)
    if ran == [str(year)]:
        return f"Model that ran: {names}, this edition's own."
    return (
        f"Model that ran: {names}, not this edition's: the answers that depend on it are partial here. "
        f"<code>make writeup EDITION={year}</code> builds this edition's own."
    )


def status_counts(got: dict[str, Answered], year: int | None = None) -> dict[str, int]:
    """How many answers have each status (STATUSES' order); with `year`, over that edition's questions, each as that
    edition sees it (Answered.for_edition)."""
    if year is None:
        return {k: sum(a.status == k for a in got.values()) for k in STATUSES}
    seen = [got[q.number].for_edition(year)[0] for q in edition_questions(year)]
    return {k: seen.count(k) for k in STATUSES}


def _counts_table(got: dict[str, Answered]) -> str:
    """The header's counts: one column per edition (its questions, each with the status it has for that edition)."""
    per = {y: status_counts(got, y) for y in EDITIONS}
    head = "".join(f"<th>{y} ({sum(c.values())} answers)</th>" for y, c in per.items())
    rows = "".join(
        f"<tr><td>{html.escape(STATUSES[k])}</td>" + "".join(f"<td>{per[y][k]}</td>" for y in EDITIONS) + "</tr>"
        for k in STATUSES
    )
    return f'<table class="statuses"><tr><th>status</th>{head}</tr>{rows}</table>'


def render(profile: str, data_dir: Path | None = None) -> str:
    """The whole page as HTML text; each question answered once, in the first edition that asks it, and listed in the
    map of every edition that asks it."""
    folder = default_folder() if data_dir is None else Path(data_dir)
    saved = Saved(folder, profile)
    got = {q.number: answer(q, saved) for q in QUESTIONS}
    body = [part for year in EDITIONS for part in _edition(year, got)]
    devices = sorted({str(r.provenance.get("device")) for r in saved.used.values()}) or [machine_facts()["device"]]
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    toc = " · ".join(f'<a href="#e{y}">{y}</a> (<a href="#map{y}">map</a>)' for y in EDITIONS)
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Answers on this machine</title>'
        f"<style>{STYLE}</style></head><body><h1>The course's questions, answered on this machine</h1>"
        f"<p>Device: <b>{html.escape(', '.join(devices))}</b>; profile: <b>{html.escape(profile)}</b>; results "
        f"read from <code>{html.escape(shown(folder))}/</code>; page built {now}. {len(QUESTIONS)} answers; per "
        f"edition, each as that edition's handout sees it:</p>{_counts_table(got)}<p>Comparisons name a difference "
        f"only with at least {MIN_PAIRS} paired samples and a 95% interval of the paired ratio beyond the noise (1, or "
        "the spread of identical configurations where the run has them). Published references are measurements "
        "made elsewhere, cited by source; they are not ours. Each edition opens with a map from its handout's "
        "problem ids to the answers and the "
        "notebook sections.</p>"
        f'<p><a href="index.html">All writeups</a> · editions: {toc}</p>{"".join(body)}'
        f"<h2>Saved results read</h2>{_sources(saved)}</body></html>\n"
    )


def write_page(out_path: Path, profile: str, data_dir: Path | None = None) -> None:
    """Write the answers page (self-contained HTML, links relative to the other writeups) for this machine's results
    of `profile` (data_dir: default data/local/<this device>/)."""
    if profile not in ("cpu", "gpu"):
        raise ValueError(f"profile must be 'cpu' or 'gpu', got {profile!r}")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(render(profile, data_dir), encoding="utf-8")
