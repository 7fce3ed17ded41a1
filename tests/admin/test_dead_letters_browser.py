"""The dead-letter console in headless Chromium, against the live test server.

The live server runs in this process (pytest-django's ``live_server`` thread), so
"fixing" the poison handler is flipping a flag here; the replay the browser
starts then runs the fixed handler in the server thread. The poison entry is parked
by the stream runtime itself, after its retry policy.
"""

import tempfile

import pytest
from bson import ObjectId
from django.contrib.auth.models import User
from django.utils import timezone

from flowwarden_django.models import DeadLetter as DeadLetterRow
from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.streams.dlq import DeadLetter
from flowwarden_django.streams.registry import replace_spec, stream_registry
from flowwarden_django.streams.runtime import StreamConsumer
from flowwarden_django.streams.spec import DeadLetterQueueSpec, RetryPolicySpec
from flowwarden_django.streams.stores import dlq_stores
from flowwarden_django.testkit.fake_source import FakeChangeSource
from tests.admin.test_dead_letters import PoisonStream, park
from tests.support.browser import artifact_dir, start_chrome
from tests.support.lanes import on_lane
from tests.testapp.models import Effect

STREAM = "dlq-browser-orders"
OTHER_STREAM = "dlq-browser-payments"


def park_through_the_runtime(stream: str, order_id: int) -> DeadLetter:
    """Deliver one insert to the stream's consumer (fake change source, retry policy
    of three attempts, the ORM DLQ): the handler fails every attempt, the runtime
    parks the event, and the stream goes on to the next one."""
    oid = ObjectId(f"65a1b2c3d4e5f6{order_id:010x}")
    source = FakeChangeSource()
    checkpoints = InMemoryCheckpointStore()
    at = timezone.now()
    checkpoints.save_seen(stream, source.initial_position(), at, heartbeat_at=at)
    source.oplog.insert({"_id": oid, "orderId": order_id})
    spec = replace_spec(
        stream_registry.get(stream),
        retry_policy=RetryPolicySpec(max_attempts=3, initial_delay="1ms", jitter=False),
        dead_letter_queue=DeadLetterQueueSpec(),
    )
    consumer = StreamConsumer(spec, checkpoints, lambda s: source)
    consumer.run(burst=True)
    assert (consumer.errors, consumer.dead_lettered, consumer.restarts) == (3, 1, 0)
    (entry,) = dlq_stores["default"].find_by_stream(stream)
    return entry


@pytest.fixture
def poison_streams():
    """Two registered streams whose handlers fail; unregistered afterwards."""
    streams = [PoisonStream(STREAM).register(), PoisonStream(OTHER_STREAM).register()]
    try:
        yield streams
    finally:
        for stream in streams:
            stream.unregister()


@on_lane("browser")
@pytest.mark.django_db(transaction=True)
def test_replay_a_poison_event_after_fixing_its_handler(live_server, tmp_path, poison_streams):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.wait import WebDriverWait

    orders, _ = poison_streams
    User.objects.create_superuser("operator", "operator@example.com", "s3cret-pass")
    poison = park_through_the_runtime(STREAM, 42)
    assert poison.attempts == 3 and poison.status == "PENDING"
    park(OTHER_STREAM, 7)

    artifacts = artifact_dir(tmp_path)
    screenshot = artifacts / "admin-dead-letters.png"
    with tempfile.TemporaryDirectory(prefix="fw-chrome-") as profile_dir:
        driver = start_chrome(profile_dir)
        try:
            # Wide enough for every column next to the navigation sidebar and the filters.
            driver.set_window_size(1700, 1000)
            wait = WebDriverWait(driver, 15)

            def present(css: str):
                return wait.until(
                    expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css))
                )

            # Log in through the real admin form.
            driver.get(f"{live_server.url}/admin/")
            present("#id_username").send_keys("operator")
            driver.find_element(By.ID, "id_password").send_keys("s3cret-pass")
            driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()

            # Open the dead-letter changelist from the admin index: both entries pending.
            wait.until(expected_conditions.element_to_be_clickable((By.LINK_TEXT, "Dead letters")))
            driver.find_element(By.LINK_TEXT, "Dead letters").click()
            present("#result_list")
            assert len(driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) == 2

            # Filter by the poison stream.
            driver.find_element(By.CSS_SELECTOR, "#changelist-filter").find_element(
                By.LINK_TEXT, STREAM
            ).click()
            wait.until(expected_conditions.url_contains(f"stream_name={STREAM}"))
            rows = driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
            assert len(rows) == 1
            assert "PaymentRejectedError" in rows[0].text and "Pending" in rows[0].text
            header_background = driver.execute_script(
                "return getComputedStyle(document.getElementById('header')).backgroundColor"
            )
            assert header_background not in ("", "transparent", "rgba(0, 0, 0, 0)")
            driver.save_screenshot(str(screenshot))

            # Open the entry: the stack trace of the handler's failure.
            rows[0].find_element(By.CSS_SELECTOR, "th a").click()
            trace = present("pre.flowwarden-stack-trace").text
            assert trace.startswith("Traceback (most recent call last):")
            assert "in on_insert" in trace
            assert "PaymentRejectedError: payment service rejected order 42" in trace
            document = driver.find_elements(By.CSS_SELECTOR, "pre.flowwarden-bson")[1].text
            assert '"orderId": 42' in document
            driver.save_screenshot(str(artifacts / "admin-dead-letter-detail.png"))

            # The handler is fixed (here, in the server's process).
            orders.fixed = True

            # Back to the filtered list; select the entry and replay it.
            driver.find_element(By.CSS_SELECTOR, ".submit-row a.closelink").click()
            present("#result_list")
            assert f"stream_name={STREAM}" in driver.current_url
            driver.find_element(By.CSS_SELECTOR, "#result_list input.action-select").click()
            Select(driver.find_element(By.NAME, "action")).select_by_visible_text(
                "Replay selected dead letters"
            )
            driver.find_element(By.CSS_SELECTOR, "#changelist-form button[name=index]").click()

            # The confirmation page lists the entry; confirm.
            entries = present("#flowwarden-dlq-entries").text
            assert driver.find_element(By.CSS_SELECTOR, "#content h1").text == (
                "Replay dead letters"
            )
            assert poison.id in entries and STREAM in entries
            driver.save_screenshot(str(artifacts / "admin-dead-letters-confirm-replay.png"))
            driver.find_element(By.CSS_SELECTOR, ".submit-row input[type=submit]").click()

            # Back on the changelist: a success message, and the entry replayed.
            success = present(".messagelist .success").text
            assert success == "Replayed 1 dead letter."
            status = driver.find_element(By.CSS_SELECTOR, "#result_list td.field-status_and_counts")
            assert status.text == "Replayed\n3 attempts, 1 replay"
            badge = status.find_element(By.CSS_SELECTOR, "[data-status]")
            assert badge.get_attribute("data-status") == "REPLAYED"
            driver.save_screenshot(str(artifacts / "admin-dead-letters-replayed.png"))
        finally:
            driver.quit()

    # The handler's effect was written once, and only the fixed stream's entry moved.
    assert list(Effect.objects.values_list("order_id", "stream")) == [(42, STREAM)]
    statuses = dict(DeadLetterRow.objects.values_list("stream_name", "status"))
    assert statuses == {STREAM: "REPLAYED", OTHER_STREAM: "PENDING"}
    # A styled page is far larger than a blank one (a blank 1400x900 PNG is ~10 kB).
    assert screenshot.read_bytes().startswith(b"\x89PNG")
    assert screenshot.stat().st_size > 30_000
