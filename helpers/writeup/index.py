"""The writeups' front page (writeups/index.html): per notebook its headline figure, one measured sentence, run time,
status and what the time budget left out; the machine and profile; the extra pages first.
"""

from __future__ import annotations

import html
import re
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

from helpers.writeup.kernel import ANSI_COLOUR


def _link(entry: dict, out_dir: Path) -> str:
    """A link to the entry's page, or its bare title when no page was written."""
    title = html.escape(entry["title"])
    return f"<a href='{html.escape(entry['html'])}'>{title}</a>" if (out_dir / entry["html"]).exists() else title


def _status(entry: dict) -> str:
    """'ok', or 'FAILED: why' escaped for HTML."""
    return "ok" if entry["error"] is None else "FAILED: " + html.escape(entry["error"])


HEADLINE_TAG = "headline"  # the cell whose plot stands for its notebook on the front page
LEFT_OUT = "not timed here (budget)"  # how helpers.budget's notes begin (Plan.note)
LEFT_OUT_LINES = (
    LEFT_OUT,
    "left out of the seed's grid here:",
    "rmsnorm_triton is left out",
    "Triton is not timed here",
    "not timed on ",
)  # how the notebooks' printed notes of a cut begin
Front = Callable[[str, str], str]  # front(notebook file name, profile) -> one HTML sentence from its saved results


EMBEDDED_PNG = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=\s]+)"')  # a Result's figure, inside its HTML


def headline_figure(nb) -> str | None:
    """The base64 PNG of the first image in the outputs of the cell tagged `headline` (a plain figure, or the one a
    helpers.section.Result embeds in its HTML), or None."""
    for cell in nb.cells:
        if cell.cell_type == "code" and HEADLINE_TAG in cell.get("metadata", {}).get("tags", []):
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                png = data.get("image/png")
                embedded = EMBEDDED_PNG.search("".join(data.get("text/html", "")))
                if png or embedded:
                    return "".join((png or embedded.group(1)).split())
    return None


def left_out_notes(nb) -> list[str]:
    """Each distinct line of the notebook's printed output that says what this run left out (the time budget's
    notes, the profile's cuts), in order."""
    notes = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            stream = out.get("output_type") == "stream"
            text = out.get("text", "") if stream else out.get("data", {}).get("text/plain", "")
            for line in ANSI_COLOUR.sub("", "".join(text)).splitlines():
                line = line.lstrip("- ").strip()
                if line.startswith(LEFT_OUT_LINES) and not line.endswith(": nothing") and line not in notes:
                    notes.append(line)
    return notes


INDEX_CSS = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}
ul.pages{font-size:1.15rem} section.nb{display:flex;gap:1.2rem;border-top:1px solid #ddd;padding:1rem 0}
section.nb figure{margin:0;flex:0 0 18rem} section.nb img{width:18rem;border:1px solid #eee}
section.nb .nofig{width:18rem;height:6rem;display:flex;align-items:center;justify-content:center;color:#888;
background:#f6f6f6} section.nb h2{font-size:1.1rem;margin:0 0 .4rem} .claim{font-size:1.05rem}
.meta{color:#555;font-size:.9rem} .left-out{color:#7a4b00;font-size:.85rem} .failed{color:#b00}"""


def _front_section(entry: dict, out_dir: Path, sentence: str) -> str:
    """One notebook on the front page: headline figure, measured sentence, run time and status, what was left out."""
    figure = (
        f"<img class='headline' alt='headline plot of {html.escape(entry['notebook'])}' "
        f"src='data:image/png;base64,{entry['figure']}'>"
        if entry.get("figure")
        else "<div class='nofig'>no headline plot in this run</div>"
    )
    notes = entry.get("left_out") or []
    left = (
        "<ul class='left-out'>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"
        if notes
        else "<p class='left-out'>nothing left out</p>"
    )
    status = f"<span class='status{'' if entry['error'] is None else ' failed'}'>{_status(entry)}</span>"
    return (
        f"<section class='nb' data-notebook='{html.escape(entry['notebook'])}'><figure>{figure}</figure><div>"
        f"<h2>{_link(entry, out_dir)}</h2><p class='claim'>{sentence}</p>"
        f"<p class='meta'>{html.escape(entry['notebook'])} · ran in {entry['seconds']:.0f} s · {status}</p>"
        f"{left}</div></section>"
    )


def write_index(
    entries: list[dict],
    out_dir: Path,
    profile: str,
    pages: Sequence[dict] = (),
    budget: str = "auto",
    front: Front | None = None,
    edition: str = "auto",
) -> Path:
    """writeups/index.html: title, device, profile, edition and time budget, date, the extra pages first, then per
    notebook
    its headline figure, front(notebook, profile)'s measured sentence, run time, status and what the budget left
    out."""
    from helpers.env import machine_facts

    facts = machine_facts()
    budget_note = (
        ""
        if profile != "cpu" and budget == "auto"
        else f" (time budget {html.escape(str(budget))}: each notebook names what it left out and the command "
        "that runs it)"
    )
    edition_note = "each notebook's default" if edition == "auto" else f"{edition} (EDITION={edition})"
    extra = "\n".join(f"<li>{_link(p, out_dir)}{'' if p['error'] is None else ' · ' + _status(p)}</li>" for p in pages)
    sections = "\n".join(_front_section(e, out_dir, _sentence(front, e["notebook"], profile)) for e in entries)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>LLM systems companion: writeups</title>
<style>{INDEX_CSS}</style>
</head><body><h1>LLM systems companion: writeups</h1>
<p>Device: <b>{html.escape(facts["device"])}</b> ({facts["cpu_count"]} CPU cores, {facts["gpu_count"]} GPU(s));
profile: <b>{html.escape(profile)}</b>{budget_note}; edition: <b>{html.escape(edition_note)}</b>;
torch {facts["torch"]}, triton {facts["triton"]};
made {datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}.</p>
{f'<ul class="pages">{chr(10)}{extra}{chr(10)}</ul>' if pages else ""}
{sections}
</body></html>
"""
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def _sentence(front: Front | None, notebook: str, profile: str) -> str:
    """front's sentence for one notebook; its failure is shown in its place, not raised (the index is still
    written)."""
    if front is None:
        return ""
    try:
        return front(notebook, profile)
    except Exception as exc:  # a sentence builder's bug must not cost the whole index
        traceback.print_exc()
        return f"<span class='failed'>no sentence: {html.escape(type(exc).__name__)}: {html.escape(str(exc))}</span>"
