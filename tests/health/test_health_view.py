"""``/flowwarden/health/`` and ``/flowwarden/metrics/`` through the Django test client.

The clock is pinned to ``NOW`` so the reported ages are exact.
"""

import json

import pytest
from bson import Timestamp
from django.urls import reverse
from django.utils import timezone

from flowwarden_django.integrations import prometheus
from flowwarden_django.streams import metrics
from flowwarden_django.streams.operations.status import instance_key
from flowwarden_django.streams.registry import register_stream, stream_registry
from flowwarden_django.streams.spec import DeadLetterQueueSpec
from tests.support.status_rows import NOW, ago, checkpoint, dead_letter, worker

pytestmark = pytest.mark.django_db

HEALTH = "/flowwarden/health/"
METRICS = "/flowwarden/metrics/"


@pytest.fixture(autouse=True)
def frozen_now(monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: NOW)


@pytest.fixture
def declare():
    names = []

    def declare(name, **options):
        names.append(name)
        return register_stream(name, "orders", on_insert=lambda doc: None, **options)

    yield declare
    for name in names:
        stream_registry.unregister(name)


def metric_lines(body: bytes) -> set[str]:
    return set(body.decode().splitlines())


def test_urls_are_namespaced():
    assert reverse("flowwarden:health") == HEALTH
    assert reverse("flowwarden:metrics") == METRICS


def test_healthy_is_200_with_the_report(client, declare):
    declare("hv-orders", dead_letter_queue=DeadLetterQueueSpec())
    worker("hv-orders", "host-a:1", "running", last_event=3)
    checkpoint("hv-orders", processed=42, heartbeat=10)
    dead_letter("hv-orders")
    dead_letter("hv-orders")
    response = client.get(HEALTH)  # anonymous: it is a probe
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert "no-cache" in response["Cache-Control"]
    report = response.json()
    assert report["healthy"] is True
    entry = report["streams"]["hv-orders"]
    assert (entry["state"], entry["status"], entry["mode"]) == ("running", "UP", "ALL_INSTANCES")
    assert entry["checkpoint_age_seconds"] == 42.0
    assert entry["heartbeat_age_seconds"] == 10.0
    assert entry["dlq_backlog"] == 2
    assert entry["last_event_time"] == ago(3).isoformat()
    # Anonymous: the instance's opaque key, not its id (a host name).
    assert [i["key"] for i in entry["instances"]] == [instance_key("host-a:1")]
    assert "instance_id" not in entry["instances"][0]


def test_unhealthy_is_503(client, declare):
    declare("hv-orders")
    declare("hv-payments")
    worker("hv-orders", "host-a:1", "running")
    worker("hv-payments", "host-a:1", "crashed", last_error="boom")
    response = client.get(HEALTH)
    assert response.status_code == 503
    report = json.loads(response.content)
    assert report["healthy"] is False
    assert report["streams"]["hv-orders"]["healthy"] is True
    assert report["streams"]["hv-payments"]["state"] == "crashed"
    assert report["streams"]["hv-payments"]["status"] == "DOWN"


def test_a_status_that_cannot_be_read_is_503_not_500(client, declare, django_user_model):
    declare("hv-orders")
    declare("hv-orders")
    response = client.get(HEALTH)
    assert response.status_code == 503
    # Anonymous: what failed, not the message (it names source files).
    assert response.json()["error"] == "stream status unavailable (DuplicateStreamError)"
    client.force_login(django_user_model.objects.create_user("ops", is_staff=True))
    response = client.get(HEALTH)
    assert response.status_code == 503
    assert "declared twice" in response.json()["error"]


def test_only_reads_are_allowed(client):
    assert client.post(HEALTH).status_code == 405
    assert client.head(HEALTH).status_code in (200, 503)


def test_metrics_report_checkpoint_age_and_dlq_backlog(client, declare):
    declare("pm-orders", dead_letter_queue=DeadLetterQueueSpec())
    declare("pm-idle")
    worker("pm-orders", "host-a:1", "running", last_event=3, events=7, errors=2)
    checkpoint("pm-orders", processed=42, heartbeat=10)
    dead_letter("pm-orders")
    dead_letter("pm-orders")
    response = client.get(METRICS)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    lines = metric_lines(response.content)
    key = instance_key("host-a:1")  # the instance label names no host
    for expected in (
        'flowwarden_checkpoint_age_seconds{stream="pm-orders"} 42.0',
        'flowwarden_heartbeat_age_seconds{stream="pm-orders"} 10.0',
        'flowwarden_dlq_backlog{stream="pm-orders"} 2.0',
        'flowwarden_stream_up{stream="pm-orders"} 1.0',
        'flowwarden_stream_up{stream="pm-idle"} 0.0',
        'flowwarden_stream_healthy{stream="pm-idle"} 0.0',
        'flowwarden_stream_state{state="running",stream="pm-orders"} 1.0',
        'flowwarden_stream_state{state="stopped",stream="pm-orders"} 0.0',
        'flowwarden_stream_state{state="stopped",stream="pm-idle"} 1.0',
        'flowwarden_stream_instances{stream="pm-orders"} 1.0',
        f'flowwarden_instance_events_total{{instance="{key}",stream="pm-orders"}} 7.0',
        f'flowwarden_instance_errors_total{{instance="{key}",stream="pm-orders"}} 2.0',
        # Without an event seen in this process, the lag is the checkpoint age.
        'flowwarden_stream_lag_seconds{stream="pm-orders"} 42.0',
        "flowwarden_status_up 1.0",
    ):
        assert expected in lines, expected
    # Unknown values have no sample: no checkpoint, no DLQ declared.
    body = response.content.decode()
    assert 'flowwarden_checkpoint_age_seconds{stream="pm-idle"}' not in body
    assert 'flowwarden_dlq_backlog{stream="pm-idle"}' not in body


def test_metrics_report_a_parallel_streams_window(client, declare):
    declare("pm-parallel", parallelism=8)
    worker("pm-parallel", "host-a:1", "running", in_flight=6, watermark_lag=21, parked_keys=["k"])
    lines = metric_lines(client.get(METRICS).content)
    for expected in (
        'flowwarden_stream_in_flight{stream="pm-parallel"} 6.0',
        'flowwarden_stream_watermark_lag{stream="pm-parallel"} 21.0',
        'flowwarden_stream_parked_keys{stream="pm-parallel"} 1.0',
    ):
        assert expected in lines, expected
    # A stream handled one event at a time has no window, so no sample.
    declare("pm-serial")
    body = client.get(METRICS).content.decode()
    assert 'flowwarden_stream_in_flight{stream="pm-serial"}' not in body


def test_metrics_count_the_stream_signals(client, declare):
    declare("pm-signals")
    stream = "pm-signals"
    metrics.emit(
        metrics.event_received, stream, cluster_time=Timestamp(int(ago(30).timestamp()), 1)
    )
    metrics.emit(metrics.event_processed, stream, duration=0.25, success=True)
    metrics.emit(metrics.event_processed, stream, duration=0.5, success=False)
    metrics.emit(metrics.event_error, stream, error=RuntimeError("x"), will_retry=True, attempt=1)
    metrics.emit(metrics.event_error, stream, error=RuntimeError("x"), will_retry=False, attempt=2)
    metrics.emit(metrics.event_sent_to_dlq, stream, entry_id="e1")
    metrics.emit(metrics.event_dlq_failed, stream, error=OSError("x"))
    metrics.emit(metrics.checkpoint_saved, stream, anchor="processed", token={"_data": "82"})
    metrics.emit(metrics.checkpoint_failed, stream, anchor="seen", error=OSError("x"))
    metrics.emit(metrics.stream_restarted, stream, attempt=1, cause=OSError("x"))
    metrics.emit(metrics.stream_stopped, stream, reason="CRASHED", cause=OSError("x"))
    lines = metric_lines(client.get(METRICS).content)
    for expected in (
        'flowwarden_events_received_total{stream="pm-signals"} 1.0',
        'flowwarden_events_processed_total{stream="pm-signals",success="true"} 1.0',
        'flowwarden_events_processed_total{stream="pm-signals",success="false"} 1.0',
        'flowwarden_event_duration_seconds_count{stream="pm-signals"} 2.0',
        'flowwarden_event_duration_seconds_sum{stream="pm-signals"} 0.75',
        'flowwarden_event_errors_total{stream="pm-signals",will_retry="true"} 1.0',
        'flowwarden_event_errors_total{stream="pm-signals",will_retry="false"} 1.0',
        'flowwarden_event_retries_total{stream="pm-signals"} 1.0',
        'flowwarden_events_sent_to_dlq_total{stream="pm-signals"} 1.0',
        'flowwarden_dlq_failures_total{stream="pm-signals"} 1.0',
        'flowwarden_checkpoints_saved_total{anchor="processed",stream="pm-signals"} 1.0',
        'flowwarden_checkpoint_failures_total{anchor="seen",stream="pm-signals"} 1.0',
        'flowwarden_stream_restarts_total{stream="pm-signals"} 1.0',
        'flowwarden_stream_stops_total{reason="CRASHED",stream="pm-signals"} 1.0',
        # The last event's cluster time was 30 s before now.
        'flowwarden_stream_lag_seconds{stream="pm-signals"} 30.0',
    ):
        assert expected in lines, expected


def test_metrics_of_the_initial_sync_signals(client, declare):
    declare("pm-copy")
    stream = "pm-copy"
    metrics.emit(
        metrics.initial_sync_started,
        stream,
        reason="first start",
        copied=0,
        estimated=1500,
        resumed=False,
    )
    metrics.emit(
        metrics.initial_sync_progress, stream, documents=1000, copied=1000, batch=1, estimated=1500
    )
    lines = metric_lines(client.get(METRICS).content)
    assert 'flowwarden_initial_sync_in_progress{stream="pm-copy"} 1.0' in lines
    assert 'flowwarden_initial_sync_documents_copied_total{stream="pm-copy"} 1000.0' in lines
    # No duration before a copy finished.
    duration = 'flowwarden_initial_sync_duration_seconds{stream="pm-copy"}'
    assert not any(line.startswith(duration) for line in lines)
    metrics.emit(
        metrics.initial_sync_progress, stream, documents=500, copied=1500, batch=2, estimated=1500
    )
    metrics.emit(
        metrics.initial_sync_finished, stream, reason="first start", copied=1500, duration=12.5
    )
    lines = metric_lines(client.get(METRICS).content)
    for expected in (
        'flowwarden_initial_sync_in_progress{stream="pm-copy"} 0.0',
        'flowwarden_initial_sync_documents_copied_total{stream="pm-copy"} 1500.0',
        'flowwarden_initial_sync_duration_seconds{stream="pm-copy"} 12.5',
    ):
        assert expected in lines, expected


def test_a_stop_during_the_copy_ends_its_in_progress_gauge(client, declare):
    declare("pm-cut")
    declare("pm-plain")
    metrics.emit(
        metrics.initial_sync_started, "pm-cut", reason="first start", copied=0, estimated=9
    )
    metrics.emit(metrics.stream_stopped, "pm-cut", reason="GRACEFUL", cause=None)
    metrics.emit(metrics.stream_stopped, "pm-plain", reason="GRACEFUL", cause=None)
    body = client.get(METRICS).content
    assert 'flowwarden_initial_sync_in_progress{stream="pm-cut"} 0.0' in metric_lines(body)
    # A stream that never copied gets no copy gauge from its stop.
    assert b'flowwarden_initial_sync_in_progress{stream="pm-plain"}' not in body


def test_a_copy_through_the_consumer_feeds_the_initial_sync_metrics(client):
    from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
    from flowwarden_django.streams.runtime import StreamConsumer
    from flowwarden_django.streams.spec import CheckpointSpec, StreamSpec
    from flowwarden_django.testkit.fake_source import FakeChangeSource

    source = FakeChangeSource()
    source.oplog.seed({"_id": n, "n": n} for n in range(1, 251))
    spec = StreamSpec(
        name="pm-consumer-copy",
        collection="orders",
        handlers={"snapshot": lambda doc: None},
        checkpoint=CheckpointSpec(start_position="COPY_EXISTING", copy_batch_size=100),
    )
    StreamConsumer(spec, InMemoryCheckpointStore(), lambda s: source).run(burst=True)
    lines = metric_lines(client.get(METRICS).content)
    for expected in (
        'flowwarden_initial_sync_documents_copied_total{stream="pm-consumer-copy"} 250.0',
        'flowwarden_initial_sync_in_progress{stream="pm-consumer-copy"} 0.0',
        # The clock is frozen: the copy took no time.
        'flowwarden_initial_sync_duration_seconds{stream="pm-consumer-copy"} 0.0',
        'flowwarden_events_processed_total{stream="pm-consumer-copy",success="true"} 250.0',
    ):
        assert expected in lines, expected


def test_receivers_are_installed_once(client, declare):
    declare("pm-once")
    prometheus.install_receivers()
    prometheus.install_receivers()
    metrics.emit(metrics.event_sent_to_dlq, "pm-once", entry_id="e1")
    lines = metric_lines(client.get(METRICS).content)
    assert 'flowwarden_events_sent_to_dlq_total{stream="pm-once"} 1.0' in lines


def test_openmetrics_when_asked(client, declare):
    declare("pm-orders")
    response = client.get(METRICS, headers={"accept": "application/openmetrics-text"})
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")


def test_a_status_that_cannot_be_read_is_reported_in_metrics(client, declare):
    declare("pm-orders")
    declare("pm-orders")
    lines = metric_lines(client.get(METRICS).content)
    assert "flowwarden_status_up 0.0" in lines


def test_metrics_without_prometheus_client_is_404(client, monkeypatch):
    from flowwarden_django import views

    monkeypatch.setattr(views, "find_spec", lambda name: None)
    response = client.get(METRICS)
    assert response.status_code == 404
    assert 'pip install "flowwarden-django[prometheus]"' in response.content.decode()


def test_run_can_serve_its_processs_metrics():
    import socket
    import urllib.request

    from django.core.management.base import CommandError

    from flowwarden_django.management.commands.flowwarden_streams import Command

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    Command().serve_metrics(port)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "flowwarden_events_processed_total" in body
    with pytest.raises(CommandError, match="Pick a free port"):
        Command().serve_metrics(port)  # taken now
