"""Running declared streams: ``StreamManager`` starts, stops and restarts consumers,
each on its own thread, and one supervisor thread per manager that

* holds the leases of ``SINGLE_LEADER`` streams (acquire as standby, renew as
  leader, stop the consumer the moment the lease is lost, then stand by again:
  retried with backoff while the lock service does not answer);
* publishes this process's view of its streams (``StreamWorker`` rows) and the
  DLQ backlog, for the health view, the status command and the admin;
* applies operators' requests (``StreamControl``: pause, resume, restart).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from django.db import connections
from django.utils import timezone

from ...common.app_models import models
from ...common.connections import discard_unusable_connections
from ...common.failure_log import FailureLog
from ...common.outages import error_summary
from ...conf import fw_settings
from .. import metrics
from ..checkpoint import CheckpointStore
from ..clients import pymongo_source
from ..core.window import WindowStats
from ..registry import StreamRegistry, stream_registry
from ..source import ChangeSource
from ..spec import StreamSpec, parse_duration
from ..stores import checkpoint_stores, lock_services
from .leadership import Leadership
from .observed_store import ObservedCheckpointStore
from .threaded import StreamConsumer, StreamState

logger = logging.getLogger("flowwarden_django.streams")

#: Seconds between two DLQ backlog counts of a stream with no new dead letters.
BACKLOG_REFRESH_SECONDS = 60.0
#: Seconds between two oplog window reports per MongoDB client (reference: 60 s).
OPLOG_STATS_SECONDS = 60.0


class LockServiceUnavailable(ConnectionError):
    """What the status rows report while a ``SINGLE_LEADER`` stream's lock service does
    not answer (this process stands by and retries)."""


def default_instance_id() -> str:
    """``FLOWWARDEN["INSTANCE_ID"]``, else ``<hostname>:<pid>``."""
    return fw_settings.INSTANCE_ID or f"{socket.gethostname()}:{os.getpid()}"


class StreamManager:
    """Starts and stops stream consumers by name; one thread per running stream.

    ``start(name)`` builds the stream's spec afresh (a new instance of its class),
    so a restart picks up the current declaration. A ``SINGLE_LEADER`` stream
    runs only while this process holds its lease; until then it stands by and
    the supervisor polls for the lease. ``publish_status=False`` keeps the manager
    off the database: no status rows, no operator requests (tests, embedded use).

    Stream threads are not daemons (a stream's anchor must be flushed before the
    process ends), so a script stops its manager, best with ``with``, which stops
    every stream on the way out, an exception included::

        with StreamManager() as manager:
            manager.start_all()
            ...  # raises or returns: the streams stop and flush either way
    """

    def __init__(
        self,
        registry: StreamRegistry | None = None,
        source_factory: Callable[[StreamSpec], ChangeSource] = pymongo_source,
        *,
        instance_id: str | None = None,
        publish_status: bool = True,
    ) -> None:
        self.registry = registry or stream_registry
        self.source_factory = source_factory
        self.instance_id = instance_id or default_instance_id()
        # Leases are held under a name unique to this manager: two processes given
        # the same INSTANCE_ID (one shared settings file) must never share a lease.
        self.lease_owner = f"{self.instance_id}#{uuid.uuid4().hex[:8]}"
        self.publish_status = publish_status
        self._consumers: dict[str, StreamConsumer] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._leaderships: dict[str, Leadership] = {}
        self._wanted: dict[str, bool] = {}  # name -> burst
        self._paused: set[str] = set()
        self._handled_restarts: dict[str, datetime] = {}
        self._supervisor_failures = FailureLog(logger, "stream supervisor: a pass")
        self._oplog_failures: dict[str, FailureLog] = {}
        self._publish_failures = FailureLog(logger, "streams: publishing this process's status")
        self._restart_pending: set[str] = set()
        self._backlog_at: dict[str, float] = {}
        self._oplog_at: dict[str, float] = {}
        self._lock = threading.RLock()
        self._closing = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._next_status = float("-inf")

    # -- settings ----------------------------------------------------------------------

    @staticmethod
    def _seconds(key: str) -> float:
        return parse_duration(getattr(fw_settings, key))

    @property
    def tick(self) -> float:
        """How often the supervisor wakes up."""
        intervals = [self._seconds("STATUS_INTERVAL")]
        if self._leaderships:
            intervals += [
                self._seconds("LEADER_RENEW_INTERVAL"),
                self._seconds("STANDBY_POLL_INTERVAL"),
            ]
        return max(0.05, min(1.0, *(i / 4 for i in intervals)))

    # -- starting and stopping ---------------------------------------------------------

    def startable(self) -> list[str]:
        """Names of the enabled, auto-started streams."""
        return [n for n, s in self.registry.specs().items() if s.enabled and s.auto_start]

    def consumer(self, name: str) -> StreamConsumer | None:
        """The consumer of a started stream."""
        return self._consumers.get(name)

    def leadership(self, name: str) -> Leadership | None:
        """The lease state of a ``SINGLE_LEADER`` stream this manager runs."""
        return self._leaderships.get(name)

    def start(self, name: str, *, burst: bool = False) -> StreamConsumer | None:
        """Start one stream (no-op if it is running). A ``SINGLE_LEADER`` stream
        starts only if this process gets its lease; else it stands by (``None``)."""
        spec = self.registry.get(name)
        if not spec.enabled:
            raise ValueError(f"stream {name!r} is disabled (enabled=False)")
        with self._lock:
            supervisor = self._supervisor
            if self._closing.is_set() and (supervisor is None or not supervisor.is_alive()):
                self._closing.clear()  # started again after stop_all()
            self._wanted[name] = burst
            self._paused.discard(name)
            if spec.deployment_mode == "SINGLE_LEADER":
                leadership = self._leadership_for(spec)
                if not leadership.is_valid() and not leadership.try_lead():
                    self._ensure_supervisor()
                    return None
                consumer = self._launch(spec, burst, leadership)
            else:
                consumer = self._launch(spec, burst, None)
        self._ensure_supervisor()
        return consumer

    def _leadership_for(self, spec: StreamSpec) -> Leadership:
        leadership = self._leaderships.get(spec.name)
        if leadership is None:
            leadership = self._leaderships[spec.name] = Leadership(
                spec.name,
                lock_services[spec.lock_service],
                self.lease_owner,
                ttl=self._seconds("LEADER_LEASE_TTL"),
                renew_interval=self._seconds("LEADER_RENEW_INTERVAL"),
                poll_interval=self._seconds("STANDBY_POLL_INTERVAL"),
            )
        return leadership

    def _launch(
        self, spec: StreamSpec, burst: bool, leadership: Leadership | None
    ) -> StreamConsumer:
        name = spec.name
        thread = self._threads.get(name)
        if thread is not None and thread.is_alive():
            return self._consumers[name]
        store = checkpoint_stores[spec.checkpoint_store]
        if leadership is not None:
            store = ObservedCheckpointStore(store, name, fence=leadership.fence)
        consumer = self._new_consumer(
            spec, store, leadership.is_valid if leadership is not None else None
        )
        self._consumers[name] = consumer
        self._threads[name] = self._start_consumer(consumer, burst)
        return consumer

    def _new_consumer(
        self, spec: StreamSpec, store: CheckpointStore, lease_valid: Callable[[], bool] | None
    ) -> StreamConsumer:
        """The consumer of a stream being launched (*store* is fenced when it leads)."""
        return StreamConsumer(spec, store, self.source_factory, lease_valid=lease_valid)

    def _start_consumer(self, consumer: StreamConsumer, burst: bool) -> threading.Thread:
        """Start *consumer*; what runs it, as a thread (``is_alive``, ``join``)."""
        thread = threading.Thread(
            target=self._run,
            args=(consumer, burst),
            name=f"fw-stream-{consumer.spec.name}",
            daemon=False,
        )
        thread.start()
        return thread

    def _run(self, consumer: StreamConsumer, burst: bool) -> None:
        try:
            consumer.run(burst=burst)
        except Exception:  # terminal: state is CRASHED and last_error says why
            logger.debug("stream %r ended", consumer.spec.name, exc_info=True)
        finally:
            connections.close_all()  # this thread's own connections

    def __enter__(self) -> StreamManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()

    def start_all(self, names: Iterable[str] | None = None, *, burst: bool = False) -> None:
        """Start the given streams, or every enabled auto-start stream."""
        for name in names if names is not None else self.startable():
            self.start(name, burst=burst)

    def stop(self, name: str, timeout: float | None = 30) -> None:
        """Stop one stream gracefully (its dirty anchor is flushed), wait for it, and
        give up its lease."""
        with self._lock:
            self._wanted.pop(name, None)
        self._halt(name, timeout)

    def _halt(self, name: str, timeout: float | None) -> None:
        consumer, thread = self._consumers.get(name), self._threads.get(name)
        if consumer is not None and thread is not None:
            consumer.stop()
            thread.join(timeout)
        leadership = self._leaderships.get(name)
        if leadership is not None and (thread is None or not thread.is_alive()):
            leadership.release()

    def restart(self, name: str) -> StreamConsumer | None:
        """Stop then start one stream."""
        burst = self._wanted.get(name, False)
        self.stop(name)
        return self.start(name, burst=burst)

    def stop_all(self, timeout: float | None = 30) -> None:
        """Stop every stream: ask all first, then wait for each, then release leases."""
        with self._lock:
            self._wanted.clear()
        self._closing.set()
        for consumer in list(self._consumers.values()):
            consumer.stop()
        for thread in list(self._threads.values()):
            if thread.is_alive():
                thread.join(timeout)
        for name, leadership in list(self._leaderships.items()):
            thread = self._threads.get(name)
            if thread is None or not thread.is_alive():
                leadership.release()
        supervisor = self._supervisor
        if supervisor is not None and supervisor is not threading.current_thread():
            supervisor.join(timeout)

    def any_running(self) -> bool:
        """Whether any stream's thread is alive, or a stream stands by for its lease."""
        if any(thread.is_alive() for thread in list(self._threads.values())):
            return True
        return any(not burst for burst in self._standing_by().values())

    def _standing_by(self) -> dict[str, bool]:
        with self._lock:
            return {
                name: burst
                for name, burst in self._wanted.items()
                if name in self._leaderships and name not in self._paused
            }

    def wait(self, timeout: float | None = None) -> None:
        """Wait until every started stream's thread has ended."""
        for thread in list(self._threads.values()):
            thread.join(timeout)

    # -- the supervisor ----------------------------------------------------------------

    def _ensure_supervisor(self) -> None:
        with self._lock:
            if self._closing.is_set():
                return
            if self._supervisor is not None and self._supervisor.is_alive():
                return
            self._supervisor = threading.Thread(
                target=self._supervise, name="fw-stream-supervisor", daemon=True
            )
            self._supervisor.start()

    def _supervise(self) -> None:
        try:
            while not self._closing.wait(self.tick):
                try:
                    self.supervise_once()
                except Exception as exc:
                    self._supervisor_failures.failed(exc)
                    discard_unusable_connections()
                else:
                    self._supervisor_failures.succeeded()
            self._publish(final=True)
        finally:
            connections.close_all()

    def supervise_once(self) -> None:
        """One supervisor pass: each stream (lease, relaunch), then (when due) the DLQ
        backlog, operators' requests and this process's status rows."""
        with self._lock:
            names = set(self._wanted) | set(self._leaderships) | self._restart_pending
        for name in sorted(names):
            try:
                self._supervise_stream(name)
            except Exception:
                # One stream's trouble (its declaration gone, its store misconfigured)
                # must not stop the renewal of the others' leases.
                logger.exception("stream %r: supervising it failed", name)
                self._give_up_lease_if_idle(name)
        now = time.monotonic()
        if now >= self._next_status:
            self._next_status = now + self._seconds("STATUS_INTERVAL")
            self._refresh_backlogs()
            self._report_oplog_windows()
            if self.publish_status:
                self._apply_controls()
                self._publish()

    def _supervise_stream(self, name: str) -> None:
        if name in self._leaderships:
            self._supervise_lease(name)
            return
        if self._should_relaunch(name):
            with self._lock:
                self._restart_pending.discard(name)
                self._launch(self.registry.get(name), False, None)

    def _should_relaunch(self, name: str) -> bool:
        """A wanted, continuous stream whose thread ended without a terminal crash
        (stopped for a restart or while its lease was in doubt) runs again."""
        with self._lock:
            burst = self._wanted.get(name)
            if burst is None or burst or name in self._paused:
                return False
            restart = name in self._restart_pending
        thread = self._threads.get(name)
        if thread is not None and thread.is_alive():
            return False
        consumer = self._consumers.get(name)
        return restart or consumer is None or consumer.state is not StreamState.CRASHED

    def _give_up_lease_if_idle(self, name: str) -> None:
        leadership = self._leaderships.get(name)
        thread = self._threads.get(name)
        if leadership is not None and (thread is None or not thread.is_alive()):
            leadership.release()

    def _supervise_lease(self, name: str) -> None:
        leadership = self._leaderships[name]
        with self._lock:
            burst = self._wanted.get(name)
            wanted = burst is not None and name not in self._paused
        consumer, thread = self._consumers.get(name), self._threads.get(name)
        alive = thread is not None and thread.is_alive()
        if leadership.lease is not None:
            if not wanted:
                if not alive:
                    leadership.release()  # paused or stopped: let another process lead
                return
            crashed = consumer is not None and consumer.state is StreamState.CRASHED
            if not alive and crashed and name not in self._restart_pending:
                # Terminal (history lost, invalidated, out of restarts): let another
                # process try instead of holding the stream hostage.
                logger.error("stream %r crashed; releasing its lease", name)
                leadership.release()
                with self._lock:
                    self._wanted.pop(name, None)
                return
            if leadership.due() and not leadership.renew():
                if consumer is not None:
                    consumer.stop()  # it also stops by itself before its next event
                return
            if leadership.is_valid() and self._should_relaunch(name):
                with self._lock:
                    self._restart_pending.discard(name)
                    self._launch(self.registry.get(name), False, leadership)
            return
        if alive:
            consumer.stop()  # the lease was lost but the consumer has not noticed yet
            return
        if wanted and leadership.due() and leadership.try_lead():
            with self._lock:
                if self._wanted.get(name) is not None:
                    self._restart_pending.discard(name)
                    self._launch(self.registry.get(name), bool(burst), leadership)

    # -- operator requests -------------------------------------------------------------

    def _apply_controls(self) -> None:
        """Apply pauses, resumptions and restart requests. Nothing here waits for a
        consumer: it is asked to stop, and later passes start it again or release
        its lease once its thread has ended (leases keep being renewed meanwhile)."""
        with self._lock:
            names = set(self._wanted) | self._paused
        if not names:
            return
        controls = {
            c.stream_name: c for c in models.StreamControl.objects.filter(stream_name__in=names)
        }
        for name in names:
            control = controls.get(name)
            if control is None:
                continue
            consumer = self._consumers.get(name)
            if control.paused and name not in self._paused:
                logger.info("stream %r paused by %s", name, control.updated_by or "an operator")
                with self._lock:
                    self._paused.add(name)
                if consumer is not None:
                    consumer.stop()
            elif not control.paused and name in self._paused:
                logger.info("stream %r resumed by %s", name, control.updated_by or "an operator")
                with self._lock:
                    self._paused.discard(name)
                    self._wanted.setdefault(name, False)
                    self._restart_pending.add(name)  # even after a crash
            requested = control.restart_requested_at
            if requested is not None and requested != self._handled_restarts.get(name):
                self._handled_restarts[name] = requested
                started = consumer.started_at if consumer is not None else None
                if name not in self._paused and (started is None or requested > started):
                    logger.info("stream %r: restart requested by %s", name, control.updated_by)
                    with self._lock:
                        self._wanted.setdefault(name, False)
                        self._restart_pending.add(name)
                    if consumer is not None:
                        consumer.stop()

    # -- status and backlog ------------------------------------------------------------

    def _refresh_backlogs(self) -> None:
        """Count DLQ backlogs: after a dead-letter write, else once a minute (coalesced,
        off the streams' threads)."""
        now = time.monotonic()
        for name, consumer in list(self._consumers.items()):
            queue = consumer.spec.dead_letter_queue
            if queue is None or not queue.enabled:
                continue
            due = now - self._backlog_at.get(name, float("-inf")) >= BACKLOG_REFRESH_SECONDS
            if not (consumer.dlq_dirty.is_set() or due):
                continue
            consumer.dlq_dirty.clear()
            self._backlog_at[name] = now
            try:
                pending = consumer.dlq_store.count(name)
            except Exception:
                logger.warning("stream %r: counting the DLQ backlog failed", name, exc_info=True)
                continue
            if pending >= 0:  # -1: the store cannot count; never report a made-up zero
                metrics.emit(metrics.dlq_backlog, name, pending=pending)

    def _report_oplog_windows(self) -> None:
        """``oplog_stats`` (sender: the client alias) once a minute per MongoDB client
        this process reads: the hours between the oldest and newest oplog entries, with
        ``OK``, ``UNAVAILABLE`` (no readable oplog) or ``ERROR``."""
        now = time.monotonic()
        specs: dict[str, StreamSpec] = {}
        for consumer in list(self._consumers.values()):
            specs.setdefault(consumer.spec.client, consumer.spec)
        for alias, spec in specs.items():
            if now - self._oplog_at.get(alias, float("-inf")) < OPLOG_STATS_SECONDS:
                continue
            self._oplog_at[alias] = now
            if not metrics.oplog_stats.has_listeners(alias):
                continue
            hours, status = None, "UNAVAILABLE"
            try:
                read = getattr(self.source_factory(spec), "oplog_window", None)
                window = read() if read is not None else None
                if window is not None and None not in window:
                    oldest, newest = window
                    hours, status = (newest.time - oldest.time) / 3600, "OK"
            except Exception as exc:
                self._oplog_failures.setdefault(
                    alias, FailureLog(logger, f"client {alias!r}: reading the oplog window")
                ).failed(exc)
                status = "ERROR"
            else:
                if alias in self._oplog_failures:
                    self._oplog_failures[alias].succeeded()
            metrics.emit(metrics.oplog_stats, alias, hours=hours, status=status)

    def state_of(self, name: str) -> tuple[str, str]:
        """This process's ``(state, role)`` of one stream, as published."""
        consumer, thread = self._consumers.get(name), self._threads.get(name)
        leadership = self._leaderships.get(name)
        role = leadership.role if leadership is not None else ""
        if name in self._paused:
            return "paused", role
        if consumer is not None and thread is not None and thread.is_alive():
            return consumer.state.value, role
        if leadership is not None and name in self._wanted:
            return "standby", role
        if consumer is not None:
            return consumer.state.value, role
        return StreamState.STOPPED.value, role

    def error_of(self, name: str) -> BaseException | None:
        """What went wrong last for stream *name* in this process: the lock service's
        error while it does not answer (a ``SINGLE_LEADER`` stream standing by), else
        its consumer's last error."""
        leadership = self._leaderships.get(name)
        if leadership is not None and leadership.outage is not None:
            return LockServiceUnavailable(f"the lock service does not answer: {leadership.outage}")
        consumer = self._consumers.get(name)
        return consumer.last_error if consumer is not None else None

    def _publish(self, *, final: bool = False) -> None:
        if not self.publish_status:
            return
        names = set(self._consumers) | set(self._wanted) | self._paused
        now = timezone.now()
        for name in sorted(names):
            consumer = self._consumers.get(name)
            state, role = self.state_of(name)
            error = self.error_of(name)
            if final and state not in ("crashed", "paused"):
                # A graceful stop leaves no instance behind: its row would count as one.
                self._withdraw(name)
                continue
            values = {
                "state": state,
                "role": role,
                "started_at": consumer.started_at if consumer else None,
                "last_event_at": consumer.last_event_at if consumer else None,
                "events": consumer.events_handled if consumer else 0,
                "errors": consumer.errors if consumer else 0,
                "retries": consumer.retries if consumer else 0,
                "dead_lettered": consumer.dead_lettered if consumer else 0,
                "restarts": consumer.restarts if consumer else 0,
                "last_error": str(error or ""),
                "error_kind": error_summary(error)[:255] if error is not None else "",
                "restarting_since": consumer.restarting_since if consumer else None,
                **window_report(consumer),
                "updated_at": now,
            }
            try:
                # Two autocommitted statements, no transaction: on SQLite a
                # read-then-write transaction fails at once when another process
                # writes, where a plain statement waits for its turn.
                mine = models.StreamWorker.objects.filter(
                    stream_name=name, instance_id=self.instance_id
                )
                if not mine.update(**values):
                    models.StreamWorker.objects.create(
                        stream_name=name, instance_id=self.instance_id, **values
                    )
            except Exception as exc:
                self._publish_failures.failed(exc)
                discard_unusable_connections()
            else:
                self._publish_failures.succeeded()

    def _withdraw(self, name: str) -> None:
        """Delete this process's ``StreamWorker`` row of stream *name*."""
        try:
            models.StreamWorker.objects.filter(
                stream_name=name, instance_id=self.instance_id
            ).delete()
        except Exception as exc:
            self._publish_failures.failed(exc)
            discard_unusable_connections()

    def status(self) -> list[dict[str, Any]]:
        """One row per declared stream, as this process sees it."""
        rows = []
        for name, spec in self.registry.specs().items():
            consumer = self._consumers.get(name)
            state, role = self.state_of(name)
            rows.append(
                {
                    "name": name,
                    "collection": f"{spec.database or '(default db)'}.{spec.collection}",
                    "enabled": spec.enabled,
                    "state": state,
                    "role": role,
                    "events": consumer.events_handled if consumer else 0,
                    "restarts": consumer.restarts if consumer else 0,
                    "last_event_at": consumer.last_event_at if consumer else None,
                    "last_error": str(self.error_of(name) or ""),
                }
            )
        return rows


def window_report(consumer: Any) -> dict[str, Any]:
    """The ``StreamWorker`` fields of a parallel stream's window (zeros without one)."""
    window = getattr(consumer, "window", None) if consumer is not None else None
    stats = window.window.stats() if window is not None else WindowStats()
    return {
        "in_flight": stats.in_flight,
        "watermark_lag": stats.watermark_lag,
        "parked_keys": list(stats.parked_keys),
    }
