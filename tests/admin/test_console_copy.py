"""The Streams console during an initial sync: state ``copying`` with a progress bar
(copied of estimated, rate, ETA), the last copy in the notes, and the Resync button."""

from __future__ import annotations

import tempfile
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from flowwarden_django.models import StreamControl, StreamWorker
from flowwarden_django.streams.registry import register_stream
from flowwarden_django.streams.runtime.manager import StreamManager
from flowwarden_django.streams.spec import CheckpointSpec
from flowwarden_django.streams.stores import checkpoint_stores
from flowwarden_django.testkit.fake_source import FakeChangeSource, FakeOplog
from tests.admin.test_console import (
    CONSOLE,
    control_url,
    messages_of,
    row,
    staff,
)
from tests.support.browser import artifact_dir, start_chrome
from tests.support.lanes import on_lane

MEMORY = "flowwarden_django.streams.backends.memory."


def progress(**fields: Any) -> dict[str, Any]:
    started = timezone.now() - timedelta(seconds=10)
    return {
        "phase": "copying",
        "batch": 4,
        "last_id": '{"v": 4000}',
        "copied": 4000,
        "estimated": 10_000,
        "started_at": started.isoformat(),
        "updated_at": (started + timedelta(seconds=8)).isoformat(),
        "finished_at": None,
        "reason": "first start",
        **fields,
    }


@pytest.fixture
def copying(declare):
    declare("cc-copy")
    declare("cc-idle")
    now = timezone.now()
    StreamWorker.objects.create(
        stream_name="cc-copy", instance_id="host-a:1", state="copying", updated_at=now
    )
    store = checkpoint_stores["default"]
    store.save_initial_sync("cc-copy", progress(), expected_batch=None)
    finished = progress(
        phase="done",
        copied=250,
        estimated=250,
        reason="history lost",
        finished_at=(now - timedelta(minutes=3)).isoformat(),
    )
    store.save_initial_sync("cc-idle", finished, expected_batch=None)


@pytest.mark.django_db
def test_a_copy_shows_as_a_progress_bar_with_rate_and_eta(admin_client, copying):
    body = admin_client.get(CONSOLE).content.decode()
    copy = row(body, "cc-copy")
    assert "flowwarden-state-copying" in copy
    assert '<progress max="10000" value="4000">40%</progress>' in copy
    assert "copying (first start): 4,000 of ~10,000 (40%), 500/s, ETA 12s" in copy
    assert "flowwarden-resync" not in copy  # already copying
    idle = row(body, "cc-idle")
    assert "<progress" not in idle
    assert "last copy: copied 250 documents (history lost)" in idle
    assert "finished 3\xa0minutes ago" in idle
    assert f'href="{control_url("resync", "cc-idle")}"' in idle


@pytest.mark.django_db
def test_resync_confirms_then_asks_for_a_copy(copying):
    client = staff("control_stream")
    page = client.get(control_url("resync", "cc-idle")).content.decode()
    assert "Copy the collection of stream “cc-idle” again?" in page
    assert not StreamControl.objects.filter(stream_name="cc-idle").exists()
    response = client.post(control_url("resync", "cc-idle"), follow=True)
    assert messages_of(response) == [
        "Stream “cc-idle” will copy its collection again within 5 seconds."
    ]
    saved = checkpoint_stores["default"].find("cc-idle").initial_sync
    assert saved["phase"] == "copying" and saved["reason"] == "on demand"
    assert saved["requested_by"] == "staff"
    assert StreamControl.objects.get(stream_name="cc-idle").restart_requested_at is not None
    body = client.get(CONSOLE).content.decode()
    assert "copying (on demand): 0, waiting for a process to start it" in row(body, "cc-idle")


@pytest.mark.django_db
def test_a_resync_that_cannot_be_done_says_why(admin_client, declare):
    declare("cc-latest", checkpoint=CheckpointSpec(start_position="LATEST"))
    response = admin_client.post(control_url("resync", "cc-latest"), follow=True)
    (message,) = messages_of(response)
    assert message.startswith("Cannot resync: stream 'cc-latest' starts at LATEST")
    assert not StreamControl.objects.exists()
    assert checkpoint_stores["default"].find("cc-latest") is None


@pytest.fixture
def live_copy(settings):
    """A stream that copies 6,000 documents slowly, run by a manager in this process."""
    settings.FLOWWARDEN = {
        **settings.FLOWWARDEN,
        "CHECKPOINT_STORES": {"default": {"BACKEND": MEMORY + "InMemoryCheckpointStore"}},
        "STATUS_INTERVAL": "200ms",
    }
    oplog = FakeOplog()
    oplog.seed({"_id": i, "sku": f"sku-{i}"} for i in range(1, 6001))
    release = threading.Event()

    def on_snapshot(doc: Any) -> None:
        if doc["_id"] > 2400:
            release.wait(60)  # hold the copy at 40% while the browser looks
        time.sleep(0.0005)

    register_stream(
        "catalog",
        "products",
        database="shop",
        on_insert=lambda doc: None,
        on_snapshot=on_snapshot,
        checkpoint=CheckpointSpec(start_position="COPY_EXISTING", copy_batch_size=400),
    )
    manager = StreamManager(
        source_factory=lambda spec: FakeChangeSource(oplog), instance_id="web-1"
    )
    manager.start("catalog")
    yield release
    release.set()
    manager.stop_all(timeout=10)
    from flowwarden_django.streams import stream_registry

    stream_registry.unregister("catalog")


@on_lane("browser")
@pytest.mark.django_db(transaction=True)
def test_the_console_shows_a_live_copy_in_a_browser(live_server, live_copy, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    User.objects.create_superuser("operator", "operator@example.com", "s3cret-pass")
    screenshot = artifact_dir(tmp_path) / "admin-streams-copying.png"
    with tempfile.TemporaryDirectory(prefix="fw-chrome-") as profile_dir:
        driver = start_chrome(profile_dir)
        try:
            driver.set_window_size(1600, 800)
            wait = WebDriverWait(driver, 20)
            driver.get(f"{live_server.url}/admin/login/?next={CONSOLE}")
            wait.until(expected_conditions.presence_of_element_located((By.ID, "id_username")))
            driver.find_element(By.ID, "id_username").send_keys("operator")
            driver.find_element(By.ID, "id_password").send_keys("s3cret-pass")
            driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()

            def copy_shown(driver: Any) -> bool:
                driver.get(f"{live_server.url}{CONSOLE}")
                cells = driver.find_elements(By.CSS_SELECTOR, ".flowwarden-copy")
                return bool(cells) and "2,400 of ~6,000" in cells[0].text

            wait.until(copy_shown)
            state = driver.find_element(By.XPATH, "//tr[th/span[text()='catalog']]/td[1]")
            assert state.find_element(By.CSS_SELECTOR, ".flowwarden-state").text == "COPYING"
            bar = state.find_element(By.TAG_NAME, "progress")
            assert (bar.get_attribute("value"), bar.get_attribute("max")) == ("2400", "6000")
            assert "copying (first start): 2,400 of ~6,000 (40%)" in state.text
            assert "/s, ETA " in state.text
            driver.save_screenshot(str(screenshot))
        finally:
            driver.quit()
    assert screenshot.stat().st_size > 0
