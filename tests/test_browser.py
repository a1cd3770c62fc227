"""The HTML writeups in a real browser: headless Chromium, networking off, pages opened from disk (file://).

Pages: notebooks 00 and 05 executed (profile cpu, the least time budget) and exported into a temp folder by
helpers.writeup, so a fresh clone checks itself, plus every writeups/*.html that `make writeup` left (index.html,
answers.html ...).
Each page must request nothing over http(s)/ws(s) and name no remote resource, show no unrendered TeX
outside code, decode every <img>, log no console error, and, for each `.calc`, change its `.calc-output`
when any of its `[data-input]` inputs changes. A full-page screenshot of each lands in writeups/screenshots/.
Skips without Chromium and chromedriver (apt-get install chromium chromium-driver).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from browser import (
    assert_calc_reacts,
    broken_images,
    console_errors,
    exercise_calc,
    full_page_screenshot,
    in_chromium,
    remote_requests,
    start_chrome,
    visible_tex,
    visit,
    without_colours,
)

ROOT = Path(__file__).resolve().parent.parent
BUILT = ["00_setup", "05_optimizer_state_sharding"]  # executed here: the setup page and one with a calculator
CALCULATORS_ONLY = {"05_optimizer_state_sharding"}  # its text, set-up and calculator cells: nbval runs the rest
WITHOUT_LAUNCHES = {"00_setup"}  # every cell but those that launch ranks (text and tables): nbval runs them
EXPORTED = sorted(p.name for p in (ROOT / "writeups").glob("*.html"))
SHOTS = ROOT / "writeups" / "screenshots"

pytestmark = in_chromium


@pytest.fixture(scope="module")
def chrome():
    """One offline headless Chromium for every page of this module."""
    driver = start_chrome(offline=True)
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def build(tmp_path_factory):
    """build(stem) -> path of notebooks/<stem>.ipynb executed (profile cpu) and exported once per session."""
    from helpers import writeup

    out_dir, pages = tmp_path_factory.mktemp("writeups"), {}

    def _build(stem: str) -> Path:
        if stem not in pages:
            source = ROOT / "notebooks" / f"{stem}.ipynb"
            if stem in CALCULATORS_ONLY:
                source = _text_setup_and_calculators(source, out_dir)
            if stem in WITHOUT_LAUNCHES:
                source = _without_launches(source, out_dir)
            nb, error = writeup.execute(
                source, {"PROFILE": "cpu", "BUDGET": "1"}, timeout_s=600
            )  # the least budget: the page, not the numbers, is checked
            if error is not None:
                pytest.fail(
                    f"notebooks/{stem}.ipynb failed, so its page is incomplete:\n{first_error(nb)}", pytrace=False
                )
            pages[stem] = out_dir / f"{stem}.html"
            writeup.export_html(nb, pages[stem], writeup.notebook_title(nb, stem))
        return pages[stem]

    return _build


def _text_setup_and_calculators(path: Path, folder: Path) -> Path:
    """The notebook with its markdown, its parameters and set-up cells and its calculator cells only, written
    in `folder` (the page's TeX, layout and calculators are what the browser checks; nbval runs every cell):
    about 50 s less of `make test` for notebook 05."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    setup = {id(c) for c in code[:2]}  # the parameters cell and the set-up cell
    nb.cells = [c for c in nb.cells if c.cell_type == "markdown" or id(c) in setup or "Calculator(" in c.source]
    assert any("Calculator(" in c.source for c in nb.cells), f"{path.name} has no calculator cell any more"
    out = folder / path.name
    nbformat.write(nb, out)
    return out


def _without_launches(path: Path, folder: Path) -> Path:
    """The notebook without its code cells that launch ranks and those that read a name a dropped cell bound,
    written in `folder`: the page keeps its text, tables and figures (notebook 00: about 10 s less of `make test`)."""
    import ast
    import re

    import nbformat

    nb = nbformat.read(path, as_version=4)
    dropped, kept = set(), []
    for cell in nb.cells:
        if cell.cell_type == "code" and (
            "launch.launch(" in cell.source or any(re.search(rf"\b{n}\b", cell.source) for n in dropped)
        ):
            tree = ast.parse(cell.source)
            dropped |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            dropped |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
            continue
        kept.append(cell)
    assert len(kept) < len(nb.cells), f"{path.name} launches no ranks any more"
    assert any("plt." in c.source for c in kept if c.cell_type == "code"), f"{path.name}: no figure left to decode"
    nb.cells = kept
    out = folder / path.name
    nbformat.write(nb, out)
    return out


def first_error(nb) -> str:
    """The tail of the first error traceback in an executed notebook, without terminal colours."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                return without_colours("\n".join(out.traceback[-3:]))
    return "no error output"


def check_page(driver, path: Path, shot: Path) -> None:
    """Open one page offline and assert the writeup contract; save its screenshot first."""
    from selenium.webdriver.common.by import By

    visit(driver, path.as_uri())
    full_page_screenshot(driver, shot)
    tex, images = visible_tex(driver), broken_images(driver)
    assert not tex, f"{path.name}: unrendered TeX in visible text: {tex[:5]}"
    assert not images, f"{path.name}: images that did not decode: {images}"
    for i, calc in enumerate(driver.find_elements(By.CSS_SELECTOR, ".calc")):
        assert_calc_reacts(driver, calc, f"{path.name}, .calc #{i}")
    remote, errors = remote_requests(driver), console_errors(driver)
    assert not remote, f"{path.name}: remote resources: {remote}"
    assert not errors, f"{path.name}: console errors: {errors[:5]}"


@pytest.mark.parametrize("stem", BUILT)
def test_fresh_writeup_in_browser(chrome, build, stem):
    check_page(chrome, build(stem), SHOTS / f"{stem}.fresh.png")


@pytest.mark.skipif(not EXPORTED, reason="no writeups/*.html yet; `make writeup` makes them")
@pytest.mark.parametrize("name", EXPORTED or ["none"])
def test_exported_writeup_in_browser(chrome, name):
    check_page(chrome, ROOT / "writeups" / name, SHOTS / name.replace(".html", ".png"))


ONE_PIXEL_PNG = "data:image/png;base64," + (  # a 1x1 image that loads
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg=="
)
PLANTED = r"""<!doctype html><html><head><meta charset="utf-8">
<script src="https://cdn.example/mathjax.js"></script></head>
<body><p>visible $$\frac{a}{b}$$ and inline $x_i$</p><pre>\frac{in}{pre}</pre><code>$$</code>
<details><summary>code</summary><p>\sum folded</p></details><p>costs $5, not TeX</p>
<img src="ONE_PIXEL_PNG">
<img src="missing.png"><script>console.error("planted error")</script>
<div class="calc"><select data-input="model"><option>small</option><option>large</option></select>
<input type="range" data-input="world_size" min="1" max="64" value="1">
<select data-input="precision"><option>fp32</option><option>mixed</option></select>
<div class="calc-output"><table><tr><td>small</td></tr></table></div></div>
<script>const calc = document.querySelector('.calc'), out = calc.querySelector('.calc-output');
calc.querySelector('select').addEventListener('change', e => {
  out.innerHTML = '<table><tr><td>' + e.target.value + '</td></tr></table>'; });
calc.querySelector('input').addEventListener('input', e => { out.innerHTML += e.target.value; });</script>
</body></html>""".replace("ONE_PIXEL_PNG", ONE_PIXEL_PNG)


def test_checks_catch_planted_faults(chrome, tmp_path):
    """Each check finds what a page planted with faults holds, and nothing that is allowed."""
    from selenium.webdriver.common.by import By

    page = tmp_path / "planted.html"
    page.write_text(PLANTED, encoding="utf-8")
    visit(chrome, page.as_uri())
    assert visible_tex(chrome) == ["visible $$\\frac{a}{b}$$ and inline $x_i$"]
    assert broken_images(chrome) == ["missing.png"]
    calc = chrome.find_element(By.CSS_SELECTOR, ".calc")  # the planted input never reacts: 1 s tells, not 5
    assert exercise_calc(chrome, calc, wait_s=1) == {
        "model": True,
        "world_size": True,
        "precision": False,
    }
    assert remote_requests(chrome) == ["https://cdn.example/mathjax.js"]
    errors = console_errors(chrome)
    assert any("planted error" in e for e in errors) and any("mathjax" in e for e in errors), errors


# --- the front page (index.html) from fake executed-notebook entries and saved results: no notebook runs --------


def _ratio(a, b, ratio, low, high, **keys):
    return {**keys, "a": a, "b": b, "ratio": ratio, "ratio_low": low, "ratio_high": high, "pairs": 8}


FAKE_RESULTS = {  # name -> rows, as the notebooks save them (the columns helpers.course.front reads)
    "00_warmup": [
        {"label": "cold", "warmup_kind": "none", "median_s": 0.0612, "min_s": 0.041, "max_s": 0.31, "steps": 10},
        {"label": "warm", "warmup_kind": "3 steps", "median_s": 0.03127, "min_s": 0.0301, "max_s": 0.0355, "steps": 10},
    ],
    "01_precision_ratios": [
        _ratio("bf16", "fp32", 3.4567, 3.2, 3.71, size="tiny/cpu", **{"pass": "both"}),
        _ratio("fp32", "bf16", 0.2893, 0.27, 0.31, size="tiny/cpu", **{"pass": "both"}),
        _ratio("bf16", "fp32", 2.9061, 2.81, 3.05, size="small/cpu", **{"pass": "both"}),
    ],
    "rmsnorm_ratios": [
        _ratio("torch", "layernorm", 1.1234, 1.05, 1.21, dtype="float32", H=1024, **{"pass": "fwd"}),
        _ratio("torch", "layernorm", 0.9412, 0.9, 0.99, dtype="float32", H=4096, **{"pass": "fwd"}),
        _ratio("torch", "layernorm", 0.5, 0.4, 0.6, dtype="float32", H=4096, **{"pass": "fwd+bwd"}),
    ],
    "03_collectives": [
        {
            "backend": "gloo",
            "device": "cpu",
            "world_size": n,
            "op": "all_reduce",
            "size_bytes": s,
            "size": f"{s >> 10} KiB",
            "time_s": t,
            "p25_s": t * 0.9,
            "p75_s": t * 1.2,
            "busbw_GBps": s / t / 1e9,
            "wrong": 0,
        }
        for n, s, t in [(2, 65536, 1e-4), (2, 4194304, 2.3e-3), (4, 4194304, 4.1e-3)]
    ],
    "04_ddp_ratios": [
        _ratio("bucketed 25 MB", "torch_ddp 25 MB", 0.8612, 0.8011, 0.9322, model="small/cpu", field="step"),
        _ratio("torch_ddp 25 MB", "bucketed 25 MB", 1.1612, 1.0727, 1.2483, model="small/cpu", field="step"),
    ],
    "05_sharding_ratios": [_ratio("sharded", "unsharded", 1.0432, 0.98, 1.11, launch=0)],
    "06_compile_ratios": [
        {
            "pass": p,
            "label": label,
            "median_s": 0.01,
            "ratio": r,
            "ratio_low": r - 0.05,
            "ratio_high": r + 0.07,
            "pairs": 8,
        }
        for p in ("fwd", "fwd+bwd")
        for label, r in [("naive", 1.0), ("compiled", 0.6789)]
    ],
    "07_checkpoint": [
        {"segment": k, "peak_MiB": peak, "median_ms": 12.0, "time / none": r, "low": r - 0.04, "high": r + 0.05}
        for k, peak, r in [(0, 40.5, 1.0), (2, 18.25, 1.2876), (4, 22.0, 1.21)]
    ],
}


def _figure_png() -> str:
    """A small real matplotlib plot as base64 PNG, as an executed notebook's output carries it."""
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([1, 2, 3], [3, 1, 2], marker="o")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def test_front_page_figures_and_measured_sentences(chrome, tmp_path):
    """Every notebook on the index shows a decoded headline figure and a sentence whose number equals the saved
    result it names (data-source/row/column), inside its interval; the answers and yours pages are linked."""
    from functools import partial

    from selenium.webdriver.common.by import By

    from helpers import writeup
    from helpers.course.front import sentence
    from helpers.results import load_results, save_results

    data, out = tmp_path / "data", tmp_path / "writeups"
    out.mkdir()
    for name, rows in FAKE_RESULTS.items():
        save_results(rows, name, profile="cpu", directory=data, model="small/cpu")
    png = _figure_png()
    stems = [
        "00_setup",
        "01_benchmarking_and_profiling",
        "02_rmsnorm_triton",
        "03_collectives",
        "04_ddp",
        "05_optimizer_state_sharding",
        "06_flash_attention",
        "07_fsdp",
    ]
    entries = [
        {
            "notebook": f"{s}.ipynb",
            "title": s,
            "html": f"{s}.html",
            "seconds": 12.0 + i,
            "error": None,
            "figure": png,
            "left_out": [f"{writeup.LEFT_OUT}: sizes medium (about 40 s more)"] if i == 4 else [],
        }
        for i, s in enumerate(stems)
    ]
    pages = [
        {"title": "Answers", "html": "answers.html", "error": None},
        {"title": "Yours", "html": "yours.html", "error": None},
    ]
    for page in pages:
        (out / page["html"]).write_text("<html><body>page</body></html>")
    index = writeup.write_index(entries, out, "cpu", pages, budget="auto", front=partial(sentence, folder=data))
    check_page(chrome, index, SHOTS / "index.front.png")

    sections = chrome.find_elements(By.CSS_SELECTOR, "section.nb")
    assert [s.get_attribute("data-notebook") for s in sections] == [e["notebook"] for e in entries]
    for section in sections:
        img = section.find_elements(By.CSS_SELECTOR, "img.headline")
        assert img and chrome.execute_script("return arguments[0].naturalWidth", img[0]) > 0, section.text
        assert "ok" in section.find_element(By.CSS_SELECTOR, ".status").text
    values = chrome.find_elements(By.CSS_SELECTOR, ".claim-value")
    assert len(values) == len(stems), [s.find_element(By.CSS_SELECTOR, ".claim").text for s in sections]
    for v in values:
        row = load_results(data / f"{v.get_attribute('data-source')}.jsonl").rows[int(v.get_attribute("data-row"))]
        expected = row[v.get_attribute("data-column")] * float(v.get_attribute("data-scale"))
        digits = int(v.get_attribute("data-digits"))
        assert v.text == f"{expected:.{digits}f}", (v.get_attribute("data-source"), v.text, expected)
        claim = v.find_element(By.XPATH, "./..")
        low = float(claim.find_element(By.CSS_SELECTOR, ".claim-low").text)
        high = float(claim.find_element(By.CSS_SELECTOR, ".claim-high").text)
        assert low <= float(v.text) <= high, claim.text
    ddp = sections[4].find_element(By.CSS_SELECTOR, ".claim").text
    assert ddp == "bucketed DDP (25 MiB), small/cpu: 0.86× torch DDP's step time on this CPU [0.80–0.93]", ddp
    assert "sizes medium" in sections[4].find_element(By.CSS_SELECTOR, ".left-out").text
    links = [a.get_attribute("href").rsplit("/", 1)[-1] for a in chrome.find_elements(By.CSS_SELECTOR, "ul.pages a")]
    assert links == ["answers.html", "yours.html"]
