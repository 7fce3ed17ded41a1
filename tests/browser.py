"""Headless Chromium for the browser tests (the ``browser`` lane): admin pages and the demo."""

import os
import shutil
from pathlib import Path

CHROME_ARGUMENTS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,900",
]


def start_chrome(profile_dir: str):
    """Headless Debian Chromium with a throwaway profile, driven by the system chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in [*CHROME_ARGUMENTS, f"--user-data-dir={profile_dir}"]:
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    driver.set_page_load_timeout(30)
    return driver


def artifact_dir(tmp_path: Path) -> Path:
    """``FLOWWARDEN_ARTIFACTS`` (else ``FLOWWARDEN_TEST_ARTIFACTS``, which CI sets and keeps)
    when set, else the test's tmp dir: where screenshots go."""
    configured = os.environ.get("FLOWWARDEN_ARTIFACTS") or os.environ.get(
        "FLOWWARDEN_TEST_ARTIFACTS"
    )
    directory = Path(configured) if configured else tmp_path
    directory.mkdir(parents=True, exist_ok=True)
    return directory
