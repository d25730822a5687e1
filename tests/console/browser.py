"""A headless Chromium driven by Selenium (Debian's ``chromium`` and ``chromedriver``; ``make
tools`` installs them), and the in-page checks of the console's accessibility."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@contextmanager
def chromium(
    width: int = 1366, height: int = 900, extra: tuple[str, ...] = ()
) -> Iterator[webdriver.Chrome]:
    """A headless Chromium with a laptop's screen (``extra``: more of its flags); quit (its
    processes ended) on exit."""
    driver_path = shutil.which("chromedriver") or CHROMEDRIVER
    browser = shutil.which("chromium") or CHROMIUM
    if not shutil.which(driver_path) or not shutil.which(browser):
        pytest.fail("chromium or chromedriver is missing: run 'make tools'")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--force-device-scale-factor=1",
        f"--window-size={width},{height}",
        "--lang=en-US",
        *extra,
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


AUDIT = (Path(__file__).parent / "audit.js").read_text()

# The page's cumulative layout shift not caused by the user's input (buffered from the load).
LAYOUT_SHIFT = r"""
const observer = new PerformanceObserver(() => {});
observer.observe({type: "layout-shift", buffered: true});
const entries = observer.takeRecords();
observer.disconnect();
return [entries.length, entries.filter((e) => !e.hadRecentInput).reduce((s, e) => s + e.value, 0)];
"""


def audit(driver: webdriver.Chrome) -> list[Any]:
    """What fails the page's accessibility checks (an empty list when nothing does)."""
    found: list[Any] = driver.execute_script(AUDIT)
    return found


def layout_shift(driver: webdriver.Chrome) -> float:
    """The page's cumulative layout shift since it loaded, user input excluded."""
    _, total = driver.execute_script(LAYOUT_SHIFT)
    return float(total)
