"""Execute every notebook and export HTML writeups: the engine behind `make writeup`.

    python -m helpers writeup                      # notebooks/*.ipynb -> writeups/*.html + index.html
    python -m helpers writeup --profile gpu        # inject PROFILE = "gpu" after each `parameters` cell
    python -m helpers writeup --budget 300         # inject BUDGET = "300": more time for the cpu profile's runs
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
"""

from __future__ import annotations

import argparse
import copy
import html
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import nbformat
from jinja2 import DictLoader, pass_context
from latex2mathml.converter import convert as latex_to_mathml
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

from helpers.kernel_watch import KernelStderr

ROOT = Path(__file__).resolve().parent.parent
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
CSS_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
# tqdm's bars: "50%|█████     | 5/10 [00:01<00:01, ...]" or, without a total, "12it [00:01, ...]"
PROGRESS_BAR = re.compile(r"\|[^|\n]*\|\s*\S+/\S+\s*\[|\d+\w*\s*\[\d+:\d+")
LOADED_URL = re.compile(
    r"<(?:script|img|iframe|source|audio|video|embed)\b[^>]*?\ssrc=[\"']?(?!data:)([^\"'\s>]+)"
    r"|<link\b[^>]*?\shref=[\"']?(?!data:)([^\"'\s>]+)",
    re.IGNORECASE,
)

# The "lab" template without anything loaded from the network, each code input folded under "code".
OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}
<style>
details.code-fold > summary { cursor: pointer; width: max-content; margin: 2px 0 2px var(--jp-cell-prompt-width, 64px);
  font-family: var(--jp-code-font-family); font-size: var(--jp-code-font-size); color: var(--jp-ui-font-color2); }
math[display="block"] { margin: 0.6em 0; }
</style>
{%- endblock extra_css -%}
{% block input_group -%}
{%- if resources.global_content_filter.include_input and cell.source.strip() -%}
<details class="code-fold"><summary>code</summary>
{{ super() }}
</details>
{%- endif -%}
{%- endblock input_group %}
"""


ExtraPage = tuple[str, str, Callable[[Path, str], None]]  # (title, filename, build(out_path, profile))


class ExportError(ValueError):
    """A notebook whose page cannot be written as asked (a formula MathML cannot express, a network reference)."""


class MathError(ValueError):
    """One TeX formula that latex2mathml cannot convert faithfully."""


def inject_parameters(nb, **params) -> None:
    """Insert `NAME = value` lines after the cell tagged `parameters` (at the top when there is none)."""
    if not params:
        return
    source = "# Injected parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    nb.cells.insert(tagged[0] + 1 if tagged else 0, cell)


_IPC: list[Path] = []


def _ipc_folder() -> Path:
    """One private temporary folder per process for the kernels' IPC sockets, removed when the process exits."""
    if not _IPC:
        import atexit
        import shutil
        import tempfile

        _IPC.append(Path(tempfile.mkdtemp(prefix="helpers-kernels-")))
        atexit.register(shutil.rmtree, _IPC[0], ignore_errors=True)
    return _IPC[0]


def _this_python_kernel_manager():
    """A KernelManager class that runs this very Python (the project's .venv), whatever kernels are installed, talking
    to it over local IPC sockets in a private temporary folder: no TCP ports, so no kernel warning about TCP without
    encryption in the log."""
    from ipykernel.kernelspec import get_kernel_dict
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager

    class ThisPython(AsyncKernelManager):  # async: nbclient's check that the kernel lives runs beside the waits
        def __init__(self, **kwargs):
            kwargs.setdefault("transport", "ipc")
            kwargs.setdefault("ip", str(_ipc_folder() / "kernel"))  # sockets kernel-1, kernel-2, ... (free numbers)
            super().__init__(**kwargs)

        async def start_kernel(self, stderr_watch: KernelStderr | None = None, **kwargs):
            """Start the kernel; with `stderr_watch` its stderr goes through that pipe (how it died, if it does)."""
            if stderr_watch is None:
                return await super().start_kernel(**kwargs)
            try:
                await super().start_kernel(stderr=stderr_watch.fd, **kwargs)
            finally:
                stderr_watch.close()
            stderr_watch.process = self.provisioner.process

        @property
        def kernel_spec(self):
            return KernelSpec(resource_dir=str(ROOT), **get_kernel_dict())

    return ThisPython


def execute(path: Path, params: dict, timeout_s: int = 3600):
    """Run a notebook top to bottom in its folder; return (executed notebook, error text or None).

    A kernel that dies stops the notebook within about a second (nbclient checks every second); the error then says
    how it ended and what it last wrote to stderr, which is echoed to this process's stderr as it comes."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    inject_parameters(nb, **params)
    # The kernel's own stderr (what C code and child processes write; what a crash writes last) goes to its stderr
    # file descriptor, not into the notebook, as under nbval: through `stderr` to this process's stderr.
    client = NotebookClient(
        nb,
        kernel_manager_class=_this_python_kernel_manager(),
        kernel_name="python3",
        timeout=timeout_s,
        resources={"metadata": {"path": str(path.parent)}},
        extra_arguments=["--IPKernelApp.capture_fd_output=False"],
    )
    stderr = KernelStderr(echo=2)
    running = ["start-up"]
    client.on_cell_execute = lambda cell, cell_index: running.append(f"cell {cell_index} (id {cell.get('id')})")
    try:
        client.execute(stderr_watch=stderr)
        return nb, None
    except CellExecutionError as exc:
        text = ANSI_COLOUR.sub("", str(exc)).strip()
        return nb, text.splitlines()[-1] if text else "cell failed"
    except (DeadKernelError, RuntimeError):  # RuntimeError: nbclient's "Kernel died before replying"
        if stderr.process is None or stderr.process.poll() is None:
            raise  # the kernel runs: not a death
        return nb, f"{running[-1]}: {stderr.report()}"
    finally:
        stderr.close()


def notebook_title(nb, fallback: str) -> str:
    """The first markdown heading of a notebook, else `fallback`."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return fallback


def tex_to_mathml(tex: str, display: str) -> str:
    """MathML for one formula (display "block" or "inline"), or MathError naming what latex2mathml cannot do."""
    if _unbalanced_braces(tex):
        raise MathError(f"unbalanced braces in {tex!r}")
    try:
        mathml = latex_to_mathml(tex, display=display)
    except Exception as exc:  # latex2mathml raises its own error classes, one per kind of malformed TeX
        raise MathError(f"{tex!r}: {type(exc).__name__} {exc}".strip()) from exc
    unknown = re.findall(r">(\\[A-Za-z]+)<", mathml)  # a command latex2mathml does not know is left as text
    if unknown:
        raise MathError(f"{tex!r}: unknown command {unknown[0]}")
    return mathml.replace(' xmlns="http://www.w3.org/1998/Math/MathML"', "", 1)  # HTML needs no namespace


def _unbalanced_braces(tex: str) -> bool:
    """True when the unescaped { and } of a formula do not pair up."""
    depth = 0
    for brace in re.findall(r"(?<!\\)[{}]", tex):
        depth += 1 if brace == "{" else -1
        if depth < 0:
            return True
    return depth != 0


class MathMLRenderer(IPythonRenderer):
    """nbconvert's markdown renderer with TeX turned into MathML, instead of left for MathJax to typeset."""

    def block_math(self, body: str) -> str:
        """$$...$$ and \\[...\\] as a displayed formula."""
        return tex_to_mathml(body, display="block")

    def inline_math(self, body: str) -> str:
        """$...$ and \\(...\\) inside the text."""
        return tex_to_mathml(body, display="inline")

    def latex_environment(self, name: str, body: str) -> str:
        """\\begin{name}...\\end{name} as a displayed formula."""
        return tex_to_mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", display="block")


class OfflineHTMLExporter(HTMLExporter):
    """HTMLExporter (lab template) whose pages load nothing: MathML for math, markdown images embedded."""

    @pass_context
    def markdown2html(self, context, source):
        """Markdown cell to HTML, as nbconvert does it but with MathMLRenderer."""
        renderer = MathMLRenderer(
            escape=False,
            attachments=context.get("cell", {}).get("attachments", {}),
            embed_images=True,
            path=context["resources"]["metadata"].get("path", ""),
            anchor_link_text=self.anchor_link_text,
            exclude_anchor_links=self.exclude_anchor_links,
        )
        return MarkdownWithMath(renderer=renderer).render(source)


def offline_copy(nb):
    """A copy of an executed notebook without widget outputs (a live panel keeps its text/html line), widget state and
    tqdm's stderr progress lines."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            if WIDGET_VIEW in out.get("data", {}):  # a live panel's text/html fallback stays (the parameter to edit)
                fallback = {k: v for k, v in out.data.items() if k in ("text/html", "text/markdown")}
                if not fallback:
                    continue
                out["data"] = nbformat.from_dict(fallback)
            if out.output_type == "stream" and out.name == "stderr":
                out.text = _without_progress_bars(out.text)
                if not out.text.strip():
                    continue
            outputs.append(out)
        cell.outputs = outputs
    return nb


def _without_progress_bars(text: str) -> str:
    """Stream text as a terminal would leave it (each line's last carriage-return segment), progress bars removed."""
    lines = []
    for line in text.split("\n"):
        shown = next((part for part in reversed(line.split("\r")) if part), "")
        cleared = "\r" in line and not shown.strip()  # tqdm(leave=False) overwrites its bar with spaces
        if not cleared and not PROGRESS_BAR.search(shown):
            lines.append(shown)
    return "\n".join(lines)


def relative_paths(page: str, root: Path = ROOT) -> str:
    """The page with the repository's absolute path (as given and resolved) made relative to the repository root."""
    for absolute in sorted({str(root), str(root.resolve())}, key=len, reverse=True):
        whole = re.compile(re.escape(absolute) + r"(/|(?![\w.-]))")  # not /work/main2 for /work/main
        page = whole.sub(lambda m: "" if m[1] else ".", page)
    return page


def _without_css_comments(page: str) -> str:
    """The page with comments removed from its <style> blocks (the lab theme's credits carry URLs)."""
    return re.sub(
        r"(<style[^>]*>)(.*?)(</style>)",
        lambda m: m[1] + CSS_COMMENT.sub("", m[2]) + m[3],
        page,
        flags=re.DOTALL | re.IGNORECASE,
    )


def network_references(page: str) -> list[str]:
    """URLs and file paths a browser would load for the page (script/img/... src, link href); data: URIs excluded."""
    return [a or b for a, b in LOADED_URL.findall(page)]


def export_html(nb, out: Path, title: str, hide_code: bool = False, notebook_dir: Path = ROOT / "notebooks") -> None:
    """Write one self-contained HTML page: MathML, embedded images, folded code, no widget or network needs.

    `notebook_dir` is where markdown image paths are read from. Raises ExportError naming the notebook.
    """
    exporter = OfflineHTMLExporter(
        template_name="lab",
        template_file="offline.html.j2",
        exclude_input=hide_code,
        extra_loaders=[DictLoader({"offline.html.j2": OFFLINE_TEMPLATE})],
    )
    resources = {"metadata": {"name": title, "path": str(notebook_dir)}}
    try:
        body, _ = exporter.from_notebook_node(offline_copy(nb), resources=resources)
    except MathError as exc:
        raise ExportError(f"{out.stem}: cannot convert a formula to MathML: {exc}") from exc
    body = relative_paths(_without_css_comments(body))
    loaded = network_references(body)
    if loaded:
        raise ExportError(f"{out.stem}: the page would load {', '.join(sorted(set(loaded)))}; embed it or remove it")
    out.write_text(body, encoding="utf-8")


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


def headline_figure(nb) -> str | None:
    """The base64 PNG of the first image in the outputs of the cell tagged `headline`, or None."""
    for cell in nb.cells:
        if cell.cell_type == "code" and HEADLINE_TAG in cell.get("metadata", {}).get("tags", []):
            for out in cell.get("outputs", []):
                png = out.get("data", {}).get("image/png")
                if png:
                    return "".join(png.split())
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
) -> Path:
    """writeups/index.html: title, device, profile and time budget, date, the extra pages first, then per notebook
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
    extra = "\n".join(f"<li>{_link(p, out_dir)}{'' if p['error'] is None else ' · ' + _status(p)}</li>" for p in pages)
    sections = "\n".join(_front_section(e, out_dir, _sentence(front, e["notebook"], profile)) for e in entries)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>LLM systems companion: writeups</title>
<style>{INDEX_CSS}</style>
</head><body><h1>LLM systems companion: writeups</h1>
<p>Device: <b>{html.escape(facts["device"])}</b> ({facts["cpu_count"]} CPU cores, {facts["gpu_count"]} GPU(s));
profile: <b>{html.escape(profile)}</b>{budget_note}; torch {facts["torch"]}, triton {facts["triton"]};
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
    entries, pages = [], []
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {path.name} (profile {profile}) ...", flush=True)
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
    index = write_index(entries, args.out, profile, pages, budget=args.budget, front=front)
    failed = [e["notebook"] for e in entries if e["error"]] + [p["html"] for p in pages if p["error"]]
    print(f"wrote {index}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
