"""What a notebook section shows: the Result its experiment function returns (table, figure, notes, where it was
saved) and the source of the implementation it measured, highlighted and folded.

    r = ddp.speed_section(CONFIG, budget)     # plans, runs, checks its physical bounds, saves: one Result
    r                                        # notes, then the table, then the figure (in JupyterLab and the pages)
    assert r.values["overlap_ratio"] < 1     # the section's claim, read from the same values as the notes

    source(DDPBucketed)                      # the class's code, as it ran: folded under "source: helpers/ddp.py"

A note that states a result is made from the same numbers as the table beside it (never typed into markdown);
`values` carries the numbers a cell's asserts read.
"""

from __future__ import annotations

import html
import inspect
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Result:
    """A notebook section's outcome: `table` (a DataFrame or a Styler), `figure` (matplotlib, or None), `notes`
    (sentences generated from the same values), `saved` (the results file, or None) and `values` (named numbers
    for the cell's asserts)."""

    table: object = None
    figure: object = None
    notes: list[str] = field(default_factory=list)
    saved: Path | None = None
    values: dict = field(default_factory=dict)

    def _parts_html(self) -> list[str]:
        parts = [f"<p>{html.escape(n)}</p>" for n in self.notes]
        if self.table is not None:
            table = self.table.to_html() if hasattr(self.table, "to_html") else html.escape(str(self.table))
            parts.append(table)
        if self.figure is not None:
            parts.append(_figure_html(self.figure))
        if self.saved is not None:
            parts.append(f"<p><small>saved: <code>{html.escape(_relative(self.saved))}</code></small></p>")
        return parts

    def _repr_html_(self) -> str:
        return "\n".join(self._parts_html())

    def __init_subclass__(cls, **kwargs):
        """A subclass keeps this plain-text view (text/plain, which the writeup's left-out notes read): set before
        its own @dataclass runs, which then leaves __repr__ alone instead of writing a dump of every field."""
        super().__init_subclass__(**kwargs)
        if "__repr__" not in cls.__dict__:
            cls.__repr__ = Result.__repr__

    def __repr__(self) -> str:
        lines = list(self.notes)
        if self.table is not None:
            data = getattr(self.table, "data", self.table)  # a Styler's frame
            lines.append(data.to_string() if hasattr(data, "to_string") else str(data))
        if self.saved is not None:
            lines.append(f"saved: {_relative(self.saved)}")
        return "\n".join(lines)


def _figure_html(fig) -> str:
    """A matplotlib figure as an embedded PNG (the pages load nothing from the network); closed afterwards, so a
    notebook does not draw it a second time."""
    import base64
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", dpi=100)
    plt.close(fig)
    return f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}"/>'


def _relative(path) -> str:
    """`path` relative to the repository root when inside it (pages never show a clone's absolute path)."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


@dataclass
class Source:
    """The code of one or more functions or classes, as `inspect` reads it from the running package."""

    objects: tuple

    def blocks(self) -> list[tuple[str, str]]:
        """(where, code) per object: 'helpers/ddp.py · DDPBucketed', and the source text."""
        out = []
        for obj in self.objects:
            target = inspect.unwrap(getattr(obj, "fn", obj))  # Triton's JITFunction keeps it in .fn; decorators
            name = getattr(target, "__qualname__", getattr(target, "__name__", repr(target)))
            out.append((f"{_relative(inspect.getsourcefile(target))} · {name}", inspect.getsource(target)))
        return out

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        fmt = HtmlFormatter(noclasses=True, nobackground=True)  # inline styles: the page needs no stylesheet
        return "\n".join(
            f'<details class="source"><summary>source: <code>{html.escape(where)}</code></summary>'
            f"{highlight(code, PythonLexer(), fmt)}</details>"
            for where, code in self.blocks()
        )

    def __repr__(self) -> str:
        return "\n\n".join(f"# {where}\n{code}" for where, code in self.blocks())


def source(*objects) -> Source:
    """Show the code of `objects` (functions, classes, Triton kernels) in a cell: highlighted and folded in
    JupyterLab and on the exported page, plain text elsewhere. It is read from the package that ran, never copied."""
    if not objects:
        raise ValueError("source() needs at least one function or class")
    return Source(objects)
