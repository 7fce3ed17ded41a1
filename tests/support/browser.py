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


class BrowserPage:
    """A Chromium driver, the server's base URL, and the waits the browser tests use."""

    def __init__(self, driver, base_url: str) -> None:
        from selenium.webdriver.support.wait import WebDriverWait

        self.driver = driver
        self.base_url = base_url
        self.wait = WebDriverWait(driver, 20)

    def present(self, css: str):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions

        return self.wait.until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css))
        )

    def shows(self, css: str, text: str) -> bool:
        """Wait until an element of *css* holds *text*: after a click that leaves for a
        new page, an element of the old one may still match (it goes stale, and this
        looks again)."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions

        return self.wait.until(
            expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, css), text)
        )

    def click(self, css: str) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions

        self.wait.until(expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, css))).click()
