"""Execute every notebook and export HTML writeups: the engine behind `make writeup`.

    python -m helpers writeup                      # notebooks/*.ipynb -> writeups/*.html + index.html
    python -m helpers writeup --profile gpu        # inject PROFILE = "gpu" after each `parameters` cell
    python -m helpers writeup --budget 300         # inject BUDGET = "300": more time for the cpu profile's runs
    python -m helpers writeup --edition 2024       # inject EDITION = "2024": that handout's model, sizes and shapes
    python -m helpers writeup notebooks/00_setup.ipynb --hide-code
    python -m helpers writeup --adapters ../assignment2-systems/tests/adapters.py   # a "yours" row (ADAPTERS)

Parameters are injected the way papermill does it (a cell tagged
`injected-parameters` right after the cell tagged `parameters`), so papermill
runs the same notebooks too. A notebook that fails still gets its HTML, with
the error in place, and the command exits non-zero at the end.

The pages open offline: TeX in markdown becomes MathML at export (no MathJax),
plots are embedded, progress-bar widgets and tqdm's stderr noise are dropped,
code inputs are folded under a "code" toggle, and the clone's absolute path
is replaced by paths relative to the repository root. Extra pages (an answers
page, say) are built after the notebooks ran and linked first from the index.

The parts: helpers.writeup.kernel runs a notebook, .export writes its page, .index the front page; this module
is the command that runs them in order, and re-exports their names.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import helpers.kernel_watch  # noqa: F401  first: its import leaves out a grammar nbformat's jsonschema would build
from helpers.writeup.export import (
    CSS_COMMENT,
    LOADED_URL,
    OFFLINE_TEMPLATE,
    PROGRESS_BAR,
    WIDGET_VIEW,
    ExportError,
    MathError,
    MathMLRenderer,
    OfflineHTMLExporter,
    _without_progress_bars,
    export_html,
    network_references,
    notebook_title,
    offline_copy,
    relative_paths,
    tex_to_mathml,
)
from helpers.writeup.index import (
    HEADLINE_TAG,
    INDEX_CSS,
    LEFT_OUT,
    LEFT_OUT_LINES,
    Front,
    headline_figure,
    left_out_notes,
    write_index,
)
from helpers.writeup.kernel import (
    ANSI_COLOUR,
    ROOT,
    _ipc_folder,
    _this_python_kernel_manager,
    execute,
    inject_parameters,
)

__all__ = [
    "CSS_COMMENT",
    "LOADED_URL",
    "PROGRESS_BAR",
    "OFFLINE_TEMPLATE",
    "WIDGET_VIEW",
    "ExportError",
    "MathError",
    "MathMLRenderer",
    "OfflineHTMLExporter",
    "export_html",
    "network_references",
    "notebook_title",
    "offline_copy",
    "relative_paths",
    "tex_to_mathml",
    "HEADLINE_TAG",
    "INDEX_CSS",
    "LEFT_OUT",
    "LEFT_OUT_LINES",
    "Front",
    "headline_figure",
    "left_out_notes",
    "write_index",
    "ANSI_COLOUR",
    "ROOT",
    "execute",
    "inject_parameters",
    "ExtraPage",
    "run_notebook",
    "build_page",
    "main",
]
__all__ += ["_without_progress_bars", "_ipc_folder", "_this_python_kernel_manager"]  # tests check these parts directly


EDITIONS = ("2024", "2025", "2026")  # the course editions a build can run (the notebooks' EDITION parameter)
ExtraPage = tuple[str, str, Callable[[Path, str], None]]  # (title, filename, build(out_path, profile))


def run_notebook(path: Path, out_dir: Path, params: dict, *, hide_code: bool, timeout_s: int) -> dict:
    """Execute one notebook and export its page; the index entry (error set when a cell or the export failed)."""
    start = time.perf_counter()
    nb, error = execute(path, params, timeout_s)
    seconds = time.perf_counter() - start
    title = notebook_title(nb, path.stem)
    out = out_dir / (path.stem + ".html")
    try:
        export_html(nb, out, title, hide_code, notebook_dir=path.parent)
    except ExportError as exc:
        out.unlink(missing_ok=True)  # no stale page from an earlier run
        error = str(exc) if error is None else f"{error}; {exc}"
    return {
        "notebook": path.name,
        "title": title,
        "html": out.name,
        "seconds": seconds,
        "error": error,
        "figure": headline_figure(nb),
        "left_out": left_out_notes(nb),
    }


def build_page(title: str, filename: str, build: Callable[[Path, str], None], out_dir: Path, profile: str) -> dict:
    """Run one extra page's build(out_path, profile); its index entry, with the error if it raised or wrote nothing."""
    out = out_dir / filename
    start = time.perf_counter()
    try:
        build(out, profile)
        error = None if out.exists() else f"{filename} was not written"
    except Exception as exc:  # a builder's failure is reported in the index, like a failing notebook
        traceback.print_exc()
        error = f"{type(exc).__name__}: {exc}"
    if error is None:
        out.write_text(relative_paths(out.read_text(encoding="utf-8")), encoding="utf-8")
    return {"title": title, "html": filename, "seconds": time.perf_counter() - start, "error": error}


def main(argv: list[str] | None = None, extra_pages: Sequence[ExtraPage] = (), front: Front | None = None) -> int:
    """Execute notebooks in order, export one HTML page each, build `extra_pages`, write index.html; 1 if any failed.

    Each extra page is (title, filename, build) with build(out_path, profile) writing the page; they are built
    after the notebooks ran and linked first from the index. `front(notebook, profile)` gives each notebook's measured
    sentence on the index (the course floor reads the saved results; this module does not).
    """
    from helpers.budget import parse_budget
    from helpers.env import resolve_profile

    parser = argparse.ArgumentParser(prog="python -m helpers writeup", description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb in order")
    parser.add_argument("--profile", default="auto", help="auto | cpu | gpu (injected as PROFILE)")
    parser.add_argument(
        "--budget",
        default="auto",
        help="cpu profile: seconds each notebook's timed runs may take, "
        "or none (injected as BUDGET; auto: helpers.budget.DEFAULT_SECONDS)",
    )
    parser.add_argument(
        "--edition",
        default="auto",
        choices=("auto", *EDITIONS),
        help="the course edition whose model, sizes and shapes the notebooks run (injected as EDITION; auto: each "
        "notebook's default)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "writeups")
    parser.add_argument("--hide-code", action="store_true", help="leave code cells out of the HTML")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    parser.add_argument(
        "--adapters",
        type=Path,
        default=None,
        help="your tests/adapters.py, injected as ADAPTERS: notebooks add a 'yours' row",
    )
    args = parser.parse_args(argv)
    if args.adapters is not None and not args.adapters.is_file():
        raise ValueError(f"no adapters file at {args.adapters}: pass your assignment's tests/adapters.py")

    profile = resolve_profile(args.profile)
    if args.budget != "auto":
        parse_budget(args.budget)  # a one-line ValueError before any notebook runs
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    if not paths:
        print("no notebooks found", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    params = {} if args.profile == "auto" else {"PROFILE": profile}
    if args.adapters is not None:
        params["ADAPTERS"] = str(args.adapters.resolve())
    if args.budget != "auto":
        params["BUDGET"] = args.budget
    if args.edition != "auto":
        params["EDITION"] = args.edition
    entries, pages = [], []
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {path.name} (profile {profile}, edition {args.edition}) ...", flush=True)
        e = run_notebook(path, args.out, params, hide_code=args.hide_code, timeout_s=args.timeout)
        entries.append(e)
        print(
            f"    {'ok' if e['error'] is None else 'FAILED: ' + e['error']} in {e['seconds']:.0f} s "
            f"-> {args.out / e['html']}",
            flush=True,
        )
    for title, filename, build in extra_pages:
        pages.append(build_page(title, filename, build, args.out, profile))
        print(f"page {filename}: {'ok' if pages[-1]['error'] is None else 'FAILED: ' + pages[-1]['error']}", flush=True)
    index = write_index(entries, args.out, profile, pages, budget=args.budget, front=front, edition=args.edition)
    failed = [e["notebook"] for e in entries if e["error"]] + [p["html"] for p in pages if p["error"]]
    print(f"wrote {index}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
