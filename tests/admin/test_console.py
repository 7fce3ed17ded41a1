"""The admin "Streams" console: status of every stream, and Start / Stop / Restart."""

import re
import tempfile

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from flowwarden_django.models import StreamControl, StreamWorker
from flowwarden_django.streams.spec import DeadLetterQueueSpec
from tests.support.browser import start_chrome
from tests.support.lanes import on_lane
from tests.support.status_rows import checkpoint, control, dead_letter

pytestmark = pytest.mark.django_db

CONSOLE = reverse("admin:flowwarden_django_streamworker_changelist")


def control_url(action: str, stream: str) -> str:
    return reverse(
        "admin:flowwarden_django_streamworker_control",
        kwargs={"action": action, "stream_name": stream},
    )


@pytest.fixture
def streams(declare):
    """``sc-orders`` led by host-a with host-b standing by, ``sc-paused`` paused, ``sc-off``
    disabled."""
    declare("sc-orders", deployment_mode="SINGLE_LEADER", dead_letter_queue=DeadLetterQueueSpec())
    declare("sc-paused")
    declare("sc-off", enabled=False)
    now = timezone.now()
    leader, standby = ("host-a:1", "running", "LEADER"), ("host-b:1", "standby", "STANDBY")
    for instance, state, role in (leader, standby):
        StreamWorker.objects.create(
            stream_name="sc-orders",
            instance_id=instance,
            state=state,
            role=role,
            started_at=now,
            last_event_at=now,
            events=12,
            updated_at=now,
        )
    control("sc-paused", paused=True)
    checkpoint("sc-orders", processed=1, heartbeat=1)
    dead_letter("sc-orders")
    dead_letter("sc-orders")


def staff(*permissions: str) -> Client:
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def row(body: str, stream: str) -> str:
    match = re.search(
        rf'<th class="field-name"><span [^>]*>{stream}</span><span(.*?)</tr>', body, re.S
    )
    assert match, f"no row for {stream}"
    return match.group(1)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# -- the page ----------------------------------------------------------------------------


def test_superuser_sees_every_stream_with_buttons(admin_client, streams):
    response = admin_client.get(CONSOLE)
    assert response.status_code == 200
    body = response.content.decode()
    assert "<h1>Streams</h1>" in body
    assert 'class="breadcrumbs"' in body and 'id="result_list"' in body
    orders = row(body, "sc-orders")
    assert "flowwarden-state-running" in orders and "SINGLE_LEADER" in orders
    assert '<code title="host-a:1">host-a:1</code> running (leader)' in orders
    assert '<code title="host-b:1">host-b:1</code> standby (standby)' in orders
    dlq = reverse("admin:flowwarden_django_deadletter_changelist")
    assert f'<a href="{dlq}?stream_name=sc-orders&amp;status__exact=PENDING">2</a>' in orders
    assert f'href="{control_url("stop", "sc-orders")}"' in orders
    assert f'href="{control_url("restart", "sc-orders")}"' in orders
    assert "flowwarden-start" not in orders
    paused = row(body, "sc-paused")
    assert "flowwarden-state-paused" in paused
    assert f'href="{control_url("start", "sc-paused")}"' in paused
    assert "flowwarden-stop" not in paused and "flowwarden-restart" not in paused
    off = row(body, "sc-off")
    assert "disabled" in off and "button" not in off


def test_a_stopped_stream_says_what_starts_it(admin_client, declare):
    declare("sc-idle")
    idle = row(admin_client.get(CONSOLE).content.decode(), "sc-idle")
    assert "flowwarden-state-stopped" in idle
    assert (
        '<span class="flowwarden-note">no process runs it: start `manage.py flowwarden_streams '
        "run` (or a StreamManager) under your process manager</span>"
    ) in idle


def test_the_app_index_links_to_the_console(admin_client, streams):
    body = admin_client.get(reverse("admin:app_list", args=["flowwarden_django"])).content
    assert f'href="{CONSOLE}"'.encode() in body


def test_staff_without_permissions_gets_403(streams):
    client = staff()
    assert client.get(CONSOLE).status_code == 403
    assert client.get(control_url("stop", "sc-orders")).status_code == 403
    assert client.post(control_url("stop", "sc-orders")).status_code == 403
    assert not StreamControl.objects.filter(stream_name="sc-orders").exists()


def test_view_permission_shows_the_page_without_buttons(streams):
    client = staff("view_streamworker")
    response = client.get(CONSOLE)
    assert response.status_code == 200
    body = response.content.decode()
    assert "flowwarden-state-running" in row(body, "sc-orders")
    assert "/control/" not in body and "column-actions" not in body
    assert client.get(control_url("stop", "sc-orders")).status_code == 403
    assert client.post(control_url("stop", "sc-orders")).status_code == 403
    assert not StreamControl.objects.filter(stream_name="sc-orders").exists()


@pytest.mark.parametrize("rule", ["none", "flowwarden_django.control_stream"])
def test_health_details_decide_whether_hosts_and_errors_show(streams, settings, rule):
    """Issue 24: with ``HEALTH_DETAILS`` ``"none"`` the console showed a viewer the
    instances' host names and their last errors (event data)."""
    from flowwarden_django.streams.operations.status import instance_key

    StreamWorker.objects.filter(instance_id="host-b:1").update(
        last_error="ValueError: card 4111-1111 declined"
    )
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "HEALTH_DETAILS": rule}
    body = staff("view_streamworker").get(CONSOLE).content.decode()
    orders = row(body, "sc-orders")
    assert "host-a" not in body and "host-b" not in body and "4111" not in body
    key_a, key_b = instance_key("host-a:1"), instance_key("host-b:1")
    assert f'<code title="{key_a}">{key_a}</code> running (leader)' in orders
    assert f'<code title="{key_b}">{key_b}</code> standby' in orders

    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "HEALTH_DETAILS": "staff"}
    body = staff_client_again().get(CONSOLE).content.decode()
    assert "host-b:1" in body and "4111-1111 declined" in body


def staff_client_again() -> Client:
    client = Client()
    client.force_login(User.objects.get(username="staff"))
    return client


# -- control -----------------------------------------------------------------------------


def test_stop_confirms_then_pauses_the_stream(streams):
    client = staff("control_stream")
    page = client.get(control_url("stop", "sc-orders"))
    assert page.status_code == 200
    body = page.content.decode()
    assert "Stop the stream “sc-orders”?" in body
    assert 'name="csrfmiddlewaretoken"' in body and 'method="post"' in body
    assert f'href="{CONSOLE}" class="button cancel-link"' in body
    # Looking is not doing.
    assert not StreamControl.objects.filter(stream_name="sc-orders").exists()
    response = client.post(control_url("stop", "sc-orders"), follow=True)
    assert response.redirect_chain == [(CONSOLE, 302)]
    saved = StreamControl.objects.get(stream_name="sc-orders")
    assert (saved.paused, saved.updated_by) == (True, "staff")
    assert messages_of(response) == [
        "Stream “sc-orders” is paused: every process stops it within 5 seconds."
    ]


def test_start_unpauses(streams):
    client = staff("control_stream")
    response = client.post(control_url("start", "sc-paused"), follow=True)
    assert StreamControl.objects.get(stream_name="sc-paused").paused is False
    assert messages_of(response) == ["Stream “sc-paused” will start within 5 seconds."]


def test_restart_requests_a_restart(streams):
    client = staff("control_stream")
    response = client.post(control_url("restart", "sc-orders"), follow=True)
    saved = StreamControl.objects.get(stream_name="sc-orders")
    assert saved.paused is False
    assert saved.restart_requested_at is not None
    assert saved.restart_requested_at == saved.updated_at
    assert messages_of(response) == ["Stream “sc-orders” will restart within 5 seconds."]


def test_a_second_restart_moves_the_request_forward(streams):
    client = staff("control_stream")
    client.post(control_url("restart", "sc-orders"))
    first = StreamControl.objects.get(stream_name="sc-orders").restart_requested_at
    client.post(control_url("restart", "sc-orders"))
    assert StreamControl.objects.get(stream_name="sc-orders").restart_requested_at >= first
    assert StreamControl.objects.count() == 2  # sc-orders and the fixture's sc-paused


@pytest.mark.parametrize(
    ("action", "stream", "message"),
    [
        ("start", "sc-orders", "Stream “sc-orders” is not paused."),
        ("restart", "sc-paused", "Stream “sc-paused” is paused; start it first."),
        ("stop", "sc-off", "Stream “sc-off” is disabled in its declaration"),
    ],
)
def test_actions_that_do_not_apply_are_refused(admin_client, streams, action, stream, message):
    before = list(StreamControl.objects.values())
    for method in (admin_client.get, admin_client.post):
        response = method(control_url(action, stream), follow=True)
        assert response.redirect_chain == [(CONSOLE, 302)]
        assert messages_of(response)[0].startswith(message)
    assert list(StreamControl.objects.values()) == before


def test_unknown_stream_is_404(admin_client, streams):
    assert admin_client.get(control_url("stop", "no-such-stream")).status_code == 404
    assert admin_client.post(control_url("stop", "no-such-stream")).status_code == 404


def test_post_needs_the_csrf_token(streams):
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="control_stream"))
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(control_url("stop", "sc-orders")).status_code == 403
    page = client.get(control_url("stop", "sc-orders")).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = client.post(control_url("stop", "sc-orders"), {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert StreamControl.objects.get(stream_name="sc-orders").paused is True


def test_stream_names_with_slashes(admin_client, declare):
    declare("team/orders")
    url = control_url("stop", "team/orders")
    assert admin_client.get(url).status_code == 200
    admin_client.post(url)
    assert StreamControl.objects.get(stream_name="team/orders").paused is True


def test_a_status_that_cannot_be_read_is_explained(admin_client, declare):
    declare("sc-dup")
    declare("sc-dup")
    response = admin_client.get(CONSOLE)
    assert response.status_code == 200
    assert "The stream status cannot be read:" in response.content.decode()
    assert "declared twice" in response.content.decode()


@on_lane("browser")
@pytest.mark.django_db(transaction=True)
def test_stop_a_stream_in_a_browser(live_server, streams):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    User.objects.create_superuser("operator", "operator@example.com", "s3cret-pass")
    with tempfile.TemporaryDirectory(prefix="fw-chrome-") as profile_dir:
        driver = start_chrome(profile_dir)
        try:
            wait = WebDriverWait(driver, 15)
            driver.get(f"{live_server.url}/admin/")
            wait.until(expected_conditions.presence_of_element_located((By.ID, "id_username")))
            driver.find_element(By.ID, "id_username").send_keys("operator")
            driver.find_element(By.ID, "id_password").send_keys("s3cret-pass")
            driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()

            # The console is the "Stream workers" entry of the app.
            wait.until(
                expected_conditions.element_to_be_clickable((By.LINK_TEXT, "Stream workers"))
            )
            # The workers report in, as live ones do every STATUS_INTERVAL: starting the
            # browser and logging in may have taken longer than a report stays fresh.
            StreamWorker.objects.filter(stream_name="sc-orders").update(updated_at=timezone.now())
            driver.find_element(By.LINK_TEXT, "Stream workers").click()
            wait.until(expected_conditions.presence_of_element_located((By.ID, "result_list")))
            assert driver.find_element(By.CSS_SELECTOR, "#content h1").text == "Streams"
            table = driver.find_element(By.ID, "result_list").text
            assert "sc-orders" in table and "RUNNING" in table.upper()

            # Stop → confirmation page → "Yes, I'm sure" → back on the console, with a message.
            row = driver.find_element(By.XPATH, "//tr[th/span[text()='sc-orders']]")
            row.find_element(By.LINK_TEXT, "Stop").click()
            confirm = (By.CSS_SELECTOR, "#content form [type=submit]")
            wait.until(expected_conditions.element_to_be_clickable(confirm))
            assert "Stop the stream “sc-orders”?" in driver.find_element(By.ID, "content").text
            driver.find_element(*confirm).click()
            wait.until(expected_conditions.presence_of_element_located((By.ID, "result_list")))
            message = driver.find_element(By.CSS_SELECTOR, ".messagelist .success").text
            assert message.startswith("Stream “sc-orders” is paused")
            row = driver.find_element(By.XPATH, "//tr[th/span[text()='sc-orders']]")
            assert row.find_element(By.LINK_TEXT, "Start")
        finally:
            driver.quit()
    assert StreamControl.objects.get(stream_name="sc-orders").paused is True
