"""A calculator that needs no kernel and no network (notebooks 05 and 07): every combination of its inputs is
computed here, in Python, once (the Python function stays the only source of the numbers); the page carries them as a
compact grid, and a few lines of inline JavaScript assemble the current choice's table, in JupyterLab and in the
exported HTML writeup alike.

    calc = Calculator(zero_table, {"model": ["small", "xl"], "world_size": [1, 2, 4, 8, 16],
                                   "precision": ["mixed", "fp32"]},
                      title="ZeRO model states per rank", note="GB = 10⁹ bytes", default={"model": "xl"})
    calc                              # a cell's last expression: the HTML block
    calc.table(world_size=8)          # one choice's DataFrame (the other inputs at their default), for asserts
    Calculator(strategies_table, {..., "gpu_bytes": {"80 GB": 80e9, "141 GB": 141e9}},
               names={"gpu_bytes": "GPU memory"})   # labels shown instead of values, a name instead of the keyword

A list of numbers becomes a slider over its *positions* (1, 2, 4, ..., 1024 get evenly spaced stops) showing the
current value; anything else a drop-down. Choices given as {label: value} show the label, e.g. {"80 GB": 80e9}.
The HTML: root `<div class="calc">`, one control per input with `data-input="<keyword>"`, the table in
`<div class="calc-output">`; the table follows every `input` and `change` event of the controls.

The compact grid (`page_grid`): each combination's table HTML is cut at its tags into pieces. Where every table has
the same number of pieces (the same layout, other numbers), each piece is stored once over only the inputs it depends
on (a column that depends on the model alone is stored once per model, not once per combination) and constant runs of
pieces as one string; tables of different layouts are stored whole, each distinct one once. 825 combinations of
notebook 07's strategies calculator were 0.7 MB of precomputed tables; as a grid they are a few dozen kB.
"""

from __future__ import annotations

import html
import inspect
import itertools
import json
import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real

import numpy as np
import pandas as pd

MAX_COMBINATIONS = 5000  # every combination's table is computed here (the page's grid grows with what varies)

SCRIPT = """(function () {
  var root = (document.currentScript && document.currentScript.closest(".calc")) || document.getElementById(%(id)s);
  var data = %(data)s;
  var controls = root.querySelectorAll("[data-input]");
  var output = root.querySelector(".calc-output");
  function piece(part, positions) {
    if (typeof part === "string") { return part; }
    var flat = 0;
    part[0].forEach(function (axis) { flat = flat * data.sizes[axis] + positions[axis]; });
    return data.pool[part[1][flat]];
  }
  function update() {
    var positions = [];
    controls.forEach(function (control, i) {
      positions.push(Number(control.value));
      var shown = control.parentNode.querySelector("output");
      if (shown) { shown.textContent = data.labels[i][positions[i]]; }
    });
    output.innerHTML = data.parts.map(function (part) { return piece(part, positions); }).join("");
  }
  controls.forEach(function (control) {
    control.addEventListener("input", update);
    control.addEventListener("change", update);
  });
})();"""


@dataclass(frozen=True)
class Choices:
    """One input of a calculator: the keyword it fills, the labels shown and the values passed."""

    name: str
    labels: tuple
    values: tuple

    @property
    def numeric(self) -> bool:
        """Numbers get a slider over their positions; anything else a drop-down."""
        return all(isinstance(v, Real) and not isinstance(v, bool) for v in self.values)

    def position(self, value) -> int:
        """Where `value` sits among the choices, or a ValueError naming them."""
        for i, v in enumerate(self.values):
            if v == value:
                return i
        raise ValueError(f"{value!r} is not a choice of {self.name!r}; choose one of {list(self.values)}")


def choices(name: str, given) -> Choices:
    """A Choices from a list of values (shown as str(value)) or a {label: value} dict."""
    values = list(given.values() if isinstance(given, dict) else given)
    labels = [str(label) for label in given]
    if not values:
        raise ValueError(f"input {name!r} has no choices; give at least one")
    if len(set(labels)) < len(labels):
        raise ValueError(f"input {name!r} shows the same label twice: {labels}")
    return Choices(name, tuple(labels), tuple(values))


def _check_signature(fn: Callable, inputs: list[Choices]) -> None:
    """The inputs must be exactly keywords `fn` accepts, and cover every argument it requires."""
    try:
        inspect.signature(fn).bind(**{c.name: c.values[0] for c in inputs})
    except TypeError as e:
        raise ValueError(
            f"the inputs {[c.name for c in inputs]} do not fit {getattr(fn, '__name__', fn)}"
            f"{inspect.signature(fn)}: {e}"
        ) from None


def evaluate(fn: Callable, kwargs: dict):
    """fn(**kwargs), which must be a DataFrame, a Styler, or rows as plain data ({row label: {column: value}}, shown
    with floats to 3 decimals); the failing combination is named otherwise."""
    try:
        result = fn(**kwargs)
    except Exception as e:
        raise ValueError(f"{getattr(fn, '__name__', fn)}(**{kwargs}) failed: {e}") from e
    if isinstance(result, dict) and all(isinstance(row, dict) for row in result.values()):
        result = pd.DataFrame.from_dict(result, orient="index").round(3)
    if not isinstance(result, pd.DataFrame) and not isinstance(getattr(result, "data", None), pd.DataFrame):
        raise TypeError(
            f"{getattr(fn, '__name__', fn)}(**{kwargs}) returned a {type(result).__name__}; a calculator "
            "shows pandas DataFrames, Stylers or {row: {column: value}} dicts"
        )
    return result


def page_grid(tables: list[str], sizes: list[int]) -> dict:
    """The page's data for one table per combination (row-major, the last input fastest): the pieces every table
    shares as plain strings, and each piece that varies as [the inputs it depends on, indices into a pool of distinct
    strings over just those inputs]. `grid_table` (and the page's script) puts a combination's table back together."""
    if len(tables) != math.prod(sizes):
        raise ValueError(f"{len(tables)} tables for {' × '.join(map(str, sizes))} = {math.prod(sizes)} combinations")
    cut = [re.split(r"(<[^>]*>)", t) for t in tables]  # text, tag, text, ...: the layout is the tags
    if len({len(pieces) for pieces in cut}) > 1:
        cut = [[t] for t in tables]  # layouts differ: each table whole (each distinct one once in the pool)
    pool: dict[str, int] = {}
    parts: list = []
    for column in zip(*cut, strict=True):  # one piece, across every combination
        grid = np.array(column, dtype=object).reshape(sizes)
        axes = [a for a in range(grid.ndim) if (grid != grid.take([0], axis=a)).any()]  # the inputs it depends on
        if not axes:
            if parts and isinstance(parts[-1], str):
                parts[-1] += column[0]  # a run of constant pieces: one string
            else:
                parts.append(column[0])
            continue
        over = grid[tuple(slice(None) if a in axes else 0 for a in range(grid.ndim))]  # only those inputs' axes
        parts.append([axes, [pool.setdefault(text, len(pool)) for text in over.ravel()]])
    return {"sizes": list(sizes), "pool": list(pool), "parts": parts}


def grid_table(grid: dict, positions) -> str:
    """The table HTML of the combination at `positions` from page_grid's data, as the page's script assembles it."""
    out = []
    for part in grid["parts"]:
        if isinstance(part, str):
            out.append(part)
            continue
        axes, indices = part
        flat = 0
        for axis in axes:
            flat = flat * grid["sizes"][axis] + positions[axis]
        out.append(grid["pool"][indices[flat]])
    return "".join(out)


class Calculator:
    """fn's table for every combination of the inputs' choices, picked in the page by a control per input."""

    def __init__(
        self,
        fn: Callable,
        inputs: dict,
        *,
        title: str = "",
        note: str = "",
        default: dict | None = None,
        names: dict | None = None,
    ):
        if not inputs:
            raise ValueError("a calculator needs at least one input: {keyword: [choices]}")
        self.fn, self.title, self.note = fn, title, note
        self.inputs = [choices(name, given) for name, given in inputs.items()]
        _check_signature(fn, self.inputs)
        self.names = {c.name: c.name.replace("_", " ") for c in self.inputs}  # each control's label on the page
        if set(names or {}) - set(self.names):
            raise ValueError(
                f"names given for {sorted(set(names) - set(self.names))}, which are not inputs; "
                f"the inputs are {list(self.names)}"
            )
        self.names.update(names or {})
        count = math.prod(len(c.values) for c in self.inputs)
        if count > MAX_COMBINATIONS:
            raise ValueError(
                f"{' × '.join(str(len(c.values)) for c in self.inputs)} = {count} combinations of "
                f"{[c.name for c in self.inputs]} is more than the {MAX_COMBINATIONS} a page holds; "
                "offer fewer choices"
            )
        self.start = self._positions(default or {}, (0,) * len(self.inputs))
        combos = list(itertools.product(*(range(len(c.values)) for c in self.inputs)))  # row-major, last fastest
        self.results = {positions: evaluate(fn, self._kwargs(positions)) for positions in combos}
        self.html = [re.sub(r">\s+<", "><", self.results[p].to_html()) for p in combos]  # no indentation
        self.grid = page_grid(self.html, [len(c.values) for c in self.inputs])  # what the page carries

    def _positions(self, choice: dict, base: tuple) -> tuple:
        """Each input's position: the one `choice` names, else the one in `base`."""
        unknown = set(choice) - {c.name for c in self.inputs}
        if unknown:
            raise ValueError(f"no input named {sorted(unknown)}; the inputs are {[c.name for c in self.inputs]}")
        return tuple(
            c.position(choice[c.name]) if c.name in choice else p for c, p in zip(self.inputs, base, strict=True)
        )

    def _flat(self, positions: tuple) -> int:
        """The combination's number in row-major order (the last input fastest), as the page's script counts."""
        flat = 0
        for c, p in zip(self.inputs, positions, strict=True):
            flat = flat * len(c.values) + p
        return flat

    def _kwargs(self, positions: tuple) -> dict:
        """The keyword arguments fn gets for these positions."""
        return {c.name: c.values[p] for c, p in zip(self.inputs, positions, strict=True)}

    def table(self, **choice) -> pd.DataFrame:
        """The DataFrame shown for `choice` (inputs it leaves out at their default)."""
        result = self.results[self._positions(choice, self.start)]
        return result if isinstance(result, pd.DataFrame) else result.data  # a Styler's data

    def _control(self, c: Choices, position: int, control_id: str) -> str:
        """One input's label and control: a slider over positions with its value beside it, or a drop-down."""
        label = f'<label for="{control_id}">{html.escape(self.names[c.name])}</label> '
        attrs = f'id="{control_id}" data-input="{html.escape(c.name)}" autocomplete="off"'
        if c.numeric:
            return (
                f'<span class="calc-field">{label}<input type="range" {attrs} min="0" max="{len(c.values) - 1}" '
                f'step="1" value="{position}"> <output for="{control_id}">{html.escape(c.labels[position])}'
                "</output></span>"
            )
        options = "".join(
            f'<option value="{i}"{" selected" if i == position else ""}>{html.escape(text)}</option>'
            for i, text in enumerate(c.labels)
        )
        return f'<span class="calc-field">{label}<select {attrs}>{options}</select></span>'

    def _repr_html_(self) -> str:
        """The block: title, controls, the default choice's table, the note, and the script that assembles tables."""
        uid = f"calc-{uuid.uuid4().hex[:12]}"  # fresh per rendering: no two blocks on a page share an id
        controls = "".join(
            self._control(c, p, f"{uid}-{i}") for i, (c, p) in enumerate(zip(self.inputs, self.start, strict=True))
        )
        data = {**self.grid, "labels": [list(c.labels) for c in self.inputs]}
        script = SCRIPT % {
            "id": json.dumps(uid),
            "data": json.dumps(data, separators=(",", ":")).replace("<", "\\u003c"),
        }
        title = f'<div class="calc-title"><strong>{html.escape(self.title)}</strong></div>' if self.title else ""
        note = f'<div class="calc-note" style="font-size: 0.9em">{html.escape(self.note)}</div>' if self.note else ""
        shown = self.html[self._flat(self.start)]  # the default's table, before any script runs
        return (
            f'<div class="calc" id="{uid}">{title}'
            f'<div class="calc-inputs" style="display: flex; flex-wrap: wrap; gap: 0.4em 2em; margin: 0.4em 0">'
            f'{controls}</div><div class="calc-output">{shown}</div>{note}<script>{script}</script></div>'
        )

    def __repr__(self) -> str:
        """What it computed, for a plain-text display."""
        return (
            f"Calculator({getattr(self.fn, '__name__', self.fn)}, {len(self.html)} combinations, "
            f"{len(self.grid['pool'])} distinct pieces in the page)"
        )
