"""Celery's connections and silent partitions (issue 51), without a server: the
settings that notice one within ``DEAD_CONNECTION_TIMEOUT`` (broker heartbeat, Redis
timeouts and keepalives), what a worker gets at start, W510 for a project's app that
lacks them, the renewed Redis visibility timeout (``CELERY_VISIBILITY_TIMEOUT``, E015)
and ``STREAM_EVENT_TIMEOUT``."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery.exceptions import TimeoutError as ResultTimeout
from django.core.checks import run_checks
from django.test import override_settings

from flowwarden_django.integrations.celery import bootstep, configure_network, stream_events
from flowwarden_django.integrations.celery.network import (
    missing_settings,
    network_settings,
    scheme_of,
)
from flowwarden_django.integrations.celery.visibility import (
    VisibilityBootstep,
    VisibilityRenewal,
    configure_visibility,
    renew_interval,
    visibility_options,
)
from flowwarden_django.streams.remote_events import RemoteEventError

REDIS = "redis://127.0.0.1:6379/14"


def app_of(broker: str | None = REDIS, backend: str | None = REDIS, **conf: Any) -> Celery:
    app = Celery("fw-network-test", broker=broker, backend=backend, set_as_current=False)
    app.conf.update(conf)
    return app


def messages(code: str, **overrides: Any) -> list[Any]:
    with override_settings(**overrides):
        found = run_checks(databases=[], include_deployment_checks=True)
    return [m for m in found if m.id == f"flowwarden_django.{code}"]


# -- the settings ------------------------------------------------------------------------


def test_schemes():
    assert scheme_of("redis://h:1/0") == "redis"
    assert scheme_of("amqp://a;amqp://b") == "amqp"
    assert scheme_of(["rediss://h/0"]) == "rediss"
    assert scheme_of(None) == ""


def test_a_redis_broker_and_backend_get_timeouts_keepalives_and_health_checks():
    wanted = network_settings(app_of().conf, 30)
    options = wanted["broker_transport_options"]
    assert options["socket_timeout"] == options["socket_connect_timeout"] == 27.0
    assert options["socket_keepalive"] is True and options["socket_keepalive_options"]
    # kombu drops a BRPOP connection overdue by brpop_timeout (1 s) + this at its next
    # check: within a third of the bound.
    assert options["health_check_interval"] == 5
    assert (
        network_settings(app_of().conf, 6)["broker_transport_options"]["health_check_interval"] == 1
    )
    assert wanted["redis_socket_timeout"] == 27.0
    assert wanted["redis_socket_keepalive"] is True
    assert wanted["redis_backend_health_check_interval"] == 10
    assert "broker_heartbeat" not in wanted


def test_an_amqp_broker_gets_a_heartbeat_two_of_which_fit_in_the_bound():
    wanted = network_settings(app_of("amqp://guest@127.0.0.1//", backend=None).conf, 30)
    assert wanted == {"broker_heartbeat": 10}
    # kombu's default broker (no URL) is AMQP too.
    assert network_settings(app_of(None, None).conf, 12) == {"broker_heartbeat": 4}


def test_configure_network_keeps_the_users_values_and_sets_the_rest():
    given = {"socket_timeout": 5, "visibility_timeout": 99}
    app = app_of(broker_transport_options=given, redis_socket_timeout=3.0)
    applied = configure_network(app, 30)
    assert "redis_socket_timeout" not in applied
    assert app.conf.redis_socket_timeout == 3.0
    options = app.conf.broker_transport_options
    assert options["socket_timeout"] == 5 and options["visibility_timeout"] == 99
    assert options["health_check_interval"] == 5
    assert given == {"socket_timeout": 5, "visibility_timeout": 99}  # not changed in place
    assert missing_settings(app.conf, 30) == {}
    assert configure_network(app, 30) == {}


def test_a_starting_worker_gets_the_settings_and_the_renewal_step():
    app = app_of()

    class Worker:
        pass

    worker = Worker()
    worker.app = app
    with override_settings(FLOWWARDEN={"CELERY_VISIBILITY_TIMEOUT": "12s"}):
        bootstep.install_from_settings(sender=worker)
    options = app.conf.broker_transport_options
    assert options["visibility_timeout"] == 12.0
    assert options["unacked_restore_interval"] == 2
    assert options["unacked_restore_throttle"] == 1
    assert options["socket_timeout"] == 27.0
    assert app.conf.redis_backend_health_check_interval == 10
    assert VisibilityBootstep in app.steps["worker"]


def test_no_renewal_without_a_visibility_timeout_or_a_redis_broker():
    worker_app = app_of()
    with override_settings(FLOWWARDEN={"CELERY_VISIBILITY_TIMEOUT": None}):
        assert configure_visibility(worker_app) is False
    assert "visibility_timeout" not in (worker_app.conf.broker_transport_options or {})
    assert configure_visibility(app_of("amqp://guest@127.0.0.1//"), 10) is False
    # The user's own timeout is kept (and renewed).
    mine = app_of(broker_transport_options={"visibility_timeout": 600})
    assert configure_visibility(mine, 10) is True
    assert mine.conf.broker_transport_options["visibility_timeout"] == 600


def test_visibility_options_and_renewal_interval():
    assert visibility_options(10) == {
        "visibility_timeout": 10,
        "unacked_restore_interval": 2,
        "unacked_restore_throttle": 1,
    }
    assert visibility_options(3)["unacked_restore_interval"] == 1
    assert renew_interval(10) == pytest.approx(10 / 3)
    assert renew_interval(1) == 0.5


# -- the renewal -------------------------------------------------------------------------


class FakeClient:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple] = []
        self.fail = fail

    def zadd(self, key: str, mapping: dict, xx: bool = False) -> int:
        if self.fail:
            raise ConnectionError("redis down")
        self.calls.append((key, sorted(mapping), xx))
        return 0


class FakeChannel:
    unacked_index_key = "unacked_index"
    visibility_timeout = 9.0

    def __init__(self, tags: list[str], client: FakeClient) -> None:
        self.qos = type("QoS", (), {"_delivered": dict.fromkeys(tags)})()
        self.client = client

    def _create_client(self) -> FakeClient:
        return self.client


def worker_with(channel: Any) -> Any:
    consumer = type("Consumer", (), {"task_consumer": type("TC", (), {"channel": channel})()})()
    return type("Worker", (), {"consumer": consumer})()


def test_the_renewal_moves_the_held_messages_time_only_if_still_recorded():
    client = FakeClient()
    channel = FakeChannel(["t1", "t2", "t3"], client)
    channel.qos._dirty = {"t3"}  # acknowledged, not yet flushed
    renewal = VisibilityRenewal(worker_with(channel))
    assert renewal.renew_once() == 2
    assert client.calls == [("unacked_index", ["t1", "t2"], True)]
    assert renewal.interval() == 3.0


def test_the_renewal_does_nothing_without_a_redis_channel_and_survives_errors(caplog):
    assert VisibilityRenewal(worker_with(None)).renew_once() == 0
    assert VisibilityRenewal(type("Worker", (), {})()).renew_once() == 0
    amqp_like = type("Channel", (), {"qos": None})()
    assert VisibilityRenewal(worker_with(amqp_like)).renew_once() == 0
    failing = VisibilityRenewal(worker_with(FakeChannel(["t1"], FakeClient(fail=True))))
    assert failing.renew_once() == 0
    assert failing.failure_log.failing
    assert VisibilityRenewal(worker_with(FakeChannel([], FakeClient()))).renew_once() == 0


# -- the checks ----------------------------------------------------------------------------


@pytest.fixture
def project_app():
    """A Celery app loaded as the project's (``set_as_current``), lacking the settings."""
    from celery import _state

    previous, previous_current = _state.default_app, _state._tls.current_app
    app = Celery("fw-project", broker=REDIS, backend=REDIS, set_as_current=True)
    app.set_current()
    yield app
    # The thread's current app too: later tests publish with current_app.
    _state._set_current_app(previous_current)
    _state.set_default_app(previous)
    app.close()
    _state._apps.discard(app)


def test_w510_names_what_the_project_app_lacks_when_the_package_uses_celery(project_app):
    (warning,) = messages("W510", FLOWWARDEN={"WORKFLOW_EXECUTION": "celery"})
    assert "broker_transport_options" in warning.msg
    assert "redis_socket_timeout" in warning.msg
    assert "configure_network(app)" in warning.hint
    assert "CELERY_REDIS_SOCKET_TIMEOUT = 27.0" in warning.hint
    configure_network(project_app)
    assert messages("W510", FLOWWARDEN={"WORKFLOW_EXECUTION": "celery"}) == []


def test_w510_is_quiet_when_the_package_does_not_use_celery(project_app):
    assert messages("W510", FLOWWARDEN={}) == []
    assert len(messages("W510", FLOWWARDEN={"CELERY_RUN_STREAMS": True})) == 1


@pytest.mark.parametrize(
    ("value", "code"), [("0s", "E010"), ("soon", "E010"), ("1s", "E015"), ("2500ms", "E015")]
)
def test_a_bad_celery_visibility_timeout_is_an_error(value, code):
    (error,) = messages(code, FLOWWARDEN={"CELERY_VISIBILITY_TIMEOUT": value})
    assert "CELERY_VISIBILITY_TIMEOUT" in error.msg


def test_good_visibility_timeouts_pass():
    for value in (None, "3s", 60):
        found = messages("E015", FLOWWARDEN={"CELERY_VISIBILITY_TIMEOUT": value})
        found += messages("E010", FLOWWARDEN={"CELERY_VISIBILITY_TIMEOUT": value})
        assert found == []


@pytest.mark.parametrize("value", ["0s", "never", -5])
def test_a_bad_stream_event_timeout_is_an_error(value):
    (error,) = messages("E010", FLOWWARDEN={"STREAM_EVENT_TIMEOUT": value})
    assert "STREAM_EVENT_TIMEOUT" in error.msg


# -- STREAM_EVENT_TIMEOUT ------------------------------------------------------------------


def test_a_slot_gives_up_after_the_stream_event_timeout():
    class Result:
        id = "task-1"
        state = "PENDING"

        def get(self, **options):
            raise ResultTimeout()

    class App:
        def send_task(self, name, args):
            return Result()

    with override_settings(FLOWWARDEN={"STREAM_EVENT_TIMEOUT": "10ms"}):
        assert stream_events.event_timeout() == 0.01
        with pytest.raises(RemoteEventError, match=r"within 0\.01 s \(task task-1\)"):
            stream_events.run_on_celery("orders", {"_id": 1}, None, lambda: False, app=App())
    assert stream_events.event_timeout() == 600.0
