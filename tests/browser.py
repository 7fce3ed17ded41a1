"""Headless Chromium for the browser tests (the ``browser`` lane): admin pages and the demo."""

import shutil

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
