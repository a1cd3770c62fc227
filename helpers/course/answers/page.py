"""The answers page itself: every edition's questions grouped by edition and problem, each answer with where its
details are, the published figures and the GPU line its measurement chose; then the saved results it read."""
from __future__ import annotations

import html
import re
from datetime import datetime, timezone
from pathlib import Path

from helpers.course.answers.core import QUESTIONS, Answered, Question, Saved, answer, shown
from helpers.env import machine_facts
from helpers.results import DATA_DIR, device_slug

NOTEBOOKS = {"01": "01_benchmarking_and_profiling", "02": "02_rmsnorm_triton", "03": "03_collectives",
             "04": "04_ddp", "05": "05_optimizer_state_sharding", "06": "06_flash_attention",
             "07": "07_fsdp"}  # number -> file stem (and writeup page)
EDITIONS = {  # year -> (title, what it kept from the one before, as a note)
    2024: ("2024 edition: profiling, kernels, data-parallel training (numbered as the reference writeup numbers them)",
           ""),
    2025: ("2025 edition: FlashAttention-2, communication accounting",
           "DDP (bucketed included) and optimizer-state sharding are as in 2024: 3.3.1 to 3.4.5 above answer them. "
           "RMSNorm in Triton is replaced by FlashAttention-2."),
    2026: ("2026 edition: activation checkpointing, FSDP, the parallelism calculators",
           "Attention and FlashAttention-2 are as in 2025: the shared problems are listed again here with the same "
           "answer. Bucketed DDP is removed; the hardware in the handout is a B200."),
}
SECTIONS_2024 = {"2": "Single-device performance: timing, profiling, mixed precision, norms, kernels, compilation, "
                      "memory",
                 "3": "Distributed data-parallel training: collectives, DDP variants, buckets, optimizer-state sharding"}


def default_folder() -> Path:
    """This machine's results: data/local/<device>/."""
    return DATA_DIR / "local" / device_slug(machine_facts()["device"])


def _code(text: str) -> str:
    """HTML-escaped text with `code` spans."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


def _reference_runs(q: Question) -> str:
    """A line naming the reference runs (data/reference/<device>/) of what the answer reads, by device and date."""
    from helpers.results import reference_rows

    runs = []
    for name in q.reads:
        ref = reference_rows(name)
        for (device, date, profile), _ in ref.groupby(["device", "date", "profile"]) if len(ref) else ():
            runs.append(f"<code>{html.escape(name)}</code> on {html.escape(str(device))} ({html.escape(str(date))}, "
                        f"profile {html.escape(str(profile))})")
    return f"<li>reference runs beside this one: {'; '.join(runs)}</li>" if runs else ""


def _entry(q: Question, got: Answered, year: int) -> str:
    """One answer: number, question, answer, where the details are, the published figures, the GPU line."""
    page = f"{NOTEBOOKS[q.notebook]}.html"
    refs = "".join(f"<li>published reference ({html.escape(r.source)}): {_code(r.value)}</li>" for r in q.references)
    reads = ", ".join(f"<code>{html.escape(n)}</code>" for n in q.reads) or "nothing saved: computed, the same anywhere"
    shared = (f"; also in the {' and '.join(str(y) for y in q.editions if y != year)} edition"
              if len(q.editions) > 1 else "")
    return (f'<div class="q{"" if got.measured else " missing"}" id="q{year}-{html.escape(q.number)}">'
            f'<p class="ask"><b>{html.escape(q.number)}</b> {_code(q.ask)}</p>'
            f'<p class="ans">{_code(got.text)}</p><ul class="meta">'
            f'<li>details: <a href="{page}">notebook {q.notebook}</a>, {html.escape(q.section)}; reads {reads}'
            f"{shared}</li>{refs}{_reference_runs(q)}<li>on a GPU: {_code(got.gpu)}</li></ul></div>")


STYLE = """body{font:15px/1.5 system-ui,sans-serif;max-width:62rem;margin:2rem auto;padding:0 1rem;color:#222}
h1{font-size:1.5rem}h2{font-size:1.25rem;border-bottom:2px solid #999;margin-top:2.4rem}
h3{font-size:1.05rem;margin:1.4rem 0 .3rem}h4{font-size:1rem;margin:1.1rem 0 .3rem}
.q{margin:.6rem 0 1rem;padding-left:.8rem;border-left:3px solid #4a7}.q.missing{border-color:#c94}
.ask{margin:0}.ans{margin:.2rem 0}.meta{margin:.1rem 0;font-size:13px;color:#555}code{background:#f3f3f3;padding:0 .2em}
.note{color:#555}table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:.15rem .5rem;
text-align:left}"""


def _sources(saved: Saved) -> str:
    """The saved results the answers read: file, device, profile, date, commit."""
    rows = "".join(f"<tr><td><code>{html.escape(name)}.jsonl</code></td><td>{html.escape(str(r.label))}</td>"
                   f"<td>{html.escape(str(r.provenance.get('commit')))}</td></tr>"
                   for name, r in sorted(saved.used.items()))
    return ("<table><tr><th>result</th><th>device · profile · date</th><th>commit</th></tr>" + rows + "</table>"
            if rows else "<p>No saved results were found for this profile.</p>")


def _edition(year: int, got: dict[str, Answered]) -> list[str]:
    """One edition's part of the page: its problems in order, each with its questions."""
    title, note = EDITIONS[year]
    body = [f'<h2 id="e{year}">{html.escape(title)}</h2>'] + ([f'<p class="note">{_code(note)}</p>'] if note else [])
    group, section = None, None
    for q in (q for q in QUESTIONS if year in q.editions):
        if year == 2024 and q.number[0] != section:
            section = q.number[0]
            body.append(f"<h3>{section} · {html.escape(SECTIONS_2024[section])}</h3>")
        if q.group != group:
            group = q.group
            label = f"{html.escape(q.group)} " if year == 2024 else ""
            body.append(f"<h4>{label}<code>{html.escape(q.problem)}</code></h4>")
        body.append(_entry(q, got[q.number], year))
    return body


def render(profile: str, data_dir: Path | None = None) -> str:
    """The whole page as HTML text; each question answered once, shown under every edition that asks it."""
    folder = default_folder() if data_dir is None else Path(data_dir)
    saved = Saved(folder, profile)
    got = {q.number: answer(q, saved) for q in QUESTIONS}
    measured = sum(a.measured for a in got.values())
    body = [part for year in EDITIONS for part in _edition(year, got)]
    devices = sorted({str(r.provenance.get("device")) for r in saved.used.values()}) or [machine_facts()["device"]]
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    toc = " · ".join(f'<a href="#e{y}">{y}</a>' for y in EDITIONS)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Answers on this machine</title>'
            f"<style>{STYLE}</style></head><body><h1>The course's questions, answered on this machine</h1>"
            f"<p>Device: <b>{html.escape(', '.join(devices))}</b>; profile: <b>{html.escape(profile)}</b>; results "
            f"read from <code>{html.escape(shown(folder))}/</code>; page built {now}. {measured} of {len(QUESTIONS)} "
            "answers come from results saved on this machine (or are computed, the same anywhere); the others say "
            "what to run. Comparisons name a faster side only when the 95% interval of the paired ratio excludes 1. "
            "Published references are measurements made elsewhere, cited by source; they are not ours.</p>"
            f'<p><a href="index.html">All writeups</a> · editions: {toc}</p>{"".join(body)}'
            f"<h2>Saved results read</h2>{_sources(saved)}</body></html>\n")


def write_page(out_path: Path, profile: str, data_dir: Path | None = None) -> None:
    """Write the answers page (self-contained HTML, links relative to the other writeups) for this machine's results
    of `profile` (data_dir: default data/local/<this device>/)."""
    if profile not in ("cpu", "gpu"):
        raise ValueError(f"profile must be 'cpu' or 'gpu', got {profile!r}")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(render(profile, data_dir), encoding="utf-8")
