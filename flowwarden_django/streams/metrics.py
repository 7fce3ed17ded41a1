"""Stream metric events as Django signals (the reference's ``StreamMetricsProvider``).

Connect a receiver to any of these to observe streams; the Prometheus exporter
(``flowwarden_django.prometheus``) is one such receiver. Every signal is sent
with ``sender=`` the stream name (``oplog_stats``: the client alias) and keyword
arguments listed below. Emission follows the reference's rules: ``checkpoint_saved``
and ``event_sent_to_dlq`` only after the write succeeded, failures on their own
signals, and ``dlq_backlog`` never with a made-up count.

Receivers run on the stream's thread: they must be quick. A receiver that raises
is logged and never disturbs the stream.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("flowwarden_django.streams.metrics")

#: ``config`` (dict): after each successful start or managed restart.
stream_started = Signal()
#: ``reason`` ("GRACEFUL" or "CRASHED"), ``cause`` (exception or None).
stream_stopped = Signal()
#: ``attempt`` (int), ``cause`` (the exception that ended the previous generation).
stream_restarted = Signal()
#: ``cause`` ("drop", "dropDatabase" or "rename").
stream_invalidated = Signal()
#: ``event_id``, ``operation_type``, ``collection``, ``document_key``, ``cluster_time``,
#: ``wall_time``: before dispatch.
event_received = Signal()
#: ``duration`` (seconds, float), ``success`` (bool): after the attempt loop.
event_processed = Signal()
#: ``error`` (exception), ``will_retry`` (bool), ``attempt`` (int), ``event_id``.
event_error = Signal()
#: ``anchor`` ("processed", "seen", "heartbeat", "reset", "record" for a whole-record save,
#: or "initial_sync"), ``token`` (the resume token, else None): after a successful write.
checkpoint_saved = Signal()
#: ``anchor``, ``error``: any failed checkpoint write.
checkpoint_failed = Signal()
#: The processed anchor aged out of the oplog; resumed from the seen anchor.
resume_fallback_to_seen = Signal()
#: Both anchors aged out; the history-lost strategy applies.
resume_history_lost = Signal()
#: ``error``: an idle heartbeat write failed.
heartbeat_failed = Signal()
#: ``entry_id``: after a successful dead-letter write.
event_sent_to_dlq = Signal()
#: ``error``: a dead-letter write failed (the event is settled anyway).
event_dlq_failed = Signal()
#: ``pending`` (int): the stream's DLQ backlog, when the store can count.
dlq_backlog = Signal()
#: ``hours`` (float or None), ``status`` ("OK", "UNAVAILABLE" or "ERROR").
oplog_stats = Signal()
#: ``reason`` ("first start" or "history lost"), ``copied`` (documents already copied:
#: above 0 when a copy resumes after a restart), ``estimated`` (the collection's
#: estimated count), ``resumed`` (bool): an initial sync starts or resumes copying.
initial_sync_started = Signal()
#: ``documents`` (documents in this batch), ``copied`` (documents copied in all, as the
#: progress record counts them: restarts included), ``batch`` (the progress record's
#: batch number), ``estimated`` (the collection's estimated count, or None): after each
#: copied batch's progress write (committed with the batch in a transactional stream).
initial_sync_progress = Signal()
#: ``reason``, ``copied`` (documents copied in all), ``duration`` (seconds since the copy
#: started, restarts included), ``started_at`` (datetime): the copy is done; the stream
#: now streams. After a RESYNC, a mirror may delete its rows that this copy did not
#: write (none since ``started_at``): their documents were deleted while the history was
#: lost, and no delete event is left for them.
initial_sync_finished = Signal()
#: ``role`` ("LEADER" or "STANDBY"), ``instance_id``, ``token`` (fencing token or None).
leadership_changed = Signal()

ALL_SIGNALS = {name: value for name, value in dict(globals()).items() if isinstance(value, Signal)}


def emit(signal: Signal, stream: str, **kwargs: Any) -> None:
    """Send *signal* for *stream*; receivers' errors are logged, never raised."""
    if not signal.has_listeners(stream):
        return
    for receiver, result in signal.send_robust(sender=stream, **kwargs):
        if isinstance(result, Exception):
            logger.warning(
                "metrics receiver %r failed for stream %r",
                receiver,
                stream,
                exc_info=(type(result), result, result.__traceback__),
            )
