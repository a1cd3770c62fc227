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
from browser import (assert_calc_reacts, broken_images, console_errors, exercise_calc, full_page_screenshot,
                     needs_chromium, remote_requests, start_chrome, visible_tex, visit, without_colours)

ROOT = Path(__file__).resolve().parent.parent
BUILT = ["00_setup", "05_optimizer_state_sharding"]  # executed here: the setup page and one with a calculator
EXPORTED = sorted(p.name for p in (ROOT / "writeups").glob("*.html"))
SHOTS = ROOT / "writeups" / "screenshots"

pytestmark = needs_chromium


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
            nb, error = writeup.execute(ROOT / "notebooks" / f"{stem}.ipynb", {"PROFILE": "cpu", "BUDGET": "1"},
                                        timeout_s=600)  # the least budget: the page, not the numbers, is checked
            if error is not None:
                pytest.fail(f"notebooks/{stem}.ipynb failed, so its page is incomplete:\n{first_error(nb)}",
                            pytrace=False)
            pages[stem] = out_dir / f"{stem}.html"
            writeup.export_html(nb, pages[stem], writeup.notebook_title(nb, stem))
        return pages[stem]

    return _build


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


PLANTED = r"""<!doctype html><html><head><meta charset="utf-8">
<script src="https://cdn.example/mathjax.js"></script></head>
<body><p>visible $$\frac{a}{b}$$ and inline $x_i$</p><pre>\frac{in}{pre}</pre><code>$$</code>
<details><summary>code</summary><p>\sum folded</p></details><p>costs $5, not TeX</p>
<img src="data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg==">
<img src="missing.png"><script>console.error("planted error")</script>
<div class="calc"><select data-input="model"><option>small</option><option>large</option></select>
<input type="range" data-input="world_size" min="1" max="64" value="1">
<select data-input="precision"><option>fp32</option><option>mixed</option></select>
<div class="calc-output"><table><tr><td>small</td></tr></table></div></div>
<script>const calc = document.querySelector('.calc'), out = calc.querySelector('.calc-output');
calc.querySelector('select').addEventListener('change', e => {
  out.innerHTML = '<table><tr><td>' + e.target.value + '</td></tr></table>'; });
calc.querySelector('input').addEventListener('input', e => { out.innerHTML += e.target.value; });</script>
</body></html>"""


def test_checks_catch_planted_faults(chrome, tmp_path):
    """Each check finds what a page planted with faults holds, and nothing that is allowed."""
    from selenium.webdriver.common.by import By

    page = tmp_path / "planted.html"
    page.write_text(PLANTED, encoding="utf-8")
    visit(chrome, page.as_uri())
    assert visible_tex(chrome) == ["visible $$\\frac{a}{b}$$ and inline $x_i$"]
    assert broken_images(chrome) == ["missing.png"]
    assert exercise_calc(chrome, chrome.find_element(By.CSS_SELECTOR, ".calc")) == {
        "model": True, "world_size": True, "precision": False}
    assert remote_requests(chrome) == ["https://cdn.example/mathjax.js"]
    errors = console_errors(chrome)
    assert any("planted error" in e for e in errors) and any("mathjax" in e for e in errors), errors
