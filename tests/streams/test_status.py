"""``stream_status()`` and ``health_report()``: the cross-process view of the streams.

Worker, control, checkpoint and dead-letter rows are stored by hand with timestamps
relative to a fixed ``NOW``, as processes would have written them.
"""

import io
import json

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from flowwarden_django.models import DeadLetter
from flowwarden_django.streams.dlq import DlqStore
from flowwarden_django.streams.operations.status import health_report, instance_key, stream_status
from flowwarden_django.streams.registry import StreamRegistry, register_stream, stream_registry
from flowwarden_django.streams.spec import DeadLetterQueueSpec
from tests.support.status_rows import NOW, ago, checkpoint, control, dead_letter, worker

pytestmark = pytest.mark.django_db

ORM_DLQ = {"BACKEND": "flowwarden_django.streams.backends.orm.OrmDlqStore"}


class UncountableDlqStore(DlqStore):
    """A publish-only store: it keeps nothing it could count."""

    def save(self, entry, policy):
        pass


class BrokenDlqStore(DlqStore):
    def save(self, entry, policy):
        pass

    def count(self, stream_name):
        raise ConnectionError("dlq server unreachable")


@pytest.fixture
def registry():
    return StreamRegistry()


def declare(registry, name, **options):
    return register_stream(name, "orders", on_insert=lambda doc: None, registry=registry, **options)


def status_of(registry, name, now=NOW):
    return {s.name: s for s in stream_status(now, registry)}[name]


# -- states ------------------------------------------------------------------------------


def test_no_report_means_stopped_and_unhealthy(registry):
    declare(registry, "orders")
    status = status_of(registry, "orders")
    assert (status.state, status.healthy, status.instances, status.leader) == (
        "stopped",
        False,
        (),
        None,
    )
    assert status.checkpoint_age_seconds is None and status.dlq_backlog is None


def test_a_fresh_running_row_means_running(registry):
    declare(registry, "orders")
    worker("orders", "host-a:1", "running", updated=2, last_event=30, events=7, errors=1)
    status = status_of(registry, "orders")
    assert status.state == "running" and status.healthy
    [instance] = status.instances
    assert (instance.instance_id, instance.state, instance.events, instance.errors) == (
        "host-a:1",
        "running",
        7,
        1,
    )
    assert status.last_event_time == ago(30)


def test_a_stale_row_belongs_to_a_gone_process(registry):
    declare(registry, "orders")
    # Default STATUS_INTERVAL 5s: a row older than 15s is stale.
    worker("orders", "gone:1", "running", updated=16, last_event=20)
    worker("orders", "edge:2", "stopped", updated=15)
    status = status_of(registry, "orders")
    assert status.state == "stopped" and not status.healthy
    assert [i.instance_id for i in status.instances] == ["edge:2"]
    assert status.stale_instances == ("gone:1",)
    # The gone process's last event is still the stream's last event.
    assert status.last_event_time == ago(20)


def test_only_the_instances_that_run_a_stream_count_as_its_instances(registry):
    declare(registry, "orders")
    worker("orders", "edge:1", "stopped", updated=2)
    status = status_of(registry, "orders")
    assert status.state == "stopped"
    assert [i.instance_id for i in status.instances] == ["edge:1"]  # still reported...
    assert status.live_instances == ()  # ... but a stopped stream has no live instance
    worker("orders", "host-a:2", "running", updated=2)
    worker("orders", "host-b:3", "standby", role="standby", updated=2)
    live = status_of(registry, "orders").live_instances
    assert sorted(i.instance_id for i in live) == ["host-a:2", "host-b:3"]


def test_staleness_follows_the_status_interval(registry):
    declare(registry, "orders")
    worker("orders", "host-a:1", "running", updated=120)
    with override_settings(FLOWWARDEN={"STATUS_INTERVAL": "1m"}):
        assert status_of(registry, "orders").state == "running"
    with override_settings(FLOWWARDEN={"STATUS_INTERVAL": "30s"}):
        assert status_of(registry, "orders").state == "stopped"


def test_single_leader_with_standbys_is_healthy(registry):
    declare(registry, "orders", deployment_mode="SINGLE_LEADER")
    worker("orders", "host-a:1", "standby", role="STANDBY")
    worker("orders", "host-b:1", "running", role="LEADER")
    worker("orders", "host-c:1", "standby", role="STANDBY")
    status = status_of(registry, "orders")
    assert (status.state, status.leader, status.healthy) == ("running", "host-b:1", True)
    assert len(status.instances) == 3
    report = health_report(NOW, registry)
    assert report["healthy"] is True
    assert report["streams"]["orders"]["status"] == "UP"


def test_only_standbys_means_standby_and_unhealthy(registry):
    declare(registry, "orders", deployment_mode="SINGLE_LEADER")
    worker("orders", "host-a:1", "standby", role="STANDBY")
    # The leader's process is gone: its row is stale.
    worker("orders", "host-b:1", "running", role="LEADER", updated=60)
    status = status_of(registry, "orders")
    assert (status.state, status.leader, status.healthy) == ("standby", None, False)
    assert status.stale_instances == ("host-b:1",)


def test_paused_by_an_operator_is_reported_but_not_unhealthy(registry):
    declare(registry, "orders")
    control("orders", paused=True)
    worker("orders", "host-a:1", "paused")
    status = status_of(registry, "orders")
    assert (status.state, status.paused, status.healthy) == ("paused", True, True)


def test_a_pause_not_yet_applied_still_shows_running(registry):
    declare(registry, "orders")
    control("orders", paused=True)
    worker("orders", "host-a:1", "running")
    status = status_of(registry, "orders")
    assert (status.state, status.paused) == ("running", True)


def test_crashed(registry):
    declare(registry, "orders")
    worker("orders", "host-a:1", "crashed", last_error="HistoryLostError: resume token gone")
    status = status_of(registry, "orders")
    assert (status.state, status.healthy) == ("crashed", False)
    assert status.instances[0].last_error.startswith("HistoryLostError")


@pytest.mark.parametrize("state", ["restarting", "starting"])
def test_coming_up_is_not_yet_running(registry, state):
    declare(registry, "orders")
    worker("orders", "host-a:1", "crashed", updated=3)
    worker("orders", "host-b:1", state)
    status = status_of(registry, "orders")
    assert (status.state, status.healthy) == (state, False)


def test_streams_not_required_to_run_are_healthy_when_stopped(registry):
    declare(registry, "disabled", enabled=False)
    declare(registry, "manual", auto_start=False)
    declare(registry, "orders")
    worker("orders", "host-a:1", "running")
    report = health_report(NOW, registry)
    assert report["healthy"] is True
    assert {name: s["state"] for name, s in report["streams"].items()} == {
        "disabled": "stopped",
        "manual": "stopped",
        "orders": "running",
    }


def test_a_stopped_stream_says_why_and_what_starts_it(registry):
    declare(registry, "orders")
    declare(registry, "manual", auto_start=False)
    declare(registry, "disabled", enabled=False)
    declare(registry, "ended")
    declare(registry, "gone")
    declare(registry, "live")
    worker("ended", "edge:1", "stopped", updated=2)
    worker("gone", "gone:1", "running", updated=60)
    worker("live", "host-a:1", "running", updated=2)
    notes = {s.name: s.stopped_note() for s in stream_status(NOW, registry)}
    run = "`manage.py flowwarden_streams run`"
    assert notes["orders"] == (
        f"no process runs it: start {run} (or a StreamManager) under your process manager"
    )
    assert notes["manual"] == (
        "no process runs it: `manage.py flowwarden_streams run --stream manual` starts it"
    )
    assert notes["ended"].startswith(
        "stopped in the 1 process reporting it (its consumer ended: see their logs); "
        f"restart it, or start {run}"
    )
    assert notes["gone"].startswith("the processes that ran it stopped reporting; start ")
    # Nothing may run a disabled stream (its "disabled" note says so); a live one is fine.
    assert notes["disabled"] == notes["live"] == ""


# -- checkpoint ages and DLQ backlog -----------------------------------------------------


def test_checkpoint_and_heartbeat_ages(registry):
    declare(registry, "orders")
    declare(registry, "idle")
    checkpoint("orders", processed=90, seen=30, heartbeat=30)
    checkpoint("idle", seen=45, heartbeat=12)
    orders, idle = status_of(registry, "orders"), status_of(registry, "idle")
    # The processed anchor's age when there is one, else the seen anchor's.
    assert orders.checkpoint_age_seconds == 90.0 and orders.checkpoint_at == ago(90)
    assert orders.heartbeat_age_seconds == 30.0
    assert idle.checkpoint_age_seconds == 45.0 and idle.heartbeat_age_seconds == 12.0


def test_dlq_backlog_counts_pending_entries_of_the_stream(registry):
    declare(registry, "orders", dead_letter_queue=DeadLetterQueueSpec())
    declare(registry, "no-dlq")
    dead_letter("orders")
    dead_letter("orders")
    dead_letter("orders", DeadLetter.Status.ACKNOWLEDGED)
    dead_letter("no-dlq")
    dead_letter("payments")
    assert status_of(registry, "orders").dlq_backlog == 2
    # No dead-letter queue declared: no backlog, not a zero backlog.
    assert status_of(registry, "no-dlq").dlq_backlog is None


def test_a_store_that_cannot_count_reports_no_backlog(registry):
    stores = {"default": ORM_DLQ, "publish": {"BACKEND": f"{__name__}.UncountableDlqStore"}}
    declare(registry, "orders", dead_letter_queue=DeadLetterQueueSpec(store="publish"))
    dead_letter("orders")
    with override_settings(FLOWWARDEN={"DLQ_STORES": stores}):
        status = status_of(registry, "orders")
    assert status.dlq_backlog is None and status.error is None


def test_store_failures_are_reported_per_stream(registry):
    stores = {"default": ORM_DLQ, "broken": {"BACKEND": f"{__name__}.BrokenDlqStore"}}
    declare(registry, "orders", checkpoint_store="missing")
    declare(
        registry,
        "payments",
        dead_letter_queue=DeadLetterQueueSpec(store="broken"),
    )
    declare(registry, "fine", dead_letter_queue=DeadLetterQueueSpec())
    worker("orders", "host-a:1", "running")
    worker("fine", "host-a:1", "running")
    worker("payments", "host-a:1", "running")
    checkpoint("payments", processed=5, heartbeat=5)
    dead_letter("fine")
    with override_settings(FLOWWARDEN={"DLQ_STORES": stores}):
        report = health_report(NOW, registry)
    orders, payments, fine = (report["streams"][n] for n in ("orders", "payments", "fine"))
    assert "checkpoint store 'missing'" in orders["error"]
    assert orders["state"] == "running" and orders["checkpoint_age_seconds"] is None
    assert "dead-letter store 'broken'" in payments["error"]
    assert "unreachable" in payments["error"]
    assert payments["dlq_backlog"] is None and payments["checkpoint_age_seconds"] == 5.0
    assert fine["error"] is None and fine["dlq_backlog"] == 1
    # A read failure is reported, it does not make a running stream unhealthy.
    assert report["healthy"] is True


# -- the report --------------------------------------------------------------------------


def test_health_report_shape(registry):
    declare(registry, "orders", dead_letter_queue=DeadLetterQueueSpec())
    worker("orders", "host-a:1", "running", last_event=4, events=3)
    checkpoint("orders", processed=4, heartbeat=4)
    dead_letter("orders")
    report = health_report(NOW, registry)
    assert set(report) == {"healthy", "streams"}
    entry = report["streams"]["orders"]
    assert entry == {
        "state": "running",
        "status": "UP",
        "healthy": True,
        "mode": "ALL_INSTANCES",
        "parallelism": 1,
        "enabled": True,
        "auto_start": True,
        "paused": False,
        "leader": None,
        "instances": [
            {
                "key": instance_key("host-a:1"),
                "instance_id": "host-a:1",
                "state": "running",
                "role": "",
                "started_at": ago(3600).isoformat(),
                "last_event_at": ago(4).isoformat(),
                "updated_at": ago(1).isoformat(),
                "events": 3,
                "errors": 0,
                "retries": 0,
                "dead_lettered": 0,
                "restarts": 0,
                "last_error": "",
                "error_kind": "",
                "restarting_since": None,
                "in_flight": 0,
                "watermark_lag": 0,
                "parked_keys": [],
            }
        ],
        "stale_instances": [],
        "last_event_time": ago(4).isoformat(),
        "checkpoint_at": ago(4).isoformat(),
        "checkpoint_age_seconds": 4.0,
        "heartbeat_at": ago(4).isoformat(),
        "heartbeat_age_seconds": 4.0,
        "dlq_backlog": 1,
        "in_flight": 0,
        "watermark_lag": 0,
        "parked_keys": [],
        "restart_requested_at": None,
        "initial_sync": None,
        "error": None,
    }


def test_a_parallel_streams_window_is_summed_over_its_instances(registry):
    declare(registry, "orders", parallelism=8)
    worker("orders", "host-a:1", "running", in_flight=5, watermark_lag=12, parked_keys=["c7"])
    worker("orders", "host-b:1", "running", in_flight=3, watermark_lag=0)
    worker("orders", "gone:1", "running", updated=60, in_flight=9, watermark_lag=9)
    status = status_of(registry, "orders")
    assert (status.in_flight, status.watermark_lag, status.parked_keys) == (8, 12, ("c7",))
    assert status.window_note() == (
        "8 in flight (parallelism 8), 12 settled beyond the anchor, 1 key parked (c7)"
    )
    entry = health_report(NOW, registry)["streams"]["orders"]
    assert (entry["parallelism"], entry["in_flight"], entry["watermark_lag"]) == (8, 8, 12)
    assert entry["parked_keys"] == ["c7"]
    # Keys may be event data: without details only their number is shown.
    hidden = status.redacted()
    assert hidden.window_note().endswith("12 settled beyond the anchor, 1 key parked")
    assert status.to_json(details=False)["parked_keys"] == 1


def test_a_stream_handled_one_at_a_time_has_no_window_note(registry):
    declare(registry, "orders")
    worker("orders", "host-a:1", "running")
    assert status_of(registry, "orders").window_note() == ""


def test_a_report_that_cannot_be_read_is_unhealthy(registry):
    declare(registry, "orders")
    declare(registry, "orders")  # a duplicate declaration
    report = health_report(NOW, registry)
    assert report["healthy"] is False and report["streams"] == {}
    assert "declared twice" in report["error"]


# -- manage.py flowwarden_streams status ---------------------------------------------------


@pytest.fixture
def declared():
    names = []

    def declare_global(name, **options):
        names.append(name)
        return register_stream(name, "orders", on_insert=lambda doc: None, **options)

    yield declare_global
    for name in names:
        stream_registry.unregister(name)


@pytest.fixture
def frozen_now(monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: NOW)


def run_status(*args):
    out = io.StringIO()
    call_command("flowwarden_streams", "status", *args, stdout=out)
    return out.getvalue()


def test_status_command_prints_the_cross_process_table(declared, frozen_now):
    declared(
        "cmd-orders",
        database="shop",
        deployment_mode="SINGLE_LEADER",
        dead_letter_queue=DeadLetterQueueSpec(),
    )
    declared("cmd-off", enabled=False)
    worker("cmd-orders", "host-a:1", "running", role="LEADER", last_event=20)
    worker("cmd-orders", "host-b:1", "standby", role="STANDBY")
    worker("cmd-orders", "host-c:1", "running", updated=600)
    checkpoint("cmd-orders", processed=180, heartbeat=40)
    dead_letter("cmd-orders")
    dead_letter("cmd-orders")
    lines = run_status().splitlines()
    assert lines[0].split() == [
        "STREAM",
        "NAMESPACE",
        "MODE",
        "STATE",
        "LEADER",
        "INSTANCES",
        "LAST",
        "EVENT",
        "CHECKPOINT",
        "HEARTBEAT",
        "DLQ",
        "NOTES",
    ]
    orders = next(line for line in lines if line.startswith("cmd-orders"))
    assert orders.split() == [
        "cmd-orders",
        "shop.orders",
        "SINGLE_LEADER",
        "running",
        "host-a:1",
        "2",
        "20s",
        "ago",
        "3m",
        "ago",
        "40s",
        "ago",
        "2",
        "1",
        "instance",
        "silent",
        "(no",
        "recent",
        "report)",
    ]
    off = next(line for line in lines if line.startswith("cmd-off"))
    assert off.split()[3:5] == ["stopped", "—"] and off.endswith("disabled")


def test_status_command_says_why_a_stream_is_stopped(declared, frozen_now):
    declared("cmd-idle", auto_start=False)
    idle = next(line for line in run_status().splitlines() if line.startswith("cmd-idle"))
    assert idle.split()[3] == "stopped"
    assert idle.endswith(
        "no auto-start; no process runs it: "
        "`manage.py flowwarden_streams run --stream cmd-idle` starts it"
    )


def test_status_command_json_is_the_health_report(declared, frozen_now):
    declared("cmd-orders")
    worker("cmd-orders", "host-a:1", "running")
    checkpoint("cmd-orders", processed=7)
    report = json.loads(run_status("--json"))
    assert report["healthy"] == health_report(NOW)["healthy"]
    assert report["streams"]["cmd-orders"]["state"] == "running"
    assert report["streams"]["cmd-orders"]["checkpoint_age_seconds"] == 7.0


def test_status_command_with_no_streams(monkeypatch):
    monkeypatch.setattr(stream_registry, "specs", dict)
    assert run_status() == "No streams declared.\n"
