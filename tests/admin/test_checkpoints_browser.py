"""The checkpoints admin page in headless Chromium, against the live test server."""

import tempfile
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from flowwarden_django.streams.backends.orm import OrmCheckpointStore
from tests.support.browser import start_chrome
from tests.support.lanes import on_lane

PROCESSED = "8263A1B2C3000000012B022C0100296E5A1004" + "EF" * 20 + "04"
SEEN = "8263A1B2C4000000022B022C0100296E5A1004" + "12" * 20 + "04"


@on_lane("browser")
@pytest.mark.django_db(transaction=True)
def test_checkpoints_admin_in_a_browser(live_server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    User.objects.create_superuser("operator", "operator@example.com", "s3cret-pass")
    store = OrmCheckpointStore()
    now = timezone.now()
    store.save_processed("orders", {"_data": PROCESSED}, now - timedelta(minutes=4, seconds=5))
    store.save_seen(
        "orders", {"_data": SEEN}, now - timedelta(minutes=1, seconds=5), heartbeat_at=now
    )
    store.save_heartbeat("payments", now - timedelta(minutes=9, seconds=5))

    screenshot = tmp_path / "admin-checkpoints.png"
    with tempfile.TemporaryDirectory(prefix="fw-chrome-") as profile_dir:
        driver = start_chrome(profile_dir)
        try:
            wait = WebDriverWait(driver, 15)

            # Log in through the real admin form.
            driver.get(f"{live_server.url}/admin/")
            wait.until(expected_conditions.presence_of_element_located((By.ID, "id_username")))
            driver.find_element(By.ID, "id_username").send_keys("operator")
            driver.find_element(By.ID, "id_password").send_keys("s3cret-pass")
            driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()

            # Open the changelist from the admin index.
            wait.until(
                expected_conditions.element_to_be_clickable((By.LINK_TEXT, "Stream checkpoints"))
            )
            driver.find_element(By.LINK_TEXT, "Stream checkpoints").click()
            wait.until(expected_conditions.presence_of_element_located((By.ID, "result_list")))
            assert driver.find_element(By.CSS_SELECTOR, "#content h1").text == "Stream checkpoints"
            table = driver.find_element(By.ID, "result_list").text
            assert "orders" in table and "payments" in table
            assert "4 minutes ago" in table and "9 minutes ago" in table
            assert f"{PROCESSED[:19]}…" in table

            # The admin stylesheet is served and applied.
            header_background = driver.execute_script(
                "return getComputedStyle(document.getElementById('header')).backgroundColor"
            )
            assert header_background not in ("", "transparent", "rgba(0, 0, 0, 0)")
            driver.save_screenshot(str(screenshot))

            # The detail page shows the decoded token.
            driver.find_element(By.LINK_TEXT, "orders").click()
            wait.until(expected_conditions.presence_of_element_located((By.ID, "content-main")))
            tokens = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "pre.flowwarden-token")]
            assert f'"_data": "{PROCESSED}"' in tokens[0]
            assert f'"_data": "{SEEN}"' in tokens[1]
            driver.save_screenshot(str(tmp_path / "admin-checkpoint-detail.png"))
        finally:
            driver.quit()

    # A styled page is far larger than a blank one (a blank 1400x900 PNG is ~10 kB).
    assert screenshot.read_bytes().startswith(b"\x89PNG")
    assert screenshot.stat().st_size > 30_000
