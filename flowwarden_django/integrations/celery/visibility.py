"""A message held by a lost worker comes back within seconds (issue 51, item 4).

kombu's Redis transport emulates acknowledgements: a message a consumer takes is
recorded in the ``unacked`` hash and, with the time it was taken, in the
``unacked_index`` sorted set; the acknowledgement removes both. Any consumer puts
back on its queue a message recorded longer than ``visibility_timeout`` ago (kombu's
default: 1 hour, looked at every 100 s). With Celery's ``acks_late`` tasks (the
workflow steps, the events of ``execution="celery"`` streams) a worker killed before
its acknowledgement so leaves the message unhandled for an hour, and a stream's slot
waited for it until ``STREAM_EVENT_TIMEOUT``.

A short ``visibility_timeout`` alone would take a long task's message from the living
worker that runs it. So every worker that imports this package:

* sets the transport's ``visibility_timeout`` to ``FLOWWARDEN["CELERY_VISIBILITY_TIMEOUT"]``
  (10 s), and looks for messages to restore every fifth of it (``unacked_restore_interval``,
  ``unacked_restore_throttle`` 1), unless its configuration sets them;
* renews, every third of the timeout, the time in ``unacked_index`` of each message it
  holds (reserved or running; :class:`VisibilityRenewal`, a thread of the worker's main
  process, so a busy event loop or a ``solo`` task does not delay it).

A message a living worker holds is so never restored; one a dead worker held is put
back within the timeout and one restore interval of its last renewal, and taken by
another worker. Delivery stays at least once: a worker that could not renew for the
whole timeout (stopped, or cut off from Redis) may see its message run a second time
elsewhere. Every worker consuming from the broker (the same Redis database and
``unacked_key``) must run this package's renewal, or use a long timeout: the others'
long tasks would be restored while they run.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import bootsteps

from ...common.daemon_threads import DaemonThread
from ...common.durations import parse_duration
from ...common.failure_log import FailureLog
from ...conf import fw_settings
from .network import REDIS_SCHEMES, scheme_of, setting_of

logger = logging.getLogger("flowwarden_django.celery")

#: Renewals per visibility timeout.
RENEWALS_PER_TIMEOUT = 3
#: Restore scans per visibility timeout (``unacked_restore_interval``).
RESTORES_PER_TIMEOUT = 5


def visibility_timeout() -> float | None:
    """``FLOWWARDEN["CELERY_VISIBILITY_TIMEOUT"]`` in seconds; ``None``: kombu's."""
    raw = fw_settings.CELERY_VISIBILITY_TIMEOUT
    return None if raw is None else parse_duration(raw)


def visibility_options(timeout: float) -> dict[str, Any]:
    """The Redis transport options that restore a lost worker's messages *timeout*
    seconds after its last renewal, looking every fifth of it (at least every second)."""
    return {
        "visibility_timeout": timeout,
        "unacked_restore_interval": max(1, int(timeout // RESTORES_PER_TIMEOUT)),
        "unacked_restore_throttle": 1,
    }


def configure_visibility(app: Any, timeout: float | None = None) -> bool:
    """Give *app*'s Redis transport the options of :func:`visibility_options` that its
    configuration leaves unset (``CELERY_VISIBILITY_TIMEOUT`` by default); whether its
    broker is Redis and the setting is not ``None`` (a worker then renews)."""
    timeout = visibility_timeout() if timeout is None else timeout
    if timeout is None or scheme_of(setting_of(app.conf, "broker_url")) not in REDIS_SCHEMES:
        return False
    given = dict(app.conf.get("broker_transport_options") or {})
    app.conf["broker_transport_options"] = {**visibility_options(timeout), **given}
    return True


def renew_interval(timeout: float) -> float:
    """Seconds between two renewals for a *timeout*: a third of it, at most, and at
    least half a second."""
    return max(0.5, timeout / RENEWALS_PER_TIMEOUT)


class VisibilityRenewal(DaemonThread):
    """Renews, every third of the visibility timeout, the ``unacked_index`` time of the
    messages the worker *worker* (a ``WorkController``) holds on a Redis broker, on a
    daemon thread from :meth:`start` until :meth:`stop`."""

    stop_timeout = 5.0

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.renewed = 0
        super().__init__("fw-visibility-renewal")
        self._clients: dict[int, Any] = {}
        self.failure_log = FailureLog(logger, "Celery: renewing the held messages' visibility")

    def channel(self) -> Any:
        """The Redis channel the worker takes its tasks on, or ``None`` (not connected
        yet, or not kombu's Redis transport)."""
        consumer = getattr(self.worker, "consumer", None)
        task_consumer = getattr(consumer, "task_consumer", None)
        channel = getattr(task_consumer, "channel", None)
        if channel is None or not hasattr(channel, "unacked_index_key"):
            return None
        return channel

    def renew_once(self) -> int:
        """Renew the held messages once; how many (never raises: a failure is logged
        and tried again at the next tick)."""
        channel = self.channel()
        if channel is None:
            return 0
        try:
            tags = _held_tags(channel)
            if tags:
                client = self._client(channel)
                now = time.time()
                # XX: only messages still recorded (one acknowledged meanwhile is not
                # recorded again).
                client.zadd(channel.unacked_index_key, dict.fromkeys(tags, now), xx=True)
        except Exception as exc:
            self.failure_log.failed(exc)
            self._clients.clear()
            return 0
        self.failure_log.succeeded()
        self.renewed += len(tags)
        return len(tags)

    def interval(self) -> float:
        channel = self.channel()
        timeout = getattr(channel, "visibility_timeout", None) or visibility_timeout()
        return renew_interval(float(timeout or 3.0))

    def _client(self, channel: Any) -> Any:
        # The channel's own client class (key prefix, credentials) on its pool of
        # synchronous connections, which is safe to share between threads.
        client = self._clients.get(id(channel))
        if client is None:
            self._clients.clear()
            client = self._clients[id(channel)] = channel._create_client()
        return client

    def _work(self) -> None:
        while not self._stop.wait(self.interval()):
            self.renew_once()


def _held_tags(channel: Any) -> list[str]:
    """The delivery tags of the messages *channel* took and has not acknowledged (read
    while the worker's event loop may change them). An acknowledged message stays in
    ``_delivered`` until the next poll, marked in ``_dirty``: not held."""
    qos = channel.qos
    for _ in range(5):
        try:
            dirty = set(getattr(qos, "_dirty", ()))
            return [tag for tag in list(qos._delivered) if tag not in dirty]
        except RuntimeError:  # changed during the copy
            continue
    return []


class VisibilityBootstep(bootsteps.StartStopStep):
    """Runs :class:`VisibilityRenewal` in the worker's main process while the worker
    runs; added by ``install_from_settings`` when the broker is Redis and
    ``CELERY_VISIBILITY_TIMEOUT`` is not ``None``."""

    requires = ("celery.worker.components:Pool",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.renewal: VisibilityRenewal | None = None

    def start(self, parent: Any) -> None:
        self.renewal = VisibilityRenewal(parent)
        self.renewal.start()

    def stop(self, parent: Any) -> None:
        renewal, self.renewal = self.renewal, None
        if renewal is not None:
            renewal.stop()

    terminate = stop
