"""What ``/flowwarden/health/`` and ``/flowwarden/metrics/`` show, and to whom.

Anonymous callers get status and counts only: a card number in a worker's
``last_error``, the worker's host name and a store's connection string must not
come out, nor the database's host and port when the database is down. Staff (or
the holders of ``FLOWWARDEN["HEALTH_DETAILS"]``'s permission) get the details.
``FLOWWARDEN["METRICS_TOKEN"]`` puts the metrics behind a bearer token.

Runs on SQLite and on PostgreSQL (every model routed there). The clock is pinned
to ``NOW`` so the stored worker rows are fresh.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.checks import run_checks
from django.db import connections
from django.test import Client
from django.test.utils import override_settings
from django.utils import timezone

from flowwarden_django.models import StreamWorker
from flowwarden_django.streams.dlq import DlqStore
from flowwarden_django.streams.operations.status import instance_key
from flowwarden_django.streams.registry import register_stream, stream_registry
from flowwarden_django.streams.spec import DeadLetterQueueSpec
from tests.support.lanes import lane_marks
from tests.support.services import free_port
from tests.support.status_rows import NOW, checkpoint, worker

pytestmark = pytest.mark.django_db(transaction=True)

HEALTH = "/flowwarden/health/"
METRICS = "/flowwarden/metrics/"

STREAM = "hx-orders"
#: What an insert's field held; the handler's exception quoted it.
CARD = "card 4111 1111 1111 1111 exp 12/29"
HOST = "db-worker-7.internal.example:4242"
STANDBY_HOST = "db-worker-8.internal.example:77"
GONE_HOST = "db-worker-9.internal.example:99"
CONNECTION_STRING = "postgres://admin:hunter2@10.9.8.7:5432/dlq"
#: Nothing of these may reach a caller without details. ("4111 1111", not "4111": the
#: metrics' float timestamps may hold those four digits, never the space.)
SECRETS = ("4111 1111", "12/29", "internal.example", "hunter2", "10.9.8.7")

DLQ_STORES = {
    "default": {"BACKEND": "flowwarden_django.streams.backends.orm.OrmDlqStore"},
    "broken": {"BACKEND": f"{__name__}.UnreachableDlqStore"},
}


class UnreachableDlqStore(DlqStore):
    """A DLQ store whose server is down; its driver's message names the server."""

    def save(self, entry: Any, policy: Any) -> None:
        pass

    def count(self, stream_name: str) -> int:
        raise ConnectionError(f"cannot connect to {CONNECTION_STRING}: connection refused")


class Route:
    """A database router: flowwarden's models to *flowwarden*, every other model to *rest*."""

    def __init__(self, rest: str, flowwarden: str | None = None) -> None:
        self.rest, self.flowwarden = rest, flowwarden or rest

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return self.flowwarden if model._meta.app_label == "flowwarden_django" else self.rest

    db_for_write = db_for_read

    def allow_relation(self, *objects: Any, **hints: Any) -> bool:
        return True


LANES = [
    pytest.param("default", id="sqlite"),
    pytest.param(
        "postgres",
        marks=lane_marks("postgres", databases=["default", "postgres"], transaction=True),
        id="postgres",
    ),
]


@pytest.fixture(params=LANES)
def lane(request: pytest.FixtureRequest) -> Iterator[str]:
    """The database alias every model is routed to."""
    with override_settings(DATABASE_ROUTERS=[Route(request.param)]):
        yield request.param
    connections[request.param].close()


@pytest.fixture(autouse=True)
def frozen_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timezone, "now", lambda: NOW)


@pytest.fixture
def leaky_stream(lane: str) -> Iterator[str]:
    """A SINGLE_LEADER stream that crashed on a card number, with a leader, a standby,
    a gone process and an unreachable DLQ store whose error names its server."""
    register_stream(
        STREAM,
        "orders",
        on_insert=lambda doc: None,
        deployment_mode="SINGLE_LEADER",
        dead_letter_queue=DeadLetterQueueSpec(store="broken"),
    )
    worker(STREAM, HOST, "crashed", role="LEADER", last_error=CARD, events=5, errors=1)
    worker(STREAM, STANDBY_HOST, "standby", role="STANDBY")
    worker(STREAM, GONE_HOST, "running", role="LEADER", updated=600)
    checkpoint(STREAM, processed=42, heartbeat=10)
    assert StreamWorker.objects.using(lane).filter(stream_name=STREAM).count() == 3
    with override_settings(FLOWWARDEN={"DLQ_STORES": DLQ_STORES}):
        yield STREAM
    stream_registry.unregister(STREAM)


def user(name: str, *, staff: bool = False, active: bool = True, perm: str = "") -> User:
    made = User.objects.create_user(name, password="pw", is_staff=staff, is_active=active)
    if perm:
        app_label, codename = perm.split(".")
        made.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return made


def client_of(who: User | None) -> Client:
    client = Client()
    if who is not None:
        client.force_login(who)
    return client


def health(who: User | None = None) -> tuple[int, str, dict[str, Any]]:
    response = client_of(who).get(HEALTH)
    return response.status_code, response.content.decode(), response.json()


def assert_no_details(body: str, report: dict[str, Any]) -> None:
    for secret in SECRETS:
        assert secret not in body, secret
    entry = report["streams"][STREAM]
    for instance in entry["instances"]:
        assert "instance_id" not in instance and "last_error" not in instance


def assert_details(body: str, report: dict[str, Any]) -> None:
    entry = report["streams"][STREAM]
    leader = next(i for i in entry["instances"] if i["role"] == "LEADER")
    assert (leader["instance_id"], leader["last_error"]) == (HOST, CARD)
    assert entry["leader"] == HOST
    assert entry["stale_instances"] == [GONE_HOST]
    assert CONNECTION_STRING in entry["error"]


# -- /flowwarden/health/ --------------------------------------------------------------


def test_anonymous_gets_status_and_counts_only(leaky_stream: str) -> None:
    status, body, report = health()
    assert status == 503  # the leader crashed
    assert_no_details(body, report)
    entry = report["streams"][STREAM]
    assert (entry["state"], entry["status"], entry["healthy"]) == ("crashed", "DOWN", False)
    assert entry["checkpoint_age_seconds"] == 42.0
    assert entry["heartbeat_age_seconds"] == 10.0
    assert entry["error"] == "dead-letter store 'broken' unavailable (ConnectionError)"
    # Ids become opaque keys, the same as the metrics' instance label.
    assert entry["leader"] == instance_key(HOST)
    assert entry["stale_instances"] == [instance_key(GONE_HOST)]
    by_key = {i["key"]: i for i in entry["instances"]}
    assert set(by_key) == {instance_key(HOST), instance_key(STANDBY_HOST)}
    crashed = by_key[instance_key(HOST)]
    assert (crashed["state"], crashed["events"], crashed["errors"]) == ("crashed", 5, 1)


@pytest.mark.parametrize(
    "who",
    [
        pytest.param({}, id="plain-user"),
        pytest.param({"staff": True, "active": False}, id="inactive-staff"),
        pytest.param({"perm": "flowwarden_django.view_streamworker"}, id="permission-only"),
    ],
)
def test_users_who_are_not_staff_get_no_details(leaky_stream: str, who: dict[str, Any]) -> None:
    _status, body, report = health(user("someone", **who))
    assert_no_details(body, report)


def test_staff_get_the_details(leaky_stream: str) -> None:
    status, body, report = health(user("ops", staff=True))
    assert status == 503
    assert_details(body, report)
    instance = report["streams"][STREAM]["instances"][0]
    assert instance["key"] == instance_key(instance["instance_id"])  # to read the metrics


def test_a_permission_instead_of_staff(leaky_stream: str) -> None:
    perm = "flowwarden_django.view_streamworker"
    with override_settings(FLOWWARDEN={"DLQ_STORES": DLQ_STORES, "HEALTH_DETAILS": perm}):
        assert_details(*health(user("monitor", perm=perm))[1:])
        assert_no_details(*health(user("ops", staff=True))[1:])
        assert_no_details(*health()[1:])
        superuser = User.objects.create_superuser("root", password="pw")
        assert_details(*health(superuser)[1:])


def test_none_gives_nobody_details(leaky_stream: str) -> None:
    with override_settings(FLOWWARDEN={"DLQ_STORES": DLQ_STORES, "HEALTH_DETAILS": "none"}):
        assert_no_details(*health(user("ops", staff=True))[1:])


def test_all_gives_anyone_details(leaky_stream: str) -> None:
    with override_settings(FLOWWARDEN={"DLQ_STORES": DLQ_STORES, "HEALTH_DETAILS": "all"}):
        assert_details(*health()[1:])


def test_a_bad_rule_gives_nobody_details(leaky_stream: str) -> None:
    with override_settings(FLOWWARDEN={"DLQ_STORES": DLQ_STORES, "HEALTH_DETAILS": "admins"}):
        assert_no_details(*health(user("ops", staff=True))[1:])


@contextmanager
def flowwarden_database_down(lane: str) -> Iterator[str]:
    """Route flowwarden's models to a database that cannot be reached; yield what
    the driver's message would leak (the port, or the file's directory)."""
    down = copy.deepcopy(connections.settings[lane])
    if lane == "postgres":
        leak = str(free_port())
        down["PORT"] = leak
        down["OPTIONS"] = {**down.get("OPTIONS", {}), "connect_timeout": 5}
    else:
        leak = "no-such-directory-hx"
        down["NAME"] = f"/{leak}/flowwarden.sqlite3"
    # Made, then dropped from the settings: the test case allows such a dynamic
    # connection (and would not allow a configured alias it does not declare).
    connections.settings["down"] = down
    connection = connections["down"]
    del connections.settings["down"]
    try:
        with override_settings(DATABASE_ROUTERS=[Route(lane, "down")]):
            yield leak
    finally:
        connection.close()
        del connections["down"]


def test_database_down_gives_a_generic_error(lane: str) -> None:
    staff = user("ops", staff=True)
    register_stream(STREAM, "orders", on_insert=lambda doc: None)
    try:
        with flowwarden_database_down(lane) as leak:
            status, body, report = health()
            assert status == 503
            assert report == {
                "healthy": False,
                "streams": {},
                "error": "database unavailable (OperationalError)",
            }
            assert leak not in body and "127.0.0.1" not in body
            status, body, report = health(staff)
            assert status == 503
            assert report["error"].startswith("OperationalError: ")
    finally:
        stream_registry.unregister(STREAM)


# -- /flowwarden/metrics/ ---------------------------------------------------------------


def metrics(token: str | None = None, *, scheme: str = "Bearer", who: User | None = None) -> Any:
    headers = {} if token is None else {"Authorization": f"{scheme} {token}"}
    return client_of(who).get(METRICS, headers=headers)


def test_open_metrics_name_no_host_and_no_error_text(leaky_stream: str) -> None:
    response = metrics()
    assert response.status_code == 200
    body = response.content.decode()
    for secret in SECRETS:
        assert secret not in body, secret
    key = instance_key(HOST)
    assert f'flowwarden_instance_events_total{{instance="{key}",stream="{STREAM}"}} 5.0' in body


def test_a_metrics_token_is_required_when_set(leaky_stream: str) -> None:
    settings = {"DLQ_STORES": DLQ_STORES, "METRICS_TOKEN": "s3cret-scrape-token"}
    with override_settings(FLOWWARDEN=settings):
        missing = metrics()
        assert missing.status_code == 401
        assert missing["WWW-Authenticate"] == 'Bearer realm="flowwarden"'
        wrong = metrics("not-the-token")
        assert wrong.status_code == 401
        assert wrong["WWW-Authenticate"] == 'Bearer realm="flowwarden", error="invalid_token"'
        assert metrics("s3cret-scrape-token", scheme="Basic").status_code == 401
        assert metrics("s3cret-scrape-token").status_code == 200
        assert metrics("s3cret-scrape-token", scheme="bearer").status_code == 200
        # A session is not a token: people use the scraper's token too.
        assert metrics(who=user("ops", staff=True)).status_code == 401


def test_metrics_tokens_can_be_rotated(lane: str) -> None:
    with override_settings(FLOWWARDEN={"METRICS_TOKEN": ["new-token", "old-token"]}):
        assert metrics("new-token").status_code == 200
        assert metrics("old-token").status_code == 200
        assert metrics("older-token").status_code == 401


@pytest.mark.parametrize("value", ["", [], 42])
def test_a_token_setting_without_a_token_refuses_everyone(lane: str, value: Any) -> None:
    with override_settings(FLOWWARDEN={"METRICS_TOKEN": value}):
        assert metrics().status_code == 401
        assert metrics("").status_code == 401
        assert metrics("42").status_code == 401


# -- manage.py check ------------------------------------------------------------------------


def messages(deploy: bool = False, **fw: Any) -> list[tuple[str, str]]:
    """The ids and texts of the endpoint-access checks (``[EW]3xx``) under *fw*."""
    with override_settings(FLOWWARDEN=fw):
        found = run_checks(databases=[], include_deployment_checks=deploy)
    return [(m.id, m.msg) for m in found if m.id[len("flowwarden_django.") :][1:2] == "3"]


@pytest.mark.parametrize(
    "value",
    ["staff", "none", "all", "flowwarden_django.view_streamworker", "auth.change_user"],
)
def test_good_health_details_pass(value: str) -> None:
    assert messages(HEALTH_DETAILS=value) == []


@pytest.mark.parametrize(
    "value", ["admins", "Staff", "", None, 42, "nosuchapp.view_x", "auth.", ".view", "a.b.c"]
)
def test_bad_health_details_are_errors(value: Any) -> None:
    with override_settings(FLOWWARDEN={"HEALTH_DETAILS": value}):
        [message] = [m for m in run_checks(databases=[]) if m.id.startswith("flowwarden_django.")]
    assert message.id == "flowwarden_django.E301"
    assert 'FLOWWARDEN["HEALTH_DETAILS"]' in message.msg
    assert '"staff"' in message.hint


def test_an_undeclared_permission_is_a_warning() -> None:
    [(code, text)] = messages(HEALTH_DETAILS="flowwarden_django.see_health")
    assert code == "flowwarden_django.W301"
    assert "only superusers" in text


def test_public_details_are_a_deploy_warning() -> None:
    assert messages(HEALTH_DETAILS="all") == []
    [(code, text)] = messages(deploy=True, HEALTH_DETAILS="all")
    assert code == "flowwarden_django.W302"
    assert "error texts" in text
    assert messages(deploy=True) == []


@pytest.mark.parametrize("value", [None, "tok", ["new", "old"], ("a",)])
def test_good_metrics_tokens_pass(value: Any) -> None:
    assert messages(METRICS_TOKEN=value) == []


@pytest.mark.parametrize("value", ["", " tok", "tok\n", [], ["ok", ""], [None], 42, {"a": 1}])
def test_bad_metrics_tokens_are_errors(value: Any) -> None:
    [(code, text)] = messages(METRICS_TOKEN=value)
    assert code == "flowwarden_django.E302"
    assert 'FLOWWARDEN["METRICS_TOKEN"]' in text
