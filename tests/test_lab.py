"""JupyterLab as `make lab` gives it to a student, driven by headless Chromium.

One JupyterLab server (this venv's Python as kernel, a temp copy of notebooks/, a random token, a free
loopback port) serves three checks: a tiny notebook written here whose cell displays a calculator by the
writeups' contract (`.calc`, `[data-input]`, `.calc-output`, inline JS), which proves inline scripts run in
Lab outputs and the kernel is this venv; and notebook 05's calculator (its parameter, import and calculator cells,
profile cpu), which must change its output when an input changes; and notebook 07's live control (its cell tagged
`live`, on small shapes), whose Run must show a table that changes with the segment size chosen. Skips without
Chromium and chromedriver.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from browser import assert_calc_reacts, full_page_screenshot, in_chromium, start_chrome, without_colours

from helpers.launch import free_port

ROOT = Path(__file__).resolve().parent.parent
pytestmark = in_chromium
NOTEBOOK_05 = "05_optimizer_state_sharding.ipynb"

CALC_CELL = r'''import sys
from IPython.display import HTML, display

display(HTML(f"""<div class="calc" data-python="{sys.executable}">
<select data-input="ranks"><option>1</option><option>8</option></select>
<input type="range" data-input="batch" min="1" max="64" value="1">
<div class="calc-output"><table><tr><td>1 rank, batch 1</td></tr></table></div>
<script>(() => {{
  const calc = document.currentScript.closest('.calc'), out = calc.querySelector('.calc-output');
  const show = () => {{
    const [ranks, batch] = [...calc.querySelectorAll('[data-input]')].map(e => e.value);
    out.innerHTML = `<table><tr><td>${{ranks}} rank(s), batch ${{batch}}</td></tr></table>`;
  }};
  calc.addEventListener('input', show);
  calc.addEventListener('change', show);
}})();</script></div>"""))'''

RUN_STATE = """
const w = window.jupyterapp.shell.currentWidget;
let error = null, pending = 0;
for (const cell of w.content.widgets) {
    if (cell.model.type !== 'code' || !cell.model.sharedModel.getSource().trim()) continue;
    if (cell.model.executionCount === null) pending++;
    for (const o of cell.model.outputs.toJSON())
        if (o.output_type === 'error' && error === null) error = o.traceback.slice(-3).join('\\n');
}
return {error: error, done: pending === 0 && w.sessionContext.session.kernel.status === 'idle'};"""

KERNEL_IDLE = """
const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
const kernel = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
return !!kernel && kernel.status === 'idle';"""


def answers(url: str) -> bool:
    """Whether an HTTP GET of `url` succeeds, bypassing any proxy."""
    try:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=2)
        return True
    except OSError:
        return False


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server (it shuts its kernels down); SIGKILL its process group if it lingers."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def start_lab(root: Path, token: str, tries: int = 3) -> tuple[subprocess.Popen, str]:
    """JupyterLab serving `root` on a free port, on another one if that got taken meanwhile: (process, URL)."""
    home = root.parent / "jupyter"  # config, data and runtime dirs of its own: no user kernels or settings
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    )
    for _ in range(tries):
        port = free_port()
        log = root.parent / f"lab-{port}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "jupyter",
                    "lab",
                    "--no-browser",
                    "--ip=127.0.0.1",
                    f"--port={port}",
                    "--ServerApp.port_retries=0",
                    f"--IdentityProvider.token={token}",
                    f"--ServerApp.root_dir={root}",
                    "--LabApp.expose_app_in_browser=True",
                    "--allow-root",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if answers(f"{url}/api/status?token={token}"):
                return proc, url
            time.sleep(0.5)
        stop(proc)
        if "already in use" not in log.read_text():
            break
    raise RuntimeError(f"JupyterLab did not start; its last log:\n{log.read_text()[-3000:]}")


def calculator_cells(nb) -> list:
    """The cells a student runs to use notebook 05's calculator: parameters, imports, the calculator. The rest of
    the notebook (multi-rank launches) is checked by nbval; here it would only make the browser wait."""
    keep = [
        c
        for c in nb.cells
        if c.cell_type == "code"
        and (
            {"parameters", "injected-parameters"} & set(c.metadata.get("tags", []))
            or "import" in c.source
            and "Calculator" in c.source
            or "Calculator(" in c.source
        )
    ]
    assert any("Calculator(" in c.source for c in keep), "notebook 05 has no Calculator cell"
    return keep


NOTEBOOK_07, LIVE_07 = "07_fsdp.ipynb", "live_07.ipynb"
SMALL_CHECKPOINT = """from helpers.experiments import fsdp as X

profile = "cpu"  # notebook 07's live cell below, verbatim, on small shapes: the control, not the numbers, is checked
X.PROFILES["cpu"] = {**X.PROFILES["cpu"], "ckpt_layers": 4, "ckpt_batch": 1, "ckpt_context": 16,
                     "segments": [0, 1, 2, 4]}"""


def live_notebook(nb07):
    """Notebook 07's cell tagged `live` (its checkpoint-segment panel) after a cell that shrinks the shapes."""
    live = [c for c in nb07.cells if "live" in c.metadata.get("tags", [])]
    assert len(live) == 1, "notebook 07 has no (or several) cells tagged live"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SMALL_CHECKPOINT), live[0]])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """(Chromium driver, server URL, token) for a Lab serving a copy of notebooks/ plus the calculator self-test."""
    from helpers.writeup import inject_parameters

    root = tmp_path_factory.mktemp("lab") / "notebooks"
    shutil.copytree(ROOT / "notebooks", root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for path in root.glob("[0-9]*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        inject_parameters(nb, PROFILE="cpu")
        if path.name == NOTEBOOK_05:
            nb.cells = calculator_cells(nb)
        nbformat.write(nb, path)
    selftest = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CALC_CELL)])
    selftest.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(selftest, root / "calc_selftest.ipynb")
    nbformat.write(live_notebook(nbformat.read(ROOT / "notebooks" / NOTEBOOK_07, as_version=4)), root / LIVE_07)
    token = secrets.token_hex(16)
    proc, url = start_lab(root, token)
    driver = None
    try:
        driver = start_chrome(offline=False)
        yield driver, url, token
    finally:
        if driver is not None:
            driver.quit()
        stop(proc)


CALC = ".jp-OutputArea-output .calc"


def run_to_calc(driver, url: str, token: str, notebook: str, timeout_s: int):
    """Open `notebook` in Lab, Run All, and wait for a `.calc` in its outputs; fail on a cell error. Returns a
    function that finds that `.calc` afresh: JupyterLab may re-render an output area at any time, and an element
    found before then is stale."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{url}/lab/tree/{notebook}?reset&token={token}")
    WebDriverWait(driver, 120, poll_frequency=0.25).until(
        lambda d: d.execute_script(KERNEL_IDLE), f"{notebook}: no idle kernel in JupyterLab after 120 s"
    )
    driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells')")

    def calc_or_error(d):
        """Whether a `.calc` is in the outputs so far (no: keep waiting); raises on a cell error or a finished run."""
        state = d.execute_script(RUN_STATE)
        if state["error"] is not None:
            pytest.fail(f"{notebook}: a cell failed in JupyterLab:\n{without_colours(state['error'])}", pytrace=False)
        found = bool(d.find_elements(By.CSS_SELECTOR, CALC))
        if state["done"] and not found:
            pytest.fail(f"{notebook}: ran to the end in JupyterLab without showing a .calc", pytrace=False)
        return found

    WebDriverWait(driver, timeout_s, poll_frequency=0.25, ignored_exceptions=(StaleElementReferenceException,)).until(
        calc_or_error, f"{notebook}: no .calc in any output after {timeout_s} s of Run All"
    )
    return lambda: WebDriverWait(driver, 10, poll_frequency=0.2).until(  # back within moments of a re-render
        lambda d: d.find_element(By.CSS_SELECTOR, CALC), f"{notebook}: its .calc is gone from the outputs"
    )


def on_fresh(find, check, tries: int = 3):
    """check(find()), again on a freshly found element when JupyterLab re-rendered the one in hand meanwhile (a stale
    element says nothing about the page): every try checks everything, so a pass is a whole pass."""
    from selenium.common.exceptions import StaleElementReferenceException

    for attempt in range(tries):
        try:
            return check(find())
        except StaleElementReferenceException:
            if attempt == tries - 1:
                raise


@pytest.mark.timeout(300)
def test_inline_calculator_runs_in_lab(lab):
    driver, url, token = lab
    find = run_to_calc(driver, url, token, "calc_selftest.ipynb", timeout_s=120)
    python = on_fresh(find, lambda calc: calc.get_attribute("data-python"))
    assert python == sys.executable, "the kernel is not this venv's Python"
    on_fresh(find, lambda calc: assert_calc_reacts(driver, calc, "calc_selftest.ipynb"))


@pytest.mark.timeout(300)
def test_notebook_05_calculator_in_lab(lab):
    driver, url, token = lab
    notebook = NOTEBOOK_05
    find = run_to_calc(driver, url, token, notebook, timeout_s=240)
    on_fresh(find, lambda calc: assert_calc_reacts(driver, calc, notebook))


LIVE_PANEL = ".live-panel"


def live_panel(driver):
    """Notebook 07's panel as the page shows it now (found afresh: JupyterLab re-renders output areas)."""
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, LIVE_PANEL)


def run_live_panel(driver, segment: str, before: str, timeout_s: int = 90) -> str:
    """Pick `segment` in the panel's menu, press Run, and return the text of the table it shows once it differs
    from `before`; fail with the panel's status when the run failed. Every step finds the panel and its parts afresh
    and a stale element counts as "not yet": the output area is re-rendered as the table and then the plot arrive."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    def choose_and_run(d):
        """Select the segment and click Run once it is enabled (the last run re-enables it just after its "done in"); a
        stale element fails before its click is sent, so a retry never runs twice."""
        panel = live_panel(d)
        button = panel.find_element(By.XPATH, ".//button[normalize-space()='Run']")
        if not button.is_enabled():
            return False
        Select(panel.find_element(By.CSS_SELECTOR, "select")).select_by_visible_text(segment)
        button.click()
        return True

    WebDriverWait(driver, 30, poll_frequency=0.5, ignored_exceptions=(StaleElementReferenceException,)).until(
        choose_and_run, f"could not choose segment {segment} and press Run in the live panel"
    )

    def new_table(d):
        panel = live_panel(d)
        status = " ".join(e.text for e in panel.find_elements(By.CSS_SELECTOR, ".widget-label"))
        if "failed" in status:
            pytest.fail(f"the live panel's run failed: {status}", pytrace=False)
        tables = panel.find_elements(By.CSS_SELECTOR, ".widget-output table")
        return tables[0].text if tables and "done in" in status and tables[0].text != before else False

    return WebDriverWait(
        driver, timeout_s, poll_frequency=0.5, ignored_exceptions=(StaleElementReferenceException,)
    ).until(new_table, f"no new table in the live panel {timeout_s} s after Run (segment {segment})")


@pytest.mark.timeout(240)
def test_notebook_07_live_control_in_lab(lab):
    """Notebook 07's checkpoint-segment panel in JupyterLab: Run measures the chosen segment size in place, and
    another choice gives another table (its rows: no checkpointing and the segment chosen)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver, url, token = lab
    driver.get(f"{url}/lab/tree/{LIVE_07}?reset&token={token}")
    WebDriverWait(driver, 120, poll_frequency=0.25).until(
        lambda d: d.execute_script(KERNEL_IDLE), f"{LIVE_07}: no idle kernel in JupyterLab after 120 s"
    )
    driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    WebDriverWait(driver, 120, poll_frequency=0.25, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: (
            bool(d.find_elements(By.CSS_SELECTOR, LIVE_PANEL))
            or d.execute_script(RUN_STATE)["error"]
            and pytest.fail(f"{LIVE_07}: {without_colours(d.execute_script(RUN_STATE)['error'])}", pytrace=False)
        ),
        f"{LIVE_07}: no .live-panel after Run All",
    )
    first = run_live_panel(driver, "1", before="")
    second = run_live_panel(driver, "4", before=first)
    driver.execute_script(f"document.querySelector('{LIVE_PANEL}').scrollIntoView({{block: 'start'}})")
    full_page_screenshot(driver, ROOT / "writeups" / "screenshots" / "lab.07_live.png")
    assert segments(first) == ["0", "1"] and segments(second) == ["0", "4"], (first, second)


def segments(table_text: str) -> list[str]:
    """The segment sizes (row labels) of a checkpoint table's text: header, index-name line, then one row each."""
    return [line.split()[0] for line in table_text.splitlines()[2:] if line.split()]
