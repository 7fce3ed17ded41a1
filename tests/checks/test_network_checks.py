"""The bounds on silent network partitions (issue 51): ``DEAD_CONNECTION_TIMEOUT``
is checked (E010, E014); ``check --deploy`` asks for libpq keepalives on PostgreSQL
databases, naming what to add (W501); Redis clients made from a URL get timeouts and
keepalives within the bound."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.test import override_settings

from flowwarden_django.checks.network import postgres_keepalive_warnings
from flowwarden_django.common.network import KeepaliveTimings, postgres_options, redis_options
from flowwarden_django.streams.backends._redis_common import RedisConnection

SQLITE = {"ENGINE": "django.db.backends.sqlite3", "NAME": "app.sqlite3"}
PG = {"ENGINE": "django.db.backends.postgresql", "NAME": "app", "HOST": "db"}


def messages(code: str, **overrides: Any) -> list[Any]:
    with override_settings(**overrides):
        found = run_checks(databases=[], include_deployment_checks=True)
    return [m for m in found if m.id == f"flowwarden_django.{code}"]


def w501(options: dict[str, Any] | None, bound: float = 30.0) -> list[Any]:
    entry = dict(PG, OPTIONS=options) if options is not None else dict(PG)
    return postgres_keepalive_warnings({"default": SQLITE, "pg": entry}, bound)


def test_a_postgres_database_without_keepalives_gets_w501_with_what_to_add():
    (warning,) = w501(None)
    assert warning.id == "flowwarden_django.W501"
    assert 'DATABASES["pg"]["OPTIONS"] lacks connect_timeout, keepalives,' in warning.msg
    assert "30 s" in warning.msg
    assert (
        '{"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, '
        '"keepalives_count": 4, "tcp_user_timeout": 27000, '
        '"options": "-c idle_in_transaction_session_timeout=30000"}'
    ) in warning.hint


def test_w501_names_only_what_is_missing_and_follows_the_bound():
    given = {"connect_timeout": 4, "keepalives": 1, "keepalives_idle": 4, "keepalives_interval": 2}
    (warning,) = w501(given, 12)
    assert (
        '{"keepalives_count": 4, "tcp_user_timeout": 10800, '
        '"options": "-c idle_in_transaction_session_timeout=12000"}'
    ) in warning.hint
    assert "keepalives_idle" not in warning.hint


def test_w501_asks_for_the_server_side_idle_timeout_in_the_options_given():
    """A session cut off inside a transaction keeps its locks on the server until
    ``idle_in_transaction_session_timeout`` ends it: W501 asks for it in ``options``,
    beside whatever else they set."""
    mine = {**postgres_options(), "options": "-c search_path=app"}
    (warning,) = w501(mine)
    assert "lacks options" in warning.msg
    assert '"options": "-c idle_in_transaction_session_timeout=30000"' in warning.hint
    both = "-c search_path=app -c idle_in_transaction_session_timeout=60000"
    assert w501({**postgres_options(), "options": both}) == []


def test_w501_is_quiet_when_the_options_are_there_and_for_other_engines():
    assert w501(postgres_options()) == []
    assert len(w501({**postgres_options(), "keepalives": 0})) == 1
    assert postgres_keepalive_warnings({"default": SQLITE}, 30) == []


def test_w501_is_a_deploy_check_following_the_setting():
    """The test settings' PostgreSQL alias (when the lane is up) has no keepalives."""
    with override_settings(FLOWWARDEN={"DEAD_CONNECTION_TIMEOUT": "12s"}):
        plain = run_checks(databases=[])
        deploy = messages("W501")
    assert not [m for m in plain if m.id == "flowwarden_django.W501"]
    postgres = [a for a, e in settings.DATABASES.items() if "postg" in e["ENGINE"]]
    assert len(deploy) == len(postgres)
    assert all('"tcp_user_timeout": 10800' in m.hint for m in deploy)


@pytest.mark.parametrize(("value", "code"), [("0s", "E010"), ("soon", "E010"), ("2s", "E014")])
def test_a_bad_dead_connection_timeout_is_an_error(value, code):
    (error,) = messages(code, FLOWWARDEN={"DEAD_CONNECTION_TIMEOUT": value})
    assert "DEAD_CONNECTION_TIMEOUT" in error.msg


def test_keepalive_timings_stay_within_the_bound():
    for bound in (3, 7, 12, 30, 90):
        timings = KeepaliveTimings.within(bound)
        assert timings.idle + timings.probes * timings.interval <= bound
    assert postgres_options(30)["tcp_user_timeout"] == 27000


def test_a_redis_client_from_a_url_gets_the_bound_unless_the_url_says_otherwise():
    with override_settings(FLOWWARDEN={"DEAD_CONNECTION_TIMEOUT": "12s"}):
        client = RedisConnection(url="redis://127.0.0.1:6379/0").client
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 10.8
        assert kwargs["socket_connect_timeout"] == 10.8
        assert kwargs["health_check_interval"] == 12
        assert kwargs["socket_keepalive"] is True
        assert kwargs["socket_keepalive_options"][socket.TCP_KEEPCNT] == 4
        told = RedisConnection(url="redis://127.0.0.1:6379/0?socket_timeout=3").client
        assert told.connection_pool.connection_kwargs["socket_timeout"] == 3
    assert redis_options(30)["socket_keepalive_options"][socket.TCP_KEEPIDLE] == 10
