"""Prometheus metrics of the streams (needs the ``prometheus`` extra: prometheus-client).

Two kinds of metrics, all named ``flowwarden_*``:

* **Status gauges**, read at scrape time from ``streams.status.stream_status()``,
  so any process (typically the web process serving ``/flowwarden/metrics/``) reports
  every stream, wherever it runs: state, checkpoint and heartbeat ages, DLQ backlog,
  lag, and the counters each process publishes in its ``StreamWorker`` row
  (``flowwarden_instance_*_total{stream, instance}``). The workflow queues' gauges
  (``flowwarden_queue_*{queue}``, ``prometheus_queues``) and the workflow runs' by
  status (``flowwarden_workflow_*{workflow, status}``, ``prometheus_runs``) are read at
  scrape time too.
* **Event counters**, fed by receivers of the signals in ``streams/metrics.py``. They
  count what happens *in this process*: scrape the processes that run streams to
  see them (``prometheus_client.start_http_server(port, registry=REGISTRY)``).
  The initial sync's are among them: documents copied (as each batch commits),
  whether a copy runs here, and how long the last finished copy took. So is the
  step-duration histogram (``flowwarden_workflow_step_duration_seconds``), fed by the
  engine's ``step_attempted`` signal where steps run.

Labels carry names and fixed values only: stream names, store and client
aliases, states, anchors, reasons. The ``instance`` label is the process's
:func:`~flowwarden_django.streams.operations.status.instance_key` (an opaque keyed hash), not
its ``<hostname>:<pid>`` id: the detailed health report (staff) maps one to the
other. No error text becomes a label or a sample.

Everything is exposed through :data:`REGISTRY`. To add the same metrics to another
registry (the global one, django-prometheus), register a :class:`FlowwardenCollector`
there. :func:`install_receivers` connects the signal receivers; importing this
module calls it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from django.utils import timezone
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..streams import metrics
from ..streams.checkpoint import as_utc
from ..streams.operations.status import (
    COPYING,
    CRASHED,
    PAUSED,
    RESTARTING,
    RUNNING,
    STANDBY,
    STARTING,
    STOPPED,
    WORKING,
    StreamStatus,
    stream_status,
)
from .prometheus_queues import collect_queues, queue_families
from .prometheus_runs import collect_runs, run_families, step_metrics
from .prometheus_tally import DURATION_BUCKETS, EventTally

logger = logging.getLogger("flowwarden_django.prometheus")

STATES = (RUNNING, COPYING, RESTARTING, STARTING, PAUSED, CRASHED, STANDBY, STOPPED)

#: ``StreamWorker`` counters exposed per instance: (column, metric name, help).
INSTANCE_COUNTERS = (
    ("events", "flowwarden_instance_events", "Events handled, as the instance reports it."),
    ("errors", "flowwarden_instance_errors", "Handler failures, as the instance reports it."),
    ("retries", "flowwarden_instance_retries", "Retries, as the instance reports it."),
    (
        "dead_lettered",
        "flowwarden_instance_dead_lettered",
        "Events sent to the dead-letter queue, as the instance reports it.",
    ),
    ("restarts", "flowwarden_instance_restarts", "Managed restarts, as the instance reports it."),
)


def _is_time(value: Any, known: set[type]) -> bool:
    """Whether *value* is a cluster time :func:`_cluster_datetime` converts (then its
    type joins *known*, which answers quicker for the next event)."""
    if isinstance(value, datetime) or callable(getattr(value, "as_datetime", None)):
        known.add(type(value))
        return True
    return False


def _count_per_stream(counter: str) -> Callable[..., None]:
    """The receiver of a signal that adds one to *counter* for the sending stream."""

    def receive(self: SignalMetrics, sender: str, **kwargs: Any) -> None:
        getattr(self, counter).labels(sender).inc()

    return receive


class SignalMetrics:
    """Counters of this process's stream events, fed by the ``streams/metrics.py`` signals."""

    def __init__(self) -> None:
        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, ["stream", *labels], registry=None)

        def gauge(name: str, doc: str, label: str) -> Gauge:
            return Gauge(name, doc, [label], registry=None)

        self.events_received = counter("flowwarden_events_received", "Events received.")
        self.events_processed = counter(
            "flowwarden_events_processed",
            "Events whose attempt loop ended (success: handled, else settled by the error policy).",
            "success",
        )
        self.event_duration = Histogram(
            "flowwarden_event_duration_seconds",
            "Time spent on one event, retries included.",
            ["stream"],
            registry=None,
            buckets=DURATION_BUCKETS,
        )
        self.event_errors = counter(
            "flowwarden_event_errors", "Failed handler attempts.", "will_retry"
        )
        self.event_retries = counter("flowwarden_event_retries", "Failed attempts retried.")
        self.checkpoints_saved = counter(
            "flowwarden_checkpoints_saved", "Successful checkpoint writes.", "anchor"
        )
        self.checkpoint_failures = counter(
            "flowwarden_checkpoint_failures", "Failed checkpoint writes.", "anchor"
        )
        self.sent_to_dlq = counter(
            "flowwarden_events_sent_to_dlq", "Events written to the dead-letter queue."
        )
        self.dlq_failures = counter(
            "flowwarden_dlq_failures", "Failed dead-letter writes (the event is settled anyway)."
        )
        self.starts = counter("flowwarden_stream_starts", "Stream starts and managed restarts.")
        self.stops = counter("flowwarden_stream_stops", "Stream stops.", "reason")
        self.restarts = counter("flowwarden_stream_restarts", "Successful managed restarts.")
        self.invalidations = counter(
            "flowwarden_stream_invalidations", "Change streams invalidated.", "cause"
        )
        self.fallbacks_to_seen = counter(
            "flowwarden_resume_fallback_to_seen",
            "Resumes from the seen anchor because the processed anchor aged out.",
        )
        self.history_lost = counter(
            "flowwarden_resume_history_lost", "Resumes with both anchors aged out of the oplog."
        )
        self.heartbeat_failures = counter(
            "flowwarden_heartbeat_failures", "Failed idle heartbeat probes or writes."
        )
        self.oplog_window = gauge(
            "flowwarden_oplog_window_hours",
            "Hours between the first and last oplog entries, by client alias.",
            "client",
        )
        self.documents_copied = counter(
            "flowwarden_initial_sync_documents_copied",
            "Documents copied by initial syncs, counted as each batch commits.",
        )
        self.copy_duration = gauge(
            "flowwarden_initial_sync_duration_seconds",
            "How long the last finished initial sync took (restarts included).",
            "stream",
        )
        self.copy_in_progress = gauge(
            "flowwarden_initial_sync_in_progress",
            "1 while this process copies the stream's collection (an initial sync).",
            "stream",
        )
        #: The raw ``clusterTime`` of the last event each stream received in this
        #: process, converted when read (:attr:`last_cluster_time`), not per event.
        self.last_cluster: dict[str, Any] = {}
        #: The types of cluster time seen that convert (bson.Timestamp, datetime).
        self.time_types: set[type] = set()
        #: The streams whose initial sync runs in this process (``copy_in_progress`` 1).
        self.copying: set[str] = set()
        #: The per-event counts of each stream not yet added to the metrics above.
        self._tallies: dict[str, EventTally] = {}
        self._tallies_lock = threading.Lock()

    @property
    def last_cluster_time(self) -> dict[str, datetime]:
        """The cluster time of the last event each stream received in this process."""
        times = {}
        for stream, raw in list(self.last_cluster.items()):
            at = _cluster_datetime(raw)
            if at is not None:
                times[stream] = at
        return times

    def collectors(self) -> list[Any]:
        """Every metric object, for :class:`FlowwardenCollector` (which calls
        :meth:`fold` first: the per-event counts reach their metrics then)."""
        return [value for value in vars(self).values() if hasattr(value, "collect")]

    def fold(self) -> None:
        """Add the events counted since the last call to ``events_received``,
        ``events_processed`` and ``event_duration`` (:class:`FlowwardenCollector` calls
        it before each collection, so a scrape sees every event received until then)."""
        for tally in list(self._tallies.values()):
            tally.fold()

    def _tally(self, stream: str) -> EventTally:
        tally = self._tallies.get(stream)
        if tally is None:
            with self._tallies_lock:
                tally = self._tallies.get(stream)
                if tally is None:
                    tally = self._tallies[stream] = EventTally(self, stream)
        return tally

    def last_cluster_time_of(self, stream: str) -> datetime | None:
        """The cluster time of the last event *stream* received in this process."""
        return _cluster_datetime(self.last_cluster.get(stream))

    # -- receivers (sender is the stream name) ----------------------------------------

    # The two per-event receivers count into the stream's tally (no lock on the event
    # path, no labels() lookup: see prometheus_tally), and keep the cluster time as
    # sent: it is converted when read.

    @metrics.fast_path(lambda self, stream: self.fast_received(stream))
    @metrics.reads("cluster_time")
    def on_event_received(
        self,
        sender: str,
        cluster_time: Any = None,
        *,
        # Named, so that a call does not pack them into **kwargs: they are not read.
        signal: Any = None,
        event_id: Any = None,
        operation_type: Any = None,
        collection: Any = None,
        document_key: Any = None,
        wall_time: Any = None,
        **kwargs: Any,
    ) -> None:
        tally = self._tallies.get(sender) or self._tally(sender)
        tally.received_one()
        self.keep_cluster_time(sender, cluster_time)

    def keep_cluster_time(self, stream: str, cluster_time: Any) -> None:
        """Remember *cluster_time* as the last one of *stream* (when it is a time)."""
        kind = type(cluster_time)
        if kind in self.time_types or _is_time(cluster_time, self.time_types):
            self.last_cluster[stream] = cluster_time

    def fast_received(self, stream: str) -> Any:
        """What the runtime calls for each event *stream* receives: ``(cluster_time)``."""
        return self._tally(stream).count_received

    def fast_processed(self, stream: str) -> Any:
        """What the runtime calls as each event of *stream* ends: ``(success, duration)``."""
        return self._tally(stream).fast_processed()

    @metrics.fast_path(lambda self, stream: self.fast_processed(stream))
    def on_event_processed(
        self,
        sender: str,
        duration: float = 0.0,
        success: bool | None = True,
        *,
        signal: Any = None,
        **kwargs: Any,
    ) -> None:
        tally = self._tallies.get(sender) or self._tally(sender)
        tally.processed(success, duration)

    # The signals that count one per stream, each in its counter.
    on_event_sent_to_dlq = _count_per_stream("sent_to_dlq")
    on_event_dlq_failed = _count_per_stream("dlq_failures")
    on_stream_started = _count_per_stream("starts")
    on_stream_restarted = _count_per_stream("restarts")
    on_resume_fallback_to_seen = _count_per_stream("fallbacks_to_seen")
    on_resume_history_lost = _count_per_stream("history_lost")
    on_heartbeat_failed = _count_per_stream("heartbeat_failures")

    def on_event_error(self, sender: str, will_retry: bool = False, **kwargs: Any) -> None:
        self.event_errors.labels(sender, _label(will_retry)).inc()
        if will_retry:
            self.event_retries.labels(sender).inc()

    def on_checkpoint_saved(self, sender: str, anchor: str = "", **kwargs: Any) -> None:
        self.checkpoints_saved.labels(sender, anchor).inc()

    def on_checkpoint_failed(self, sender: str, anchor: str = "", **kwargs: Any) -> None:
        self.checkpoint_failures.labels(sender, anchor).inc()

    def on_stream_stopped(self, sender: str, reason: str = "", **kwargs: Any) -> None:
        self.stops.labels(sender, str(reason)).inc()
        # A copy cut short by the stop (or the crash) is no longer in progress here;
        # it resumes, with initial_sync_started, on the stream's next start.
        if sender in self.copying:
            self.copying.discard(sender)
            self.copy_in_progress.labels(sender).set(0)

    def on_stream_invalidated(self, sender: str, cause: str = "", **kwargs: Any) -> None:
        self.invalidations.labels(sender, str(cause)).inc()

    def on_initial_sync_started(self, sender: str, **kwargs: Any) -> None:
        self.copying.add(sender)
        self.copy_in_progress.labels(sender).set(1)

    def on_initial_sync_progress(self, sender: str, documents: int = 0, **kwargs: Any) -> None:
        self.documents_copied.labels(sender).inc(documents)

    def on_initial_sync_finished(
        self, sender: str, duration: float | None = None, **kwargs: Any
    ) -> None:
        self.copying.discard(sender)
        self.copy_in_progress.labels(sender).set(0)
        if duration is not None:
            self.copy_duration.labels(sender).set(duration)

    def on_oplog_stats(self, sender: str, hours: float | None = None, **kwargs: Any) -> None:
        if hours is None:
            with contextlib.suppress(KeyError):
                self.oplog_window.remove(sender)
        else:
            self.oplog_window.labels(sender).set(hours)

    def receivers(self) -> dict[str, Any]:
        """Signal name in ``streams/metrics.py`` → receiver."""
        return {
            name: getattr(self, f"on_{name}")
            for name in metrics.ALL_SIGNALS
            if hasattr(self, f"on_{name}")
        }


#: This process's event counters.
signal_metrics = SignalMetrics()

_installed = False
_install_lock = threading.Lock()


def install_receivers() -> None:
    """Connect :data:`signal_metrics` to the stream signals (once per process)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        for name, receiver in signal_metrics.receivers().items():
            metrics.ALL_SIGNALS[name].connect(
                receiver, weak=False, dispatch_uid=f"flowwarden_django.prometheus.{name}"
            )
        step_metrics.connect()
        _installed = True


class FlowwardenCollector:
    """Yields the status gauges (read at each scrape) and this process's event counters.

    ``include_status=False`` leaves out the gauges (and their database reads), for a
    worker process whose status the web process already reports.
    """

    def __init__(
        self, *, include_status: bool = True, signals: SignalMetrics | None = None
    ) -> None:
        self.include_status = include_status
        self.signals = signals or signal_metrics

    def describe(self) -> Iterable[Metric]:
        """The metric names without samples (so registering reads no database)."""
        families = list(_status_families().values()) if self.include_status else []
        if self.include_status:
            families.extend(queue_families().values())
            families.extend(run_families().values())
        for collector in self.signals.collectors():
            families.extend(collector.describe())
        families.extend(step_metrics.step_duration.describe())
        return families

    def collect(self) -> Iterator[Metric]:
        if self.include_status:
            yield from self.collect_status()
            yield from collect_queues()
            yield from collect_runs()
        self.signals.fold()
        for collector in self.signals.collectors():
            yield from collector.collect()
        yield from step_metrics.step_duration.collect()

    def collect_status(self, now: datetime | None = None) -> Iterator[Metric]:
        """The status gauges of every declared stream, as of *now*."""
        now = now or timezone.now()
        families = _status_families()
        try:
            statuses = stream_status(now)
        except Exception:
            logger.warning("cannot read the stream status for Prometheus", exc_info=True)
            families["flowwarden_status_up"].add_metric([], 0)
            yield families["flowwarden_status_up"]
            return
        families["flowwarden_status_up"].add_metric([], 1)
        for status in statuses:
            self._add_stream(families, status, now)
        yield from families.values()

    def _add_stream(self, families: dict[str, Any], status: StreamStatus, now: datetime) -> None:
        name = status.name
        families["flowwarden_stream_up"].add_metric([name], int(status.state in WORKING))
        families["flowwarden_stream_healthy"].add_metric([name], int(status.healthy))
        families["flowwarden_stream_paused"].add_metric([name], int(status.paused))
        for state in STATES:
            families["flowwarden_stream_state"].add_metric(
                [name, state], int(status.state == state)
            )
        families["flowwarden_stream_instances"].add_metric([name], len(status.instances))
        families["flowwarden_stream_status_error"].add_metric([name], int(bool(status.error)))
        optional = {
            "flowwarden_checkpoint_age_seconds": status.checkpoint_age_seconds,
            "flowwarden_heartbeat_age_seconds": status.heartbeat_age_seconds,
            "flowwarden_dlq_backlog": status.dlq_backlog,
            "flowwarden_stream_lag_seconds": self._lag(status, now),
            "flowwarden_stream_in_flight": status.in_flight if status.windowed else None,
            "flowwarden_stream_watermark_lag": (status.watermark_lag if status.windowed else None),
            "flowwarden_stream_parked_keys": (len(status.parked_keys) if status.windowed else None),
            "flowwarden_stream_last_event_timestamp_seconds": (
                status.last_event_time.timestamp() if status.last_event_time else None
            ),
        }
        for metric, value in optional.items():
            # No sample rather than a made-up value (a lying zero backlog, say).
            if value is not None:
                families[metric].add_metric([name], value)
        for instance in status.instances:
            for column, metric, _help in INSTANCE_COUNTERS:
                families[metric].add_metric([name, instance.key], getattr(instance, column))

    def _lag(self, status: StreamStatus, now: datetime) -> float | None:
        last = self.signals.last_cluster_time_of(status.name)
        if last is not None:
            return (now - last).total_seconds()
        return status.checkpoint_age_seconds


def _status_families() -> dict[str, Any]:
    """Fresh, empty metric families of the status gauges, by name."""
    stream = ["stream"]
    gauges = {
        "flowwarden_status_up": ("1 when the stream status could be read.", []),
        "flowwarden_stream_up": ("1 when the stream runs somewhere.", stream),
        "flowwarden_stream_healthy": (
            "0 when an enabled auto-start stream is not running.",
            stream,
        ),
        "flowwarden_stream_paused": ("1 when an operator paused the stream.", stream),
        "flowwarden_stream_state": ("1 for the stream's current state.", ["stream", "state"]),
        "flowwarden_stream_instances": ("Processes reporting on the stream.", stream),
        "flowwarden_stream_status_error": (
            "1 when the stream's checkpoint or DLQ store could not be read.",
            stream,
        ),
        "flowwarden_checkpoint_age_seconds": (
            "Age of the processed anchor (else of the seen anchor).",
            stream,
        ),
        "flowwarden_heartbeat_age_seconds": ("Age of the last checkpoint heartbeat.", stream),
        "flowwarden_dlq_backlog": ("Pending dead letters (absent when uncountable).", stream),
        "flowwarden_stream_lag_seconds": (
            "Seconds since the cluster time of the last event received in this process, "
            "else the checkpoint age.",
            stream,
        ),
        "flowwarden_stream_last_event_timestamp_seconds": (
            "Unix time of the last event handled, in any process.",
            stream,
        ),
        "flowwarden_stream_in_flight": (
            "Events admitted and not yet settled (a stream with parallelism > 1).",
            stream,
        ),
        "flowwarden_stream_watermark_lag": (
            "Events settled beyond the processed anchor, held behind an unsettled one.",
            stream,
        ),
        "flowwarden_stream_parked_keys": (
            "Keys parked behind a failing event that is being retried.",
            stream,
        ),
    }
    families: dict[str, Any] = {
        name: GaugeMetricFamily(name, doc, labels=labels) for name, (doc, labels) in gauges.items()
    }
    for _column, metric, doc in INSTANCE_COUNTERS:
        families[metric] = CounterMetricFamily(metric, doc, labels=["stream", "instance"])
    return families


def _cluster_datetime(value: Any) -> datetime | None:
    """A change event's ``clusterTime`` (``bson.Timestamp`` or datetime) as an aware datetime."""
    if isinstance(value, datetime):
        return as_utc(value)
    as_datetime = getattr(value, "as_datetime", None)
    return as_utc(as_datetime()) if callable(as_datetime) else None


def _label(value: bool) -> str:
    return "true" if value else "false"


def build_registry(**options: Any) -> CollectorRegistry:
    """A new registry holding one :class:`FlowwardenCollector` (*options* go to it)."""
    registry = CollectorRegistry()
    registry.register(FlowwardenCollector(**options))
    return registry


#: What ``/flowwarden/metrics/`` serves.
REGISTRY = build_registry()

install_receivers()
