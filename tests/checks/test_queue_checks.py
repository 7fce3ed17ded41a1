"""``manage.py check`` of the workflow queues: ``FLOWWARDEN["WORKFLOW_QUEUES"]`` (E205),
a workflow declaring a queue that is not configured (W206), runs waiting in one (W207)
and ``WORKFLOW_QUEUE_STALE_AFTER`` (E010)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks

from flowwarden_django.workflows import Workflow, advance, step, workflow_registry
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from tests.support.queue_rows import waiting_run

GOOD = {
    "carrier-api": {"concurrency": 5, "worker_concurrency": 2, "rate": "100/m", "priority": True},
    "per-customer": {"concurrency": 1, "partitioned": True},
    "bulk": {"rate": "10/30s", "scope": "steps"},
}


def messages(settings: Any, queues: Any, code: str, **more: Any) -> list[Any]:
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "WORKFLOW_QUEUES": queues, **more}
    return [m for m in run_checks(databases=[]) if m.id == f"flowwarden_django.{code}"]


def test_a_good_setting_is_clean(settings: Any) -> None:
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "WORKFLOW_QUEUES": GOOD}
    found = [m for m in run_checks(databases=[]) if m.id.startswith("flowwarden_django.")]
    assert not [m for m in found if "QUEUE" in m.msg], found


@pytest.mark.parametrize(
    ("queues", "words"),
    [
        ("carrier-api", ["must be a dict of queue names to options, not str"]),
        ({"carrier-api": 5}, ["its options must be a dict, not int"]),
        ({"": {"concurrency": 1}}, ["queue name '' must be a non-blank string"]),
        ({"q": {"concurrency": 0}}, ["concurrency must be a whole number from 1 to 10000, not 0"]),
        ({"q": {"concurrency": True}}, ["concurrency must be a whole number"]),
        ({"q": {"worker_concurrency": "2"}}, ["worker_concurrency must be a whole number"]),
        ({"q": {"rate": "100 per minute"}}, ["invalid rate '100 per minute'"]),
        ({"q": {"rate": "100/fortnight"}}, ["the period 'fortnight' is not s, m, h, d"]),
        ({"q": {"rate": "0/s"}}, ["the count must be 1 to 10000"]),
        ({"q": {"concurrency": 1, "priority": "yes"}}, ["priority must be True or False"]),
        ({"q": {"concurrency": 1, "scope": "run"}}, ["scope must be 'steps' or 'runs'"]),
        ({"q": {"rate": "1/s", "scope": "runs"}}, ["scope 'runs' bounds runs in flight"]),
        ({"q": {"priority": True}}, ["queue 'q' sets no limit"]),
    ],
)
def test_a_bad_value_is_an_error_with_a_hint(settings: Any, queues: Any, words: list[str]) -> None:
    (error,) = messages(settings, queues, "E205")
    assert error.is_serious() and 'FLOWWARDEN["WORKFLOW_QUEUES"]' in error.msg
    for word in words:
        assert word in error.msg, error.msg
    assert '"concurrency": 5' in error.hint and '"N/m"' in error.hint


def test_each_bad_queue_is_its_own_error(settings: Any) -> None:
    errors = messages(
        settings, {"a": {}, "b": {"concurrency": -1}, "c": {"concurrency": 2}}, "E205"
    )
    assert ["'a'" in errors[0].msg, "'b'" in errors[1].msg, len(errors)] == [True, True, 2]


@pytest.mark.parametrize(
    ("option", "hint"),
    [
        ("concurency", 'Did you mean "concurrency"?'),
        ("worker_concurency", 'Did you mean "worker_concurrency"?'),
        ("rates", 'Did you mean "rate"?'),
        ("limiter", 'Did you mean "rate"?'),  # DBOS's
        ("partition", 'Did you mean "partitioned"?'),
        (
            "burst",
            "The options are: concurrency, worker_concurrency, rate, priority, partitioned, scope.",
        ),
    ],
)
def test_an_unknown_option_says_the_nearest_one(settings: Any, option: str, hint: str) -> None:
    (error,) = messages(settings, {"carrier-api": {"concurrency": 5, option: 1}}, "E205")
    assert f"[{'carrier-api'!r}] has an unknown option {option!r}" in error.msg
    assert error.hint == hint


@pytest.mark.parametrize("value", ["soon", 0, -1, "5 minutes"])
def test_the_stale_threshold_is_a_positive_duration(settings: Any, value: Any) -> None:
    (error,) = messages(settings, {}, "E010", WORKFLOW_QUEUE_STALE_AFTER=value)
    assert "WORKFLOW_QUEUE_STALE_AFTER" in error.msg


@step("go")
def go(state: Any) -> Any:
    return advance(state)


@pytest.fixture
def declared() -> Any:
    Workflow.define("check-carrier", [go], InMemorySnapshotStore(), queue="carrier-ap")
    Workflow.define("check-carrier", [go], InMemorySnapshotStore(), version=2, queue="carrier-api")
    Workflow.define("check-plain", [go], InMemorySnapshotStore())
    yield
    workflow_registry.unregister("check-carrier")
    workflow_registry.unregister("check-plain")


def test_a_workflow_declaring_an_unconfigured_queue_is_a_warning(settings: Any, declared) -> None:
    (warning,) = messages(settings, GOOD, "W206")
    assert not warning.is_serious()
    assert "Workflow 'check-carrier' (version 1) declares queue 'carrier-ap'" in warning.msg
    assert "UnknownQueueError" in warning.msg
    assert warning.hint.startswith('Did you mean "carrier-api"? Add it to FLOWWARDEN')
    # Nothing configured: both versions' queues are missing.
    assert len(messages(settings, {}, "W206")) == 2
    # A broken setting is E205's; W206 says nothing then.
    assert messages(settings, "carrier-api", "W206") == []


@pytest.mark.django_db
def test_runs_waiting_in_a_queue_no_longer_configured_are_a_warning(settings: Any) -> None:
    waiting_run("w-1", "carrier-api")
    waiting_run("w-2", "retired")
    waiting_run("w-3", "retired")
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "WORKFLOW_QUEUES": GOOD}
    # The runs' database only: Django 6.1's model checks would connect to every alias.
    found = run_checks(databases=["default"])
    (warning,) = [m for m in found if m.id == "flowwarden_django.W207"]
    assert "2 runs wait for a slot of queue 'retired'" in warning.msg
    assert "nothing admits them" in warning.msg and "cancel" in warning.hint
    # Not asked to read the runs' database: no query, no warning.
    assert not [m for m in run_checks(databases=[]) if m.id == "flowwarden_django.W207"]
