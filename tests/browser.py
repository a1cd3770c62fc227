"""Headless Chromium for tests/test_browser.py and tests/test_lab.py: the driver, page checks, calculator checks.

Needs Debian's `chromium` and `chromium-driver` (apt-get install chromium chromium-driver); without them the tests
that use `needs_chromium` skip. Every test that drives Chromium is marked `ci` as well (in_chromium): CI installs
Chromium and runs them in make test-ci; a student's make test leaves them out (a laptop has no chromedriver, so they
would only skip there) and keeps its budget. Every driver sends non-loopback traffic to a proxy that is not there.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import time
from pathlib import Path

import pytest

CHROMIUM = next(filter(None, map(shutil.which, ["chromium", "chromium-browser", "google-chrome"])), None)
CHROMEDRIVER = shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="no Chromium/chromedriver on PATH; enable with: apt-get install chromium chromium-driver",
)
in_chromium = [needs_chromium, pytest.mark.ci]  # a module's pytestmark; a test's: both decorators

REMOTE = ("http:", "https:", "ws:", "wss:")
# TeX that MathML conversion should have consumed: $$, \(, \[, common commands, or $...$ holding TeX syntax
TEX = (
    r"\$\$|\\\(|\\\[|\\(?:frac|dfrac|tfrac|partial|sum|prod|int|nabla|sqrt|mathrm|mathbf|mathcal|operatorname"
    r"|text|cdot|times|left|right|begin|end|alpha|beta|gamma|delta|sigma|epsilon|theta|lambda|Psi|Phi"
    r"|approx|leq|geq|neq|top|quad)(?![A-Za-z])|\$[^$\s][^$]*[\\^_{}][^$]*\$"
)


def without_colours(text: str) -> str:
    """`text` without terminal colour codes (tracebacks from a kernel carry them)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def start_chrome(offline: bool, width: int = 1280, height: int = 900):
    """A headless Chromium driver with browser and performance logs; `offline` cuts all traffic, loopback too."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
        "--proxy-server=http://127.0.0.1:9",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
    ]:
        options.add_argument(flag)
    if offline:
        options.add_argument("--proxy-bypass-list=<-loopback>")  # loopback through the dead proxy too
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    if offline:
        driver.set_network_conditions(offline=True, latency=0, download_throughput=0, upload_throughput=0)
    driver.set_script_timeout(30)
    return driver


def visit(driver, url: str) -> None:
    """Load `url` with the logs of earlier pages drained, so later reads see this page only."""
    driver.get_log("browser")
    driver.get_log("performance")
    driver.get(url)


def console_errors(driver) -> list[str]:
    """SEVERE browser-console entries since the last read."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def remote_requests(driver) -> list[str]:
    """http(s)/ws(s) URLs the page requested (performance log) or names as a resource in the DOM."""
    sent = [json.loads(e["message"])["message"] for e in driver.get_log("performance")]
    urls = [m["params"]["request"]["url"] for m in sent if m["method"] == "Network.requestWillBeSent"]
    urls += driver.execute_script(
        "return [...document.querySelectorAll('script[src],img[src],iframe[src],source[src],embed[src],"
        "video[src],audio[src],object[data],link[href]:not([rel~=canonical])')]"
        ".map(e => e.src || e.data || e.href || '')"
    )
    return sorted({u for u in urls if u.lower().startswith(REMOTE)})


def visible_tex(driver) -> list[str]:
    """Visible text outside code/pre that still looks like TeX source (first 120 characters of each node)."""
    return driver.execute_script(
        """
        const tex = new RegExp(arguments[0]), hits = [];
        const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
        for (let n = walk.nextNode(); n; n = walk.nextNode()) {
            const el = n.parentElement;
            if (!el || el.closest('code, pre, script, style, textarea, annotation, annotation-xml')) continue;
            if (el.checkVisibility({visibilityProperty: true}) && tex.test(n.data))
                hits.push(n.data.trim().slice(0, 120));
        }
        return hits;""",
        TEX,
    )


def broken_images(driver) -> list[str]:
    """The start of the src of every <img> that did not decode to a non-empty image."""
    return driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        Promise.all([...document.images].map(i => i.decode().catch(() => null)
            .then(() => i.naturalWidth > 0 ? null : (i.getAttribute('src') || '<no src>').slice(0, 80))))
            .then(r => done(r.filter(s => s !== null)));""")


def full_page_screenshot(driver, path: Path) -> None:
    """Save the whole page, not only the viewport, as a PNG. The page's size is read once it has one: on a busy
    machine Chromium reported a 0-wide content box right after load, and refused the capture."""
    deadline = time.monotonic() + 30
    while True:
        size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        if size["width"] > 0 and size["height"] > 0:
            break
        assert time.monotonic() < deadline, f"the page still has no size 30 s after loading: {size}"
        time.sleep(0.2)
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))


def change_input(driver, element) -> bool:
    """Give one calculator input another value the way a user would; False when it has no other value."""
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    if element.tag_name == "select":
        menu = Select(element)
        values = [o.get_attribute("value") for o in menu.options]
        if len(values) < 2:
            return False
        menu.select_by_index((values.index(menu.first_selected_option.get_attribute("value")) + 1) % len(values))
    else:  # <input type="range">: to the far end from where it is
        value, low, high = (float(element.get_attribute(a) or d) for a, d in [("value", 50), ("min", 0), ("max", 100)])
        if low == high:
            return False
        element.send_keys(Keys.HOME if value == high else Keys.END)
    return True


def exercise_calc(driver, calc, wait_s: float = 5) -> dict[str, bool]:
    """Change each `[data-input]` of one `.calc` in turn: {keyword: whether `.calc-output`'s HTML changed within
    wait_s}."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    output = calc.find_element(By.CSS_SELECTOR, ".calc-output")
    changed = {}
    for element in calc.find_elements(By.CSS_SELECTOR, "[data-input]"):
        before = output.get_attribute("innerHTML")
        if not change_input(driver, element):
            continue
        try:
            WebDriverWait(driver, wait_s).until(lambda _, before=before: output.get_attribute("innerHTML") != before)
            changed[element.get_attribute("data-input")] = True
        except TimeoutException:
            changed[element.get_attribute("data-input")] = False
    return changed


def assert_calc_reacts(driver, calc, where: str) -> None:
    """Every input of one `.calc` that can take another value changes its `.calc-output`."""
    changed = exercise_calc(driver, calc)
    stuck = [name for name, moved in changed.items() if not moved]
    assert changed, f"{where}: a .calc with no [data-input] that can take another value"
    assert not stuck, f"{where}: .calc inputs whose change left .calc-output as it was: {stuck}"
