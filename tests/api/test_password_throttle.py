"""Password guessing is limited: failed attempts at ``POST v1/token/`` and HTTP Basic
count per client IP and per username (``FLOWWARDEN["API_PASSWORD_THROTTLE"]``); past
either limit every password attempt is refused with 429 before the password is
checked, and a refused attempt changes nothing."""

from __future__ import annotations

import base64
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.core.cache import caches
from django.core.checks import run_checks
from django.test import Client
from django.test.utils import override_settings
from rest_framework.authtoken.models import Token
from rest_framework.throttling import AnonRateThrottle

from flowwarden_django.api.throttling import FailedPasswordThrottle
from flowwarden_django.checks import check_setting_keys
from tests.api.helpers import API
from tests.settings import FLOWWARDEN
from tests.support.lanes import on_lane

pytestmark = pytest.mark.django_db

TOKEN = f"{API}/token/"
RUNS = f"{API}/runs/"
#: The default per-username limit (10 failures an hour).
USERNAME_LIMIT = 10


def throttle(*, off: bool = False, **rates: str | None) -> Any:
    """Settings with ``API_PASSWORD_THROTTLE`` set to *rates* (``None`` if *off*)."""
    value = None if off else rates
    return override_settings(FLOWWARDEN={**FLOWWARDEN, "API_PASSWORD_THROTTLE": value})


def ask_token(password: str, *, username: str = "alice", ip: str = "10.0.0.1") -> Any:
    return Client(REMOTE_ADDR=ip).post(
        TOKEN, {"username": username, "password": password}, content_type="application/json"
    )


def basic(password: str, *, username: str = "alice", ip: str = "10.0.0.1") -> Any:
    credentials = base64.b64encode(f"{username}:{password}".encode()).decode()
    return Client(REMOTE_ADDR=ip).get(RUNS, headers={"Authorization": f"Basic {credentials}"})


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", password="right")


def user_row(user: User) -> tuple[Any, ...]:
    row = User.objects.values_list().get(pk=user.pk)
    return (row, Token.objects.count())


def test_wrong_passwords_then_429_even_for_the_right_one(alice: User) -> None:
    """The review's attack: 60 wrong passwords, then the right one."""
    statuses = [ask_token(f"guess{n}").status_code for n in range(60)]
    assert statuses[:USERNAME_LIMIT] == [400] * USERNAME_LIMIT
    assert set(statuses[USERNAME_LIMIT:]) == {429}
    before = user_row(alice)
    refused = ask_token("right")
    assert refused.status_code == 429
    assert refused.json()["code"] == "throttled"
    assert int(refused["Retry-After"]) > 0
    assert user_row(alice) == before  # no token made, nothing touched
    assert not Token.objects.exists()


def test_the_username_counts_from_every_client_and_in_any_case(alice: User) -> None:
    for n in range(USERNAME_LIMIT):
        assert ask_token("wrong", username="ALICE", ip=f"10.0.1.{n}").status_code == 400
    assert ask_token("right", ip="10.0.2.1").status_code == 429
    # Another user is not held back, from the same clients.
    User.objects.create_user("bob", password="pw")
    assert ask_token("pw", username="bob", ip="10.0.1.0").status_code == 200


def test_the_client_counts_over_every_username(alice: User) -> None:
    with throttle(ip="5/min", username=None):
        for n in range(5):
            assert ask_token("x", username=f"user{n}").status_code == 400
        assert ask_token("right").status_code == 429
        assert ask_token("right", ip="10.9.9.9").status_code == 200


def test_successes_do_not_count(alice: User) -> None:
    with throttle(ip="3/min", username="3/min"):
        assert all(ask_token("right").status_code == 200 for _ in range(20))
        assert all(basic("right").status_code == 200 for _ in range(20))


def test_the_limit_lifts_when_the_window_moves_on(alice: User) -> None:
    with throttle(ip=None, username="2/hour"):
        assert [ask_token("x").status_code for _ in range(3)] == [400, 400, 429]
        later = FailedPasswordThrottle.timer() + 3601
        with mock.patch.object(FailedPasswordThrottle, "timer", return_value=later):
            assert ask_token("right").status_code == 200


def test_http_basic_is_limited_too(alice: User) -> None:
    statuses = [basic(f"guess{n}").status_code for n in range(30)]
    assert statuses[:USERNAME_LIMIT] == [401] * USERNAME_LIMIT
    assert set(statuses[USERNAME_LIMIT:]) == {429}
    before = user_row(alice)
    refused = basic("right")
    assert refused.status_code == 429 and refused.json()["code"] == "throttled"
    assert user_row(alice) == before
    # The token view shares the count: the username is held back there too.
    assert ask_token("right", ip="10.3.3.3").status_code == 429
    # A token still works: only password attempts are limited.
    key = Token.objects.create(user=alice).key
    assert Client().get(RUNS, headers={"Authorization": f"Token {key}"}).status_code == 200


def test_the_limit_is_configurable(alice: User) -> None:
    with throttle(username="2/min"):  # the ip half keeps its default
        assert [ask_token("x").status_code for _ in range(3)] == [400, 400, 429]
    with throttle(off=True):
        assert {ask_token("x", ip="10.5.5.5").status_code for _ in range(40)} == {400}
        assert {basic("x", ip="10.5.5.5").status_code for _ in range(40)} == {401}
        assert ask_token("right", ip="10.5.5.5").status_code == 200


class FivePerMinute(AnonRateThrottle):
    """DRF's anonymous throttle at 5/min (DRF reads ``DEFAULT_THROTTLE_RATES`` once,
    at import, so a test sets the rate on the class)."""

    rate = "5/min"


@override_settings(
    REST_FRAMEWORK={
        "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
        "DEFAULT_THROTTLE_CLASSES": [f"{__name__}.FivePerMinute"],
    }
)
def test_the_projects_drf_throttles_apply_to_the_token_view(alice: User) -> None:
    with throttle(off=True):
        statuses = [ask_token("right").status_code for _ in range(7)]
    assert statuses == [200] * 5 + [429] * 2


@pytest.mark.parametrize(
    "value",
    [
        "20/min",
        {"ip": "lots"},
        {"ip": "0/min"},
        {"username": "5/fortnight"},
        {"ip": 5},
        {"per_ip": "5/min"},
    ],
)
def test_check_refuses_a_malformed_setting(value: Any) -> None:
    with override_settings(FLOWWARDEN={**FLOWWARDEN, "API_PASSWORD_THROTTLE": value}):
        errors = [m for m in check_setting_keys() if m.id == "flowwarden_django.E012"]
        assert len(errors) == 1 and "API_PASSWORD_THROTTLE" in errors[0].msg, errors
        serious = [m for m in run_checks(databases=[]) if m.is_serious()]
        assert any("API_PASSWORD_THROTTLE" in m.msg for m in serious)


@pytest.mark.parametrize("value", [None, {}, {"ip": None}, {"ip": "100/hour", "username": "3/day"}])
def test_check_accepts_a_good_setting(value: Any) -> None:
    with override_settings(FLOWWARDEN={**FLOWWARDEN, "API_PASSWORD_THROTTLE": value}):
        assert not [m for m in check_setting_keys() if "API_PASSWORD_THROTTLE" in m.msg]


RACERS = 50
RACE_LIMIT = 5


def race_wrong_passwords(kind: str) -> list[int]:
    """*RACERS* wrong password attempts at once; each one's password check is held
    until every attempt is either inside it or answered, so any attempt that a
    check-then-count throttle would let through is in flight at the same time."""
    gate = threading.Event()
    lock = threading.Lock()
    arrived_or_done = [0]

    def held_authenticate(*args: Any, **kwargs: Any) -> None:
        with lock:
            arrived_or_done[0] += 1
        assert gate.wait(timeout=60), "the gate never opened"
        return None  # a wrong password

    def attempt(n: int) -> int:
        name = f"{suffix}-victim" if kind == "username" else f"{suffix}-{n}"
        ip = f"10.7.{n // 250}.{n % 250}" if kind == "username" else "10.8.0.1"
        try:
            return ask_token(f"guess{n}", username=name, ip=ip).status_code
        finally:
            with lock:
                arrived_or_done[0] += 0 if gate.is_set() else 1

    suffix = uuid.uuid4().hex  # fresh counts, even in a cache shared with other runs
    rates = {"ip": None, "username": f"{RACE_LIMIT}/hour"}
    if kind == "ip":
        rates = {"ip": f"{RACE_LIMIT}/hour", "username": None}
    with (
        throttle(**rates),
        mock.patch("rest_framework.authtoken.serializers.authenticate", held_authenticate),
        ThreadPoolExecutor(RACERS) as pool,
    ):
        futures = [pool.submit(attempt, n) for n in range(RACERS)]
        deadline = time.monotonic() + 60
        while arrived_or_done[0] < RACERS and time.monotonic() < deadline:
            time.sleep(0.01)
        gate.set()
        return [future.result() for future in futures]


@pytest.mark.parametrize("kind", ["username", "ip"])
def test_parallel_guesses_cannot_pass_the_limit_together(kind: str) -> None:
    """50 wrong passwords at once: at most the limit are checked (400), the rest
    get 429 (a count read before any of them was counted let all 50 through)."""
    statuses = race_wrong_passwords(kind)
    assert statuses.count(400) == RACE_LIMIT, statuses
    assert statuses.count(429) == RACERS - RACE_LIMIT, statuses


@on_lane("redis")
def test_parallel_guesses_are_counted_atomically_in_redis() -> None:
    """The same race with the counts in Redis (a cache processes share)."""
    with mock.patch.object(FailedPasswordThrottle, "cache", caches["redis"]):
        statuses = race_wrong_passwords("username")
    assert statuses.count(400) == RACE_LIMIT, statuses
    assert statuses.count(429) == RACERS - RACE_LIMIT, statuses


FULL_WIDTH_ALICE = "\uff41\uff4c\uff49\uff43\uff45"


@pytest.mark.parametrize("variant", ["alice ", " ALICE", "ALİCE", FULL_WIDTH_ALICE, "Alice\u0301"])
def test_username_variants_count_together(alice: User, variant: str) -> None:
    """Spaces, case, a dotted capital I, full-width letters and accents do not buy
    a new count for the same account."""
    with throttle(ip=None, username="3/hour"):
        assert [ask_token("x", username=variant).status_code for _ in range(3)] == [400] * 3
        assert ask_token("right").status_code == 429


def deploy_warnings(**overrides: Any) -> list[str]:
    with override_settings(**overrides):
        found = run_checks(databases=[], include_deployment_checks=True)
    return [m.id for m in found if m.id == "flowwarden_django.W401"]


DRF = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}


def test_deploy_check_warns_when_the_ip_count_trusts_x_forwarded_for() -> None:
    """DRF's get_ident uses the client's whole X-Forwarded-For when NUM_PROXIES is None."""
    assert deploy_warnings(REST_FRAMEWORK=DRF) == ["flowwarden_django.W401"]
    assert deploy_warnings(REST_FRAMEWORK={**DRF, "NUM_PROXIES": 0}) == []
    assert deploy_warnings(REST_FRAMEWORK={**DRF, "NUM_PROXIES": 1}) == []
    ip_off = {**FLOWWARDEN, "API_PASSWORD_THROTTLE": {"ip": None}}
    assert deploy_warnings(REST_FRAMEWORK=DRF, FLOWWARDEN=ip_off) == []
    off = {**FLOWWARDEN, "API_PASSWORD_THROTTLE": None}
    assert deploy_warnings(REST_FRAMEWORK=DRF, FLOWWARDEN=off) == []
    with override_settings(REST_FRAMEWORK=DRF):  # a deploy check only
        assert not [m for m in run_checks(databases=[]) if m.id == "flowwarden_django.W401"]
