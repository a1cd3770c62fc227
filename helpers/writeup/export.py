"""One notebook as a self-contained HTML page: TeX as MathML, plots and images embedded, widgets and progress bars
dropped, code folded, the clone's absolute path made relative, nothing loaded from the network.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat
from jinja2 import DictLoader, pass_context
from latex2mathml.converter import convert as latex_to_mathml
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

from helpers.writeup.kernel import ROOT

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
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


class ExportError(ValueError):
    """A notebook whose page cannot be written as asked (a formula MathML cannot express, a network reference)."""


class MathError(ValueError):
    """One TeX formula that latex2mathml cannot convert faithfully."""


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
