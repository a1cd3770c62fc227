"""make writeup's engine: parameter injection, execution, HTML and index, failures reported."""
import json
from pathlib import Path

import nbformat

from helpers import writeup

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


def test_committed_notebooks_carry_no_outputs():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        dirty = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))]
        assert not dirty, f"{path.name}: cells {dirty} carry outputs; run `make strip` before committing"
