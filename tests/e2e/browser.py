"""Headless Chromium for browser tests: Debian's ``chromium`` driven through Debian's
``chromedriver`` with Selenium. The paths are explicit, so Selenium Manager never looks for (or
downloads) a browser; a machine without them fails the test, loudly, with how to install them."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WINDOW = (1680, 1250)
#: flags that let Chromium run headless as root on a CI box with nothing to phone home to
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
)


@contextmanager
def chromium(downloads: Path | None = None) -> Iterator[webdriver.Chrome]:
    """A fresh headless Chromium (its own profile directory, removed afterwards); files the
    page downloads land in ``downloads`` when given."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing: the console tests need Debian's Chromium "
            "(apt-get install -y chromium chromium-driver; .ci/run does it)"
        )
    profile = tempfile.mkdtemp(prefix="convplane-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    if downloads is not None:
        options.add_experimental_option(
            "prefs",
            {"download.default_directory": str(downloads), "download.prompt_for_download": False},
        )
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
