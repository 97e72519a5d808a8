"""The page in a real headless Chromium (Debian's chromium and chromium-driver, driven by Selenium),
over a real `qlactors web` and `qlactors edge`: sign in with a token, see a task, press "Run now",
watch the run go from queued to succeeded and its log appear, cancel a long run, filter the runs.
A screenshot of a phone-sized window is saved as a test artifact (test-artifacts/, or
$QLACTORS_TEST_ARTIFACTS)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from edge_harness import Home, wait_until
from requires import unavailable
from web_rigs import WebServer, new_token

ARTIFACTS = Path(os.environ.get("QLACTORS_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
PHONE = (390, 844)


def _browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as err:
        unavailable("selenium", str(err))
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        unavailable("chromium and chromium-driver", "not on PATH (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    # A phone's screen (a desktop window cannot be made this narrow).
    options.add_experimental_option("mobileEmulation", {"deviceMetrics": {
        "width": PHONE[0], "height": PHONE[1], "pixelRatio": 2.0}})
    return webdriver.Chrome(service=Service(driver), options=options)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("page")
    home = Home(tmp, config="[runtime]\nslots = 2\n")
    server = browser = None
    try:
        home.main("task", "add", "greet", "--cron", "*/5 * * * *", "--",
                  "sleep 1; echo hello from the page; echo second line")
        home.main("task", "add", "sleeper", "--", "echo going to sleep; sleep 120")
        home.start_edge()
        token = new_token(home, "browser")
        server = WebServer(tmp, ["--home", str(home.path)])
        browser = _browser()
        browser.get(f"http://127.0.0.1:{server.port}/")
        yield browser, server, token
    finally:
        if browser is not None:
            browser.quit()
        if server is not None:
            server.stop()
        home.close()


def _by_id(browser, element_id: str):
    from selenium.webdriver.common.by import By

    return browser.find_element(By.ID, element_id)


def _css(browser, selector: str):
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.CSS_SELECTOR, selector)


def _click(browser, selector: str) -> None:
    """Click what `selector` finds, again if the page redrew it between finding and clicking."""
    from selenium.common.exceptions import StaleElementReferenceException

    def clicked() -> bool:
        try:
            _css(browser, selector)[0].click()
            return True
        except (StaleElementReferenceException, IndexError):
            return False
    wait_until(clicked, 10, f"{selector} to be clicked", interval=0.1)


def _wait(browser, condition, what: str, timeout: float = 30.0):
    """Poll `condition`; an element the page redrew while it was read counts as not yet."""
    from selenium.common.exceptions import StaleElementReferenceException

    def holds():
        try:
            return condition()
        except (StaleElementReferenceException, IndexError):
            return False
    return wait_until(holds, timeout, lambda: f"{what}; page:\n{_by_id(browser, 'app').text[:2000]}",
                      interval=0.2)


def test_sign_in_run_a_task_and_watch_its_log_then_cancel_a_long_run_and_filter(page):
    browser, server, token = page
    # A wrong token is refused with the server's words, and the page stays on the sign-in form.
    _by_id(browser, "token-input").send_keys("qlt_wrong")
    _by_id(browser, "token-form").submit()
    _wait(browser, lambda: "unknown or revoked" in _by_id(browser, "sign-in-error").text, "the refusal")
    _by_id(browser, "token-input").clear()
    _by_id(browser, "token-input").send_keys(token)
    _by_id(browser, "token-form").submit()
    _wait(browser, lambda: _css(browser, '#tasks tr[data-task="greet"]'), "the task greet")
    row = _css(browser, '#tasks tr[data-task="greet"]')[0]
    assert "Every 5 minutes" in row.text  # the schedule in words
    assert "never run" in row.text

    _click(browser, '#tasks tr[data-task="greet"] button.run-now')
    states = set()

    def finished() -> bool:
        facts = _css(browser, "#run-facts")
        if facts and facts[0].get_attribute("data-state"):
            states.add(facts[0].get_attribute("data-state"))
        return "succeeded" in states
    _wait(browser, finished, "the run to succeed")
    # It was seen before it ended (queued, dispatching or running: the page refreshes every 2 s).
    assert states - {"succeeded"} and states <= {"queued", "dispatching", "running", "succeeded"}, states
    _wait(browser, lambda: _by_id(browser, "log").get_attribute("data-complete") == "true", "the log's end")
    assert _by_id(browser, "log").text == "hello from the page\nsecond line"
    _wait(browser, lambda: "succeeded" in _css(browser, '#tasks tr[data-task="greet"]')[0].text, "the last result")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "web-page-run.png"))

    _click(browser, '#tasks tr[data-task="sleeper"] button.run-now')
    _wait(browser, lambda: _by_id(browser, "run-facts").get_attribute("data-state") == "running"
          and "going to sleep" in _by_id(browser, "log").text, "the long run to run")
    _click(browser, "#cancel-run")
    _wait(browser, lambda: _by_id(browser, "run-facts").get_attribute("data-state") == "cancelled",
          "the long run to be cancelled")

    from selenium.webdriver.support.ui import Select

    Select(_by_id(browser, "filter-state")).select_by_visible_text("cancelled")
    _wait(browser, lambda: {r.get_attribute("data-state") for r in _css(browser, "#runs tbody tr")} == {"cancelled"},
          "only cancelled runs listed")
    Select(_by_id(browser, "filter-state")).select_by_visible_text("all")
    _wait(browser, lambda: {r.get_attribute("data-state") for r in _css(browser, "#runs tbody tr")}
          == {"cancelled", "succeeded"}, "every run listed again")
    assert browser.save_screenshot(str(ARTIFACTS / "web-page-filtered.png"))
    # A phone-sized window: nothing overflows the page sideways except inside the scrolling tables.
    width = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[1] == PHONE[0] and width[0] <= width[1], width


def test_a_notifications_link_opens_its_run(page):
    """A notification's `url` is the page with `#run=ID`: the page opens that run (the token is
    the one this browser signed in with)."""
    browser, server, token = page
    runs = server.request("GET", "/api/v1/runs?task=greet", token=token).json()["runs"]
    run_id = runs[-1]["id"]
    browser.get(f"http://127.0.0.1:{server.port}/#run={run_id}")
    _wait(browser, lambda: _by_id(browser, "run-id").text == run_id, "the linked run to open")
    _wait(browser, lambda: _by_id(browser, "log").get_attribute("data-complete") == "true", "its log")
    assert "hello from the page" in _by_id(browser, "log").text
