"""The pieces that make outages heal without a human: the failure log, telling an
outage from a bug, the restart reason in the status, and claims released once the
database answers again. The outages themselves are in ``tests/chaos/``."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import OperationalError

from flowwarden_django.common.failure_log import FailureLog
from flowwarden_django.common.outages import error_summary, error_where, is_outage
from flowwarden_django.models import StreamWorker, WorkflowRun
from flowwarden_django.streams.operations.status import StreamStatus, WorkerStatus
from flowwarden_django.workflows.execution.releases import PendingReleases
from flowwarden_django.workflows.runs.records import RunRecords, RunStatus, new_runner_token

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# -- the failure log ----------------------------------------------------------------------


def test_a_failure_is_logged_when_it_starts_summarised_and_its_end_logged(caplog) -> None:
    clock = Clock()
    log = FailureLog(logging.getLogger("fw.test"), "saving X", summary_seconds=10, clock=clock)
    with caplog.at_level(logging.INFO, "fw.test"):
        for _ in range(4700):  # 4,700 attempts over 23.5 s
            log.failed(ConnectionError("refused"))
            clock.now += 0.005
        log.succeeded()
        log.succeeded()  # not failing: nothing more
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4, lines
    assert lines[0] == "saving X failed: ConnectionError: refused"
    # An outage: no traceback at WARNING (it is at DEBUG), never one a retry.
    assert caplog.records[0].exc_info is None
    assert lines[1].startswith("saving X still failing: ") and "ConnectionError" in lines[1]
    assert all(r.exc_info is None for r in caplog.records[1:])
    assert lines[3].startswith("saving X works again after 4700 failed attempts in ")


def test_a_bug_is_logged_with_its_traceback_an_outage_without(caplog) -> None:
    bug = FailureLog(logging.getLogger("fw.test"), "bug", clock=Clock())
    outage = FailureLog(logging.getLogger("fw.test"), "outage", clock=Clock())
    with caplog.at_level(logging.DEBUG, "fw.test"):
        bug.failed(ValueError("bad value"))
        outage.failed(ConnectionRefusedError("refused"))
    assert [(r.levelname, r.exc_info is not None) for r in caplog.records] == [
        ("WARNING", True),
        ("WARNING", False),
        ("DEBUG", True),
    ]


def test_a_different_error_is_logged_again(caplog) -> None:
    log = FailureLog(logging.getLogger("fw.test"), "x", clock=Clock())
    with caplog.at_level(logging.WARNING, "fw.test"):
        log.failed(ConnectionError("a"))
        log.failed(ConnectionError("b"))
        log.failed(TimeoutError("c"))
    assert [r.getMessage() for r in caplog.records] == [
        "x failed: ConnectionError: a",
        "x now fails with TimeoutError: c",
    ]


# -- outages and where errors arise --------------------------------------------------------


def test_outages_are_told_from_bugs() -> None:
    assert is_outage(OperationalError("the connection is closed"))
    assert is_outage(ConnectionRefusedError())
    assert is_outage(TimeoutError())
    assert not is_outage(ValueError("bad value"))
    assert not is_outage(KeyError("x"))
    try:
        try:
            raise OSError("socket closed")
        except OSError as exc:
            raise RuntimeError("store failed") from exc
    except RuntimeError as wrapped:
        assert is_outage(wrapped)  # by its cause
    named = type("ConnectionError", (Exception,), {})  # redis-py's, say
    assert is_outage(named())


def test_error_summary_names_the_class_and_the_function_not_the_message() -> None:
    from flowwarden_django.common.user_input import parse_user_json

    try:
        parse_user_json("{secret card 4111}")
    except ValueError as exc:
        assert error_where(exc) == "parse_user_json"
        assert error_summary(exc) == "UserJSONError in parse_user_json"
        assert "4111" not in error_summary(exc)
    assert error_summary(None) == ""


# -- why and since when a stream restarts --------------------------------------------------


def worker(state: str, **fields: Any) -> WorkerStatus:
    return WorkerStatus("host:1", state, "", None, None, NOW, **fields)


def test_the_status_says_why_and_since_when_a_stream_restarts() -> None:
    since = NOW - timedelta(seconds=42)
    status = StreamStatus(
        name="orders",
        state="restarting",
        deployment_mode="ALL_INSTANCES",
        enabled=True,
        auto_start=True,
        paused=False,
        healthy=False,
        instances=(
            worker("running"),
            worker(
                "restarting",
                restarting_since=since,
                error_kind="OperationalError in OrmCheckpointStore.load",
            ),
        ),
    )
    assert status.restart_note() == (
        "restarting since 2030-01-01 11:59:18 UTC: OperationalError in OrmCheckpointStore.load"
    )
    assert (
        StreamStatus("x", "running", "ALL_INSTANCES", True, True, False, True).restart_note() == ""
    )
    # error_kind is not a detail: anonymous health callers see the class, not the text.
    shown = worker("restarting", error_kind="OperationalError", last_error="host db:5432").to_json(
        details=False
    )
    assert shown["error_kind"] == "OperationalError" and "last_error" not in shown


@pytest.mark.django_db
def test_the_manager_publishes_the_restart_reason() -> None:
    from flowwarden_django.streams.registry import StreamRegistry
    from flowwarden_django.streams.runtime import StreamConsumer, StreamState
    from flowwarden_django.streams.runtime.manager import StreamManager

    manager = StreamManager(registry=StreamRegistry(), instance_id="host:9")
    consumer = StreamConsumer.__new__(StreamConsumer)
    consumer.__dict__.update(
        state=StreamState.RESTARTING,
        started_at=None,
        last_event_at=None,
        events_handled=0,
        errors=0,
        retries=0,
        dead_lettered=0,
        restarts=3,
        last_error=_raised(OperationalError("db at 10.0.0.5:5432 refused")),
        restarting_since=NOW,
    )
    manager._consumers["orders"] = consumer
    manager._wanted["orders"] = False
    manager._publish()
    row = StreamWorker.objects.get(stream_name="orders")
    assert row.state == "restarting" and row.restarting_since == NOW
    assert row.error_kind == "OperationalError in _raised"  # the project's own function
    assert "10.0.0.5" not in row.error_kind


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as raised:
        return raised


# -- claims released when the database answers again ---------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_could_not_be_released_is_released_later(monkeypatch) -> None:
    runs = RunRecords()
    runs.create("cid-1", "wf")
    token = new_runner_token()
    runs.claim("cid-1", token, timedelta(minutes=10))
    old = WorkflowRun.objects.get(pk="cid-1").updated_at
    pending = PendingReleases()
    broken = {"on": True}
    real_release = RunRecords.release

    def release(self: RunRecords, *args: Any, **kwargs: Any) -> bool:
        if broken["on"]:
            raise OperationalError("the connection is closed")
        return real_release(self, *args, **kwargs)

    monkeypatch.setattr(RunRecords, "release", release)
    pending._pending[("default", "cid-1", token)] = (float("inf"), {"last_step": "b"})
    assert pending.release_due() == 1  # still down: kept
    assert WorkflowRun.objects.get(pk="cid-1").runner == token
    broken["on"] = False
    assert pending.release_due() == 0
    run = WorkflowRun.objects.get(pk="cid-1")
    assert (run.runner, run.claimed_until, run.last_step) == ("", None, "b")
    assert run.status == RunStatus.RUNNING
    assert run.updated_at == old  # untouched: the sweep may take it at once


def test_failing_anchor_saves_are_retried_after_a_pause_not_per_event() -> None:
    from flowwarden_django.streams.runtime.policy import ProcessedAnchorPolicy

    class DownStore:
        up = False
        calls = 0

        def save_processed(self, *args: Any, **kwargs: Any) -> None:
            self.calls += 1
            if not self.up:
                raise ConnectionError("redis is down")

    store, clock = DownStore(), Clock()
    policy = ProcessedAnchorPolicy(store, "s", save_every_n=1, monotonic=clock)  # type: ignore[arg-type]
    for n in range(100):  # 100 events in 0.99 s
        policy.on_settled({"_data": f"{n:04d}"}, NOW)
        clock.now += 0.01
    assert store.calls == 2 and policy.dirty  # at 0 s and at 0.5 s
    store.up = True
    clock.now += 0.5
    policy.on_settled({"_data": "0100"}, NOW)
    assert store.calls == 3 and not policy.dirty
    assert policy.flush()  # a graceful stop always tries at once


@pytest.mark.django_db(transaction=True)
def test_recover_names_the_last_step_of_the_newest_snapshot(caplog) -> None:
    """The run record catches up with plain steps only now and then; the log of the
    sweep reads the newest snapshot (without its state)."""
    from flowwarden_django.workflows import Workflow, advance, hibernate, step, workflow_registry
    from flowwarden_django.workflows.operations.recovery import recover_stalled_runs

    @step("a")
    def a(state: Any) -> Any:
        return advance(state)

    @step("b")
    def b(state: Any) -> Any:
        return advance(state)

    @step("c")
    def c(state: Any) -> Any:
        return hibernate(state)

    Workflow.define("fw-recover-log", [a, b, c])
    try:
        started = Workflow.start("fw-recover-log", {"n": 1})
        cid = started.coordination_id
        WorkflowRun.objects.filter(pk=cid).update(  # a record that lags behind, stalled
            status=RunStatus.RUNNING, last_step="", updated_at=datetime.now(UTC) - timedelta(days=1)
        )
        queued: list[Any] = []
        with caplog.at_level(logging.WARNING, "flowwarden_django.workflows"):
            assert recover_stalled_runs(queued.append, older_than=timedelta(0)) == [cid]
        assert "stalled after step 'c'" in caplog.text
    finally:
        workflow_registry.unregister("fw-recover-log")
