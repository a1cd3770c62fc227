"""make writeup's engine: parameter injection, execution, HTML and index, failures reported."""

import json
import re
from pathlib import Path

import nbformat
import pytest

from helpers import writeup
from helpers.writeup import index

ROOT = Path(__file__).resolve().parent.parent


def _notebook(path: Path, body: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Tiny test notebook"),
        nbformat.v4.new_code_cell('PROFILE = "auto"', metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(body),
    ]
    nbformat.write(nb, path)
    return path


def test_parameters_go_after_the_parameters_cell(tmp_path):
    nb = nbformat.read(_notebook(tmp_path / "a.ipynb", "x = 1"), as_version=4)
    writeup.inject_parameters(nb, PROFILE="cpu")
    assert nb.cells[1].metadata["tags"] == ["parameters"]
    assert nb.cells[2].metadata["tags"] == ["injected-parameters"]
    assert "PROFILE = 'cpu'" in nb.cells[2].source


def test_writeup_executes_exports_and_indexes(tmp_path):
    ok = _notebook(tmp_path / "00_ok.ipynb", "print('profile is', PROFILE)")
    bad = _notebook(tmp_path / "01_bad.ipynb", "assert PROFILE == 'gpu', 'planted failure'")
    out = tmp_path / "writeups"
    code = writeup.main([str(ok), str(bad), "--profile", "cpu", "--out", str(out)])
    assert code == 1  # one notebook failed
    page = (out / "00_ok.html").read_text()
    assert "profile is cpu" in page  # the injected value reached the kernel
    assert "planted failure" in (out / "01_bad.html").read_text()  # the failure is shown in place
    index = (out / "index.html").read_text()
    assert "00_ok.html" in index and "01_bad.html" in index and "FAILED" in index and "profile: <b>cpu</b>" in index


def test_a_finished_notebooks_kernel_is_stopped_not_waited_for(tmp_path):
    """After the last cell the kernel is killed, as nbval does under make test: a graceful shutdown waited for the
    interpreter's teardown (about 2.5 s a notebook once torch had launched ranks; 9 notebooks a make writeup). Every
    cell has written what it makes by then; launched ranks are stopped before launch() returns."""
    marker = tmp_path / "exit-handlers-ran"
    body = f"import atexit, pathlib\natexit.register(pathlib.Path({str(marker)!r}).touch)"
    nb, error = writeup.execute(_notebook(tmp_path / "a.ipynb", body), {}, timeout_s=60)
    assert error is None, error
    assert not marker.exists(), "the kernel was left to run its exit handlers: make writeup waited for its teardown"


def test_committed_notebooks_carry_no_outputs():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        dirty = [
            i
            for i, c in enumerate(cells)
            if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))
        ]
        assert not dirty, f"{path.name}: cells {dirty} carry outputs; run `make strip` before committing"


# --- offline pages: a synthetic executed notebook, exported without a kernel -------------------------

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
TQDM_NOISE = (
    "\r  0%|          | 0/3 [00:00<?, ?it/s]\r 67%|██████▋   | 2/3 [00:00<00:00, 9.1it/s]"
    "\r100%|██████████| 3/3 [00:00<00:00, 9.8it/s]\n"
)
PROSE = r"""# Offline page

Inline $\nabla_g L = \sum_n \delta^{(n)} \odot \hat{x}^{(n)}$ and a display:

$$\frac{\partial r}{\partial x_j} = -\frac{r^3\, x_j}{H}.$$

Also \\(a+b\\) and \\[c = d\\] (as JupyterLab writes them).
A code span `cost $x$ stays` and a literal \$5 stay as written.

```
fenced $y$ stays too
```
"""


def _executed(prose: str = PROSE):
    """An executed notebook: markdown, then a code cell with widget, tqdm, path, warning and image outputs."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2}}
    code = nbformat.v4.new_code_cell("for _ in tqdm(range(3)): pass\nprint(results.ROOT / 'data/local/x.csv')")
    code.outputs = [
        nbformat.v4.new_output(
            "display_data",
            data={
                writeup.WIDGET_VIEW: {"model_id": "abc", "version_major": 2},
                "text/plain": "HBox(children=(HTML(value=''),))",
            },
        ),
        nbformat.v4.new_output("stream", name="stderr", text=TQDM_NOISE),
        nbformat.v4.new_output("stream", name="stderr", text="UserWarning: a real warning\n"),
        nbformat.v4.new_output("stream", name="stdout", text=f"saved {ROOT}/data/local/x.csv in {ROOT}\n"),
        nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}),
    ]
    nb.cells = [nbformat.v4.new_markdown_cell(prose), code]
    return nb


def test_math_becomes_mathml_and_code_spans_stay(tmp_path):
    writeup.export_html(_executed(), tmp_path / "02_math.html", "Offline page")
    page = (tmp_path / "02_math.html").read_text()
    assert page.count("<math") == 4 and page.count('<math display="block"') == 2
    assert "$$" not in page and "\\frac" not in page and "\\partial" not in page and "\\(" not in page
    assert "<code>cost $x$ stays</code>" in page and "literal $5 stay" in page  # untouched: code span, escaped dollar
    assert re.search(r"<pre><code>fenced \$y\$ stays too", page)


def test_page_loads_nothing_from_the_network_or_disk(tmp_path):
    writeup.export_html(_executed(), tmp_path / "a.html", "Offline page")
    page = (tmp_path / "a.html").read_text()
    assert writeup.network_references(page) == []
    assert not re.search(r"<(script|img|link|iframe)\b[^>]*(src|href)=[\"']?(https?:|//|file:)", page)
    assert "mathjax" not in page.lower() and "require.min.js" not in page
    assert not re.search(r"https?://", page)  # not even in the theme's CSS comments
    assert re.search(r'<img [^>]*src="data:image/png;base64,', page)  # the plot is embedded
    assert writeup.network_references("<script src='https://cdn.example/x.js'></script><img src=\"plot.png\">") == [
        "https://cdn.example/x.js",
        "plot.png",
    ]


def test_widgets_and_progress_noise_are_dropped_real_stderr_kept(tmp_path):
    writeup.export_html(_executed(), tmp_path / "a.html", "Offline page")
    page = (tmp_path / "a.html").read_text()
    assert "vnd.jupyter.widget" not in page and "html-manager" not in page and "HBox" not in page
    assert "it/s" not in page and "0/3" not in page
    assert "a real warning" in page
    assert writeup._without_progress_bars("step 1\rstep 2\ndone: 5it [00:01, 4.9it/s]\n") == "step 2\n"


def test_code_is_folded_under_a_toggle_and_hide_code_still_hides_it(tmp_path):
    writeup.export_html(_executed(), tmp_path / "a.html", "Offline page")
    page = (tmp_path / "a.html").read_text()
    folded = re.search(r'<details class="code-fold"><summary>code</summary>(.*?)</details>', page, re.DOTALL)
    assert folded and "tqdm" in folded.group(1) and "jp-InputArea" in folded.group(1)
    assert page.index("</details>") < page.index("a real warning")  # the output follows, outside the fold
    writeup.export_html(_executed(), tmp_path / "b.html", "Offline page", hide_code=True)
    hidden = (tmp_path / "b.html").read_text()
    assert "<details" not in hidden and "tqdm" not in hidden and "a real warning" in hidden


def test_no_absolute_path_of_the_clone_remains(tmp_path):
    writeup.export_html(_executed(), tmp_path / "a.html", "Offline page")
    page = (tmp_path / "a.html").read_text()
    assert str(ROOT) not in page and str(writeup.ROOT.resolve()) not in page
    assert "saved data/local/x.csv in ." in page
    assert writeup.relative_paths("/r/x/a.py and /r/x, not /r/xy", Path("/r/x")) == "a.py and ., not /r/xy"


def test_a_formula_that_cannot_convert_fails_naming_notebook_and_formula(tmp_path):
    for bad in (r"$\frac{a$", r"$x^$", r"$\notacommand y$"):
        with pytest.raises(writeup.ExportError, match=r"05_bad: cannot convert a formula.*(frac|x\^|notacommand)"):
            writeup.export_html(_executed("# t\n\nsee " + bad), tmp_path / "05_bad.html", "t")
    assert not (tmp_path / "05_bad.html").exists()


def test_extra_pages_are_linked_first_and_a_failing_build_fails_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(writeup, "execute", lambda path, params, timeout_s: (_executed(), None))
    monkeypatch.setattr(
        "helpers.env.machine_facts",
        lambda: {"device": "test", "cpu_count": 2, "gpu_count": 0, "torch": "x", "triton": "y"},
    )
    nb = _notebook(tmp_path / "00_ok.ipynb", "pass")
    seen = []

    def answers(out: Path, profile: str):
        seen.append(profile)
        out.write_text(f"<html><body>answers from {ROOT}/data</body></html>")

    def broken(out: Path, profile: str):
        raise RuntimeError("planted page failure")

    out = tmp_path / "w"
    args = [str(nb), "--profile", "cpu", "--out", str(out)]
    assert writeup.main(args, extra_pages=[("Answers, question by question", "answers.html", answers)]) == 0
    index = (out / "index.html").read_text()
    assert seen == ["cpu"] and "answers from data" in (out / "answers.html").read_text()
    assert index.index("answers.html") < index.index("00_ok.html")  # the extra page comes first
    assert writeup.main(args, extra_pages=[("Broken", "broken.html", broken)]) == 1
    index = (out / "index.html").read_text()
    assert "FAILED: RuntimeError: planted page failure" in index and "href='broken.html'" not in index


def test_log_ticks_only_at_the_measured_sizes():
    import matplotlib.pyplot as plt

    from helpers.experiments.common import log_ticks

    sizes = [256, 512, 1024, 2048]
    fig, ax = plt.subplots()
    ax.plot(sizes, [1, 2, 3, 4])
    ax.set_xscale("log")
    log_ticks(ax, sizes)
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["256", "512", "1024", "2048"]
    assert [t.get_text() for t in ax.get_xticklabels(minor=True)] == []  # no "3×10²" between them
    with pytest.raises(ValueError, match="axis must be"):
        log_ticks(ax, sizes, axis="z")
    plt.close(fig)


def test_headline_figure_and_left_out_notes_come_from_the_executed_notebook():
    nb = _executed()
    assert writeup.headline_figure(nb) is None  # no cell tagged headline
    nb.cells[1].metadata["tags"] = [writeup.HEADLINE_TAG]
    assert writeup.headline_figure(nb) == PNG
    import matplotlib.pyplot as plt

    from helpers.section import Result  # a section's Result embeds its figure in its HTML: the front page finds it

    fig = plt.figure()
    html_ = Result(figure=fig, notes=["a note"])._repr_html_()
    shown = nbformat.v4.new_output("display_data", data={"text/html": html_, "text/plain": "a note"})
    nb.cells[1].outputs = [shown, *[o for o in nb.cells[1].outputs if "image/png" not in o.get("data", {})]]
    embedded = index.EMBEDDED_PNG.search(html_).group(1)
    assert writeup.headline_figure(nb) == embedded and len(embedded) > 100
    note = f"{writeup.LEFT_OUT}: mixed precision at medium (about 30 s more); run them with make writeup BUDGET=90"
    nb.cells[1].outputs.append(nbformat.v4.new_output("stream", name="stdout", text=f"timed\n- {note}\n{note}\n"))
    assert writeup.left_out_notes(nb) == [note]  # once, without the list dash
    nb.cells[1].outputs.append(
        nbformat.v4.new_output(
            "stream",
            name="stdout",
            text=(
                "left out of the seed's grid here: nothing\nleft out of the seed's grid here: {'process counts': [6]}\n"
            ),
        )
    )
    assert writeup.left_out_notes(nb) == [note, "left out of the seed's grid here: {'process counts': [6]}"]


def test_a_live_panel_keeps_its_one_line_in_the_exported_page(tmp_path):
    nb = _executed()
    nb.cells[1].outputs.append(
        nbformat.v4.new_output(
            "display_data",
            data={
                writeup.WIDGET_VIEW: {"model_id": "p", "version_major": 2},
                "text/plain": "VBox(...)",
                "text/html": "<p class='live-offline'>Live control: edit BUCKET_MB</p>",
            },
        )
    )
    writeup.export_html(nb, tmp_path / "a.html", "Offline page")
    page = (tmp_path / "a.html").read_text()
    assert "Live control: edit BUCKET_MB" in page and "VBox" not in page and "HBox" not in page


def test_the_edition_is_passed_down_to_every_notebook_and_named_on_the_index(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(
        writeup, "execute", lambda path, params, timeout_s: (seen.append(params), (_executed(), None))[1]
    )
    nb, out = _notebook(tmp_path / "00_ok.ipynb", "pass"), tmp_path / "w"
    assert writeup.main([str(nb), "--profile", "cpu", "--edition", "2024", "--out", str(out)]) == 0
    assert seen == [{"PROFILE": "cpu", "EDITION": "2024"}] and "edition: <b>2024" in (out / "index.html").read_text()
    with pytest.raises(SystemExit):  # an edition the course does not have is refused before any notebook runs
        writeup.main([str(nb), "--edition", "2023", "--out", str(out)])
