"""writeups/yours.html: the last `yours` run's checks and side-by-side rows, from the saved results (offline HTML)."""

from __future__ import annotations

import html
from pathlib import Path

from helpers.course.yours.report import (
    DIFFERS,
    RAISES,
    beyond_counts,
    beyond_name,
    readable_rows,
    shown_status,
    summary,
    why_not_required,
)
from helpers.results import load_results

STATUS_COLOUR = {
    "pass": "#1a7f37",
    "fail": "#cf222e",
    "error": "#cf222e",
    "not implemented": "#6e7781",
    "skipped": "#6e7781",
    "needs a GPU": "#9a6700",
    "needs another Triton": "#9a6700",
    DIFFERS: "#0969da",  # beyond the handout: information, never red
    RAISES: "#0969da",
}
STYLE = """body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem}
td,th{padding:.25rem .6rem;text-align:left;vertical-align:top;border-bottom:1px solid #ddd}
td.num{text-align:right;font-variant-numeric:tabular-nums}.bar{background:#8ab4f8;height:.8rem;display:inline-block}
.detail{font-size:.9em;color:#333}details{margin:.4rem 0}summary{cursor:pointer}.why{font-size:.9em;color:#57606a}"""


def _ratio_bar(ratio: float, low: float, high: float) -> str:
    """A CSS bar of the ratio (log scale, 1x in the middle) with its interval in words."""
    import math

    width = max(1.0, min(100.0, 50 + 25 * math.log2(max(ratio, 1e-3))))
    return f"<span class='bar' style='width:{width:.0f}px'></span> {ratio:.2f}x <small>[{low:.2f}, {high:.2f}]</small>"


def _checks_table(rows: list[dict]) -> str:
    """The checks within the handout: pass / fail / error, what differed."""
    e = html.escape
    out = ["<table><tr><th>implementation</th><th>property</th><th>status</th><th>what differed</th></tr>"]
    for r in rows:
        colour = STATUS_COLOUR.get(r["status"], "#000")
        out.append(
            f"<tr><td>{e(r['impl'])}</td><td>{e(r['prop'])}</td><td style='color:{colour}'><b>{e(r['status'])}</b>"
            f"</td><td class='detail'>{e(r.get('detail') or '')}</td></tr>"
        )
    return "".join(out) + "</table>"


def _beyond_group(topic: str, rows: list[dict]) -> str:
    """One topic's probes beyond the handout, folded under their counts: each in a neutral word (differs, raises),
    why the handout does not require it, and what was seen."""
    e = html.escape
    out = [
        f"<details><summary><b>{e(topic)}</b>: {e(beyond_counts(rows))}</summary><table><tr><th>implementation</th>"
        "<th>probe</th><th>reads</th><th>why it is not required</th><th>what was seen</th></tr>"
    ]
    for r in rows:
        word = shown_status(r)
        out.append(
            f"<tr><td>{e(r['impl'])}</td><td>{e(beyond_name(r))}</td><td style='color:"
            f"{STATUS_COLOUR.get(word, '#000')}'><b>{e(word)}</b></td><td class='why'>{e(why_not_required(r))}</td>"
            f"<td class='detail'>{e(r.get('detail') or '')}</td></tr>"
        )
    return "".join(out) + "</table></details>"


def render(checks, rows, provenance: dict, data_dir: Path | None = None) -> str:
    """The page's HTML from the checks' rows and the side-by-side rows."""
    e = html.escape
    python = provenance.get("student_python")
    head = (
        f"Device <b>{e(str(provenance.get('device', '?')))}</b>, profile <b>{e(str(provenance.get('profile')))}"
        f"</b>, {e(str(provenance.get('date', ''))[:16])}, commit {e(str(provenance.get('commit')))[:10]}; "
        f"adapters: <code>{e(str(provenance.get('adapters', '?')))}</code>"
        + (f"; your code ran with <code>{e(str(python))}</code>" if python else "")
    )
    text, ok = summary(checks)
    out = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Yours beside ours</title><style>{STYLE}</style>"
        f"</head><body><h1>Yours beside ours</h1><p>{head}</p>",
        f"<p><b style='color:{'#1a7f37' if ok else '#cf222e'}'>{e(text)}.</b> What counts is what your edition's "
        "handout and tests promise (shapes, dtypes, models); every bound is derived from the dtype and the number of "
        "terms summed (helpers/course/yours/numerics.py says how). A failure names where, by how much, against which "
        "bound, and the likely mistake when every output matches its signature. The probes beyond the handout are "
        "further down: they never change the verdict.</p>",
    ]
    for topic in dict.fromkeys(r["topic"] for r in checks):
        within = [r for r in checks if r["topic"] == topic and not r.get("beyond")]
        out.append(f"<h2>{e(topic)}</h2>{_checks_table(within)}")
        shown = [r for r in rows if r.get("topic") == topic]
        if shown:
            out.append(
                "<h3>Side by side</h3><table><tr><th>who</th><th>implementation</th><th>measure</th>"
                "<th>value</th><th>ratio (95% interval)</th><th>note</th></tr>"
            )
            for r, t in zip(shown, readable_rows(shown).to_dict(orient="records"), strict=True):
                bar = _ratio_bar(r["ratio"], r["ratio_low"], r["ratio_high"]) if t["ratio [95% interval]"] else ""
                out.append(
                    f"<tr><td>{e(str(t['who']))}</td><td>{e(str(t['impl']))}</td><td>{e(str(t['measure']))}"
                    f"</td><td class='num'>{e(t['value'])}</td><td>{bar}</td>"
                    f"<td class='detail'>{e(t['note'])}</td></tr>"
                )
            out.append("</table>")
    beyond = [r for r in checks if r.get("beyond")]
    if beyond:
        out.append(
            "<h2 id='beyond'>Beyond the handout</h2><p>Information, not a verdict: probes of what the handout leaves "
            "open (other lengths, 4-D inputs, 16-bit dtypes, unused parameters, buffers, memory formulas). "
            f"<b>{DIFFERS}</b> means your code's result is not the reference's there (float64, one process, our "
            f"formula), <b>{RAISES}</b> that it raised; each row says why the handout does not require it. Open a "
            "topic to read them.</p>"
        )
        for topic in dict.fromkeys(r["topic"] for r in beyond):
            out.append(_beyond_group(topic, [r for r in beyond if r["topic"] == topic]))
    folder = str(data_dir) if data_dir else "data/local/&lt;device&gt;"
    out.append(
        f"<p>Made by <code>python -m helpers yours</code>; the rows are in {e(folder) if data_dir else folder}/"
        "yours_checks.jsonl and yours_rows.jsonl.</p></body></html>"
    )
    return "\n".join(out)


def saved(data_dir: Path | None = None):
    """(checks, rows, provenance) of the last saved run; FileNotFoundError when there is none."""
    checks = load_results(Path(data_dir) / "yours_checks.jsonl" if data_dir else "yours_checks")
    rows = load_results(Path(data_dir) / "yours_rows.jsonl" if data_dir else "yours_rows")
    return checks.rows, rows.rows, checks.provenance


def has_saved_run(data_dir: Path | None = None) -> bool:
    """Whether this machine has a saved `yours` run (the writeup then links yours.html from its index)."""
    try:
        saved(data_dir)
    except FileNotFoundError:
        return False
    return True


def write_page(out_path: Path, profile: str = "cpu", data_dir: Path | None = None) -> None:
    """Write yours.html from the last saved `yours` run (profile is the writeup's; the run's own is on the page)."""
    checks, rows, prov = saved(data_dir)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(render(checks, rows, prov, data_dir), encoding="utf-8")
