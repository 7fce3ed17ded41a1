"""A consumer's life, once for both runtimes: its states, the restart loop around its
generations, and what each start, restart, crash and stop reports.

``supervise(consumer)`` asks its driver to run one generation after another
(``RunGeneration``: open, consume, close) until the stream stops. A generation that
fails is retried with the stream's restart policy (attempts count restarts without
progress, so a generation that handled events resets them); lost history under
``FAIL``, a rename, a conflicting copy or running out of attempts is terminal, and a
lost lease stops the stream without another write.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import random
from typing import Any

from django.utils import timezone

from ...common.outages import error_summary, is_outage, short_message
from .. import initial_sync, metrics
from ..locks import LeaseLostError
from ..spec import StreamSpec
from .driving import Decision
from .effects import DiscardUnusableConnections, PauseBeforeRestart, RunGeneration
from .resume import HistoryLostError

logger = logging.getLogger("flowwarden_django.streams")

#: The longest wait between two restarts while a server does not answer (an outage,
#: see ``common.outages``), whatever the restart policy's ``max_delay``: the stream
#: notices the server's return within this many seconds.
OUTAGE_RESTART_MAX_SECONDS = 2.0


class StreamState(enum.StrEnum):
    """Where a consumer is in its life."""

    STARTING = "starting"
    #: Copying the collection's existing documents (an initial sync) before streaming.
    COPYING = "copying"
    RUNNING = "running"
    RESTARTING = "restarting"
    STOPPED = "stopped"
    CRASHED = "crashed"


class StreamInvalidatedError(RuntimeError):
    """The watched collection was renamed (or dropped under FAIL): the stream stops."""


class RestartNow(Exception):
    """End this generation and resubscribe at once (after a self-healed invalidate)."""


#: What ends a stream for good: raised to whoever runs it, after ``crashed``.
TERMINAL_ERRORS = (HistoryLostError, StreamInvalidatedError, initial_sync.InitialSyncConflictError)


def supervise(consumer: Any, *, burst: bool) -> Decision[None]:
    """Run generations until *consumer* stops; raise when the stream ends for good.

    *consumer* keeps the counters and the state (``state``, ``restarts``,
    ``events_handled``, ``documents_copied``, ``last_error``...) and says whether
    a stop was asked for (``stopping``).
    """
    spec: StreamSpec = consumer.spec
    attempt = 0
    while not consumer.stopping:
        # A restart's attempt stays ``restarting`` until the stream runs again: an
        # outage is reported for as long as it lasts, not only between attempts.
        restarting_now = consumer.restarting_since is not None
        consumer.state = StreamState.RESTARTING if restarting_now else StreamState.STARTING
        handled_before = consumer.events_handled + consumer.documents_copied
        try:
            yield RunGeneration(burst)
            break
        except initial_sync.CopyInterrupted:
            break  # a stop during the copy: it resumes after its last committed batch
        except RestartNow:
            consumer.restarts += 1
        except TERMINAL_ERRORS as exc:
            crashed(consumer, exc)
            raise
        except LeaseLostError as exc:
            # Another process leads now: stop here, without another write.
            consumer.last_error = exc
            logger.warning("stream %r: %s; stopping", spec.name, exc)
            break
        except Exception as exc:
            progressed = consumer.events_handled + consumer.documents_copied > handled_before
            attempt = 1 if progressed else attempt + 1
            policy = spec.restart_policy
            if policy.max_attempts and attempt > policy.max_attempts:
                crashed(consumer, exc)
                raise
            # Django drops broken connections only around requests: without this,
            # every restart would fail again on the dead connection.
            yield DiscardUnusableConnections()
            if (yield PauseBeforeRestart(restarting(consumer, attempt, exc))):
                break
    consumer.state = StreamState.STOPPED
    metrics.emit(metrics.stream_stopped, spec.name, reason="GRACEFUL", cause=None)


def restart_delay(spec: StreamSpec, attempt: int, exc: BaseException | None = None) -> float:
    """The wait before restart *attempt*: the restart policy's, shorter in an outage."""
    policy = spec.restart_policy
    delay = policy.delay(attempt)
    if policy.jitter:
        delay *= random.uniform(0.8, 1.2)
    if exc is not None and is_outage(exc):
        delay = min(delay, OUTAGE_RESTART_MAX_SECONDS)
    return delay


def restarting(consumer: Any, attempt: int, exc: BaseException) -> float:
    """Record that *exc* stopped the stream and it restarts (attempt *attempt*); the
    delay before it does."""
    name = consumer.spec.name
    consumer.last_error = exc
    if consumer.restarting_since is None:
        consumer.restarting_since = timezone.now()
    consumer.state = StreamState.RESTARTING
    delay = restart_delay(consumer.spec, attempt, exc)
    # One traceback when the trouble starts or changes, not one a restart.
    changed = type(exc) is not consumer.restart_error
    consumer.restart_error = type(exc)
    logger.warning(
        "stream %r: stopped by %s (%s); restart %d in %.1fs",
        name,
        error_summary(exc),
        short_message(exc),
        attempt,
        delay,
        exc_info=changed,
    )
    consumer.restarts += 1
    consumer.restart_cause = (attempt, exc)
    return delay


def failing(consumer: Any, exc: BaseException) -> None:
    """A generation is ending on *exc*, an outage: report it now (``restarting``, its
    error), before the generation's cleanup, which may wait on the same silent server
    (closing the window, flushing the anchor); :func:`restarting` follows."""
    if not is_outage(exc) or isinstance(exc, LeaseLostError):
        return
    consumer.last_error = exc
    if consumer.restarting_since is None:
        consumer.restarting_since = timezone.now()
    consumer.state = StreamState.RESTARTING


def started(consumer: Any) -> None:
    """A generation opened its change stream: the stream runs (again)."""
    spec = consumer.spec
    consumer.state = StreamState.RUNNING
    consumer.started_at = timezone.now()
    if consumer.restarting_since is not None:
        logger.info(
            "stream %r: running again (restarting since %s)",
            spec.name,
            consumer.restarting_since.isoformat(timespec="seconds"),
        )
        consumer.restarting_since, consumer.restart_error = None, None
    metrics.emit(metrics.stream_started, spec.name, config=configuration(spec))
    if consumer.restart_cause is not None:
        attempt, cause = consumer.restart_cause
        consumer.restart_cause = None
        metrics.emit(metrics.stream_restarted, spec.name, attempt=attempt, cause=cause)


def crashed(consumer: Any, exc: BaseException) -> None:
    """The stream ended for good with *exc*."""
    consumer.state = StreamState.CRASHED
    consumer.last_error = exc
    logger.error("stream %r stopped: %s", consumer.spec.name, exc)
    metrics.emit(metrics.stream_stopped, consumer.spec.name, reason="CRASHED", cause=exc)


def configuration(spec: StreamSpec) -> dict[str, Any]:
    """The stream's settings as ``stream_started`` reports them."""
    retry = spec.retry_policy
    return {
        "stream": spec.name,
        "collection": spec.collection,
        "database": spec.database,
        "deployment_mode": spec.deployment_mode,
        "checkpoint": dataclasses.asdict(spec.checkpoint),
        "retry": None
        if retry is None
        else {
            "max_attempts": retry.max_attempts,
            "initial_delay": retry.initial_delay,
            "max_delay": retry.max_delay,
            "multiplier": retry.multiplier,
            "jitter": retry.jitter,
        },
        "dlq": None
        if spec.dead_letter_queue is None
        else dataclasses.asdict(spec.dead_letter_queue),
        "handlers": sorted(spec.handlers) + (["change"] if spec.on_change else []),
    }
