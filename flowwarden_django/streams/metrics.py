"""Stream metric events as Django signals (the reference's ``StreamMetricsProvider``).

Connect a receiver to any of these to observe streams; the Prometheus exporter
(``flowwarden_django.integrations.prometheus``) is one such receiver. Every signal is sent
with ``sender=`` the stream name (``oplog_stats``: the client alias) and keyword
arguments listed below. Emission follows the reference's rules: ``checkpoint_saved``
and ``event_sent_to_dlq`` only after the write succeeded, failures on their own
signals, and ``dlq_backlog`` never with a made-up count.

Receivers run on the stream's thread: they must be quick. A receiver that raises
is logged and never disturbs the stream.

``event_received`` and ``event_processed`` go out for every event, so the signals
cache their receivers per sender (:class:`StreamSignal`), the runtime asks who
listens before it builds their arguments (:func:`listeners`, then :func:`send`), and
a receiver of ``event_received`` that reads only some arguments can say so
(:func:`reads`): the event id and the wall time are then not made for it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Sequence
from typing import Any

from django.dispatch import Signal
from django.dispatch.dispatcher import NO_RECEIVERS

logger = logging.getLogger("flowwarden_django.streams.metrics")


#: The arguments of ``event_received`` that cost something to make for each event.
COSTLY_ARGUMENTS = frozenset({"event_id", "wall_time"})


#: Bumped whenever a stream signal's receiver cache is cleared (a receiver connected or
#: disconnected): an :class:`~.announcer.EventAnnouncer` looks its receivers up again.
receivers_version = [0]


def fast_path(make: Any) -> Any:
    """Give a per-event receiver a quicker way in (a decorator).

    ``make(owner, stream)`` (``owner``: the bound method's instance, else ``None``)
    returns a callable the runtime calls for each event of *stream* instead of the
    receiver: with ``(cluster_time)`` for ``event_received``, with ``(success,
    duration)`` for ``event_processed``. For a receiver that only counts (the
    Prometheus receivers), this skips the signal's keyword arguments and dispatch,
    which cost more than the counting. Other signals ignore it.
    """

    def declare(receiver: Any) -> Any:
        receiver.flowwarden_fast_path = make
        return receiver

    return declare


def reads(*arguments: str) -> Any:
    """Declare the keyword arguments a receiver reads (a decorator).

    When every receiver of ``event_received`` from a stream declares arguments and
    none of them is in :data:`COSTLY_ARGUMENTS`, the runtime does not make those
    (a fresh event id, the aware wall time) and sends them as ``None``. A receiver
    without the declaration always gets every argument.
    """

    def declare(receiver: Any) -> Any:
        receiver.flowwarden_reads = frozenset(arguments)
        return receiver

    return declare


class Receivers(tuple):  # type: ignore[type-arg]
    """The receivers :func:`listeners` found, callable as they are.

    ``lean``: every one declared (:func:`reads`) that it reads none of the
    :data:`COSTLY_ARGUMENTS`.
    """

    lean = False


_NOBODY = Receivers()


class _SenderCache(dict):  # type: ignore[type-arg]
    """Django's per-sender receiver cache, keyed by the sender's identity.

    ``Signal(use_caching=True)`` keeps it in a ``WeakKeyDictionary``, which cannot
    hold a ``str`` sender (a stream name). This one holds the sender itself beside
    its entry and answers only for that same object, so a sender matches exactly the
    receivers Django's uncached lookup (by ``id(sender)``) would find. Django fills it
    under the signal's lock and clears it on every ``connect``/``disconnect``.
    """

    #: Distinct senders remembered before the cache starts over (stream names and
    #: client aliases: a handful).
    limit = 256

    def clear(self) -> None:
        receivers_version[0] += 1
        dict.clear(self)

    def get(self, sender: Any, default: Any = None) -> Any:
        entry = dict.get(self, id(sender))
        if entry is None or entry[0] is not sender:
            return default
        return entry[1]

    def __setitem__(self, sender: Any, receivers: Any) -> None:
        if len(self) >= self.limit:
            self.clear()
        dict.__setitem__(self, id(sender), (sender, receivers, _direct(receivers)))

    def direct(self, sender: Any) -> Receivers | None:
        """The receivers of *sender* when they can be called as they are (none, or all
        strongly connected and synchronous), else None (ask ``_live_receivers``)."""
        entry = dict.get(self, id(sender))
        if entry is None or entry[0] is not sender:
            return None
        return entry[2]


def _direct(receivers: Any) -> Receivers | None:
    """Django's cached receivers of one sender as callables, when that is all they
    are: no weak reference to resolve, no coroutine function."""
    if receivers is NO_RECEIVERS:
        return _NOBODY
    try:
        # Django 5.2 caches (receiver, is_async) pairs; 6.x (receiver, sender_ref,
        # is_async) triples, where a sender_ref is a weak reference to resolve.
        entries = [(entry[0], entry[1:-1], entry[-1]) for entry in receivers]
    except (TypeError, IndexError, KeyError):
        return None
    if any(
        isinstance(receiver, weakref.ReferenceType)
        or is_async
        or any(ref is not None for ref in refs)
        for receiver, refs, is_async in entries
    ):
        return None
    pairs = [(receiver, is_async) for receiver, _refs, is_async in entries]
    direct = Receivers(receiver for receiver, _ in pairs)
    direct.lean = bool(direct) and all(reads_nothing_costly(receiver) for receiver in direct)
    return direct


def reads_nothing_costly(receiver: Any) -> bool:
    """Whether *receiver* declared (:func:`reads`) that it reads none of the
    :data:`COSTLY_ARGUMENTS`."""
    declared = getattr(receiver, "flowwarden_reads", None)
    return isinstance(declared, frozenset) and not declared & COSTLY_ARGUMENTS


class StreamSignal(Signal):
    """A ``Signal`` that caches its receivers per sender.

    Sent once or twice per event: without the cache each send (and each
    ``has_listeners``) walks every receiver under the signal's lock. Weak receivers
    stay weak (the cache holds Django's weak references) and connecting or
    disconnecting a receiver takes effect at the next send, as for any signal.
    """

    def __init__(self) -> None:
        super().__init__(use_caching=True)
        self.sender_receivers_cache = _SenderCache()


#: ``config`` (dict): after each successful start or managed restart.
stream_started = StreamSignal()
#: ``reason`` ("GRACEFUL" or "CRASHED"), ``cause`` (exception or None).
stream_stopped = StreamSignal()
#: ``attempt`` (int), ``cause`` (the exception that ended the previous generation).
stream_restarted = StreamSignal()
#: ``cause`` ("drop", "dropDatabase" or "rename").
stream_invalidated = StreamSignal()
#: ``event_id``, ``operation_type``, ``collection``, ``document_key``, ``cluster_time``,
#: ``wall_time``: before dispatch.
event_received = StreamSignal()
#: ``duration`` (seconds, float), ``success`` (bool): after the attempt loop.
event_processed = StreamSignal()
#: ``error`` (exception), ``will_retry`` (bool), ``attempt`` (int), ``event_id``.
event_error = StreamSignal()
#: ``anchor`` ("processed", "seen", "heartbeat", "reset", "record" for a whole-record save,
#: or "initial_sync"), ``token`` (the resume token, else None): after a successful write.
checkpoint_saved = StreamSignal()
#: ``anchor``, ``error``: any failed checkpoint write.
checkpoint_failed = StreamSignal()
#: The processed anchor aged out of the oplog; resumed from the seen anchor.
resume_fallback_to_seen = StreamSignal()
#: Both anchors aged out; the history-lost strategy applies.
resume_history_lost = StreamSignal()
#: ``error``: an idle heartbeat write failed.
heartbeat_failed = StreamSignal()
#: ``entry_id``: after a successful dead-letter write.
event_sent_to_dlq = StreamSignal()
#: ``error``: a dead-letter write failed (the event is settled anyway).
event_dlq_failed = StreamSignal()
#: ``pending`` (int): the stream's DLQ backlog, when the store can count.
dlq_backlog = StreamSignal()
#: ``hours`` (float or None), ``status`` ("OK", "UNAVAILABLE" or "ERROR").
oplog_stats = StreamSignal()
#: ``reason`` ("first start" or "history lost"), ``copied`` (documents already copied:
#: above 0 when a copy resumes after a restart), ``estimated`` (the collection's
#: estimated count), ``resumed`` (bool): an initial sync starts or resumes copying.
initial_sync_started = StreamSignal()
#: ``documents`` (documents in this batch), ``copied`` (documents copied in all, as the
#: progress record counts them: restarts included), ``batch`` (the progress record's
#: batch number), ``estimated`` (the collection's estimated count, or None): after each
#: copied batch's progress write (committed with the batch in a transactional stream).
initial_sync_progress = StreamSignal()
#: ``reason``, ``copied`` (documents copied in all), ``duration`` (seconds since the copy
#: started, restarts included), ``started_at`` (datetime): the copy is done; the stream
#: now streams. After a RESYNC, a mirror may delete its rows that this copy did not
#: write (none since ``started_at``): their documents were deleted while the history was
#: lost, and no delete event is left for them.
initial_sync_finished = StreamSignal()
#: ``role`` ("LEADER" or "STANDBY"), ``instance_id``, ``token`` (fencing token or None).
leadership_changed = StreamSignal()

ALL_SIGNALS = {name: value for name, value in dict(globals()).items() if isinstance(value, Signal)}


#: What :func:`listeners` answers when an ``async`` receiver listens: :func:`send` then
#: goes through ``send_robust``, which runs it.
_ASYNC = ("async",)


def listeners(signal: Signal, stream: str) -> Sequence[Any]:
    """Who receives *signal* from *stream* now, for :func:`send`; empty (falsy) when
    nobody does. Ask first, then build the arguments of a per-event signal only when
    someone listens, and pass the answer on to :func:`send`."""
    if not signal.receivers:
        return _NOBODY
    cache = signal.sender_receivers_cache
    if not isinstance(cache, _SenderCache):
        sync_receivers, async_receivers = signal._live_receivers(stream)
        return _ASYNC if async_receivers else sync_receivers
    if not signal._dead_receivers:
        direct = cache.direct(stream)
        if direct is not None:
            return direct
    # Not cached yet (or a weak receiver died): Django's lookup fills the cache.
    sync_receivers, async_receivers = signal._live_receivers(stream)
    direct = cache.direct(stream)
    if direct is not None:
        return direct
    return _ASYNC if async_receivers else sync_receivers


def send(signal: Signal, stream: str, receivers: Sequence[Any], **kwargs: Any) -> None:
    """Send *signal* for *stream* to the *receivers* :func:`listeners` found; receivers'
    errors are logged, never raised (as ``send_robust`` does, without asking again).

    With an ``async`` receiver, on an event loop's thread (the asyncio runtime), the
    signal goes out as a task of that loop (``asend_robust``): ``send_robust`` would
    need ``async_to_sync``, which cannot run there. :func:`drain` waits for them.
    """
    if receivers is _ASYNC:
        if _send_on_running_loop(signal, stream, kwargs):
            return
        _log_failures(signal, stream, signal.send_robust(sender=stream, **kwargs))
        return
    for receiver in receivers:
        try:
            receiver(signal=signal, sender=stream, **kwargs)
        except Exception as exc:
            _failed(signal, receiver, stream, exc)


def _log_failures(signal: Signal, stream: str, results: list[tuple[Any, Any]]) -> None:
    for receiver, result in results:
        if isinstance(result, Exception):
            _failed(signal, receiver, stream, result, robust_logged=True)


#: Signals sent as tasks of a running loop, until they are done (see :func:`drain`).
_sending: set[asyncio.Task[None]] = set()


def _send_on_running_loop(signal: Signal, stream: str, kwargs: dict[str, Any]) -> bool:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False

    async def send_async() -> None:
        _log_failures(signal, stream, await signal.asend_robust(sender=stream, **kwargs))

    task = loop.create_task(send_async())
    _sending.add(task)
    task.add_done_callback(_sending.discard)
    return True


async def drain() -> None:
    """Wait until the signals sent as tasks of the running loop have been delivered."""
    loop = asyncio.get_running_loop()
    while pending := [task for task in _sending if task.get_loop() is loop]:
        await asyncio.gather(*pending, return_exceptions=True)


def _send_async(signal: Signal, sender: str, **kwargs: Any) -> None:
    """A receiver that stands for the ``async`` ones: :func:`send` them the signal."""
    send(signal, sender, _ASYNC, **kwargs)


#: What the spelt-out senders below call in place of the receivers when an ``async``
#: one listens (:func:`send` never raises).
_ASYNC_SENDERS = (_send_async,)


def send_event_received(
    stream: str,
    receivers: Sequence[Any],
    event_id: str | None,
    operation_type: str,
    collection: str | None,
    document_key: Any,
    cluster_time: Any,
    wall_time: Any,
) -> None:
    """:func:`send` of ``event_received`` with its arguments spelt out: it goes out per
    event, and packing them into a dict (twice) cost more than most receivers do."""
    if receivers is _ASYNC:
        receivers = _ASYNC_SENDERS
    for receiver in receivers:
        try:
            receiver(
                signal=event_received,
                sender=stream,
                event_id=event_id,
                operation_type=operation_type,
                collection=collection,
                document_key=document_key,
                cluster_time=cluster_time,
                wall_time=wall_time,
            )
        except Exception as exc:
            _failed(event_received, receiver, stream, exc)


def send_event_processed(
    stream: str, receivers: Sequence[Any], duration: float, success: bool | None
) -> None:
    """:func:`send` of ``event_processed``, spelt out (see :func:`send_event_received`)."""
    if receivers is _ASYNC:
        receivers = _ASYNC_SENDERS
    for receiver in receivers:
        try:
            receiver(signal=event_processed, sender=stream, duration=duration, success=success)
        except Exception as exc:
            _failed(event_processed, receiver, stream, exc)


def emit(signal: Signal, stream: str, **kwargs: Any) -> None:
    """Send *signal* for *stream*; receivers' errors are logged, never raised."""
    receivers = listeners(signal, stream)
    if receivers:
        send(signal, stream, receivers, **kwargs)


def _failed(
    signal: Signal, receiver: Any, stream: str, exc: Exception, *, robust_logged: bool = False
) -> None:
    if not robust_logged:
        # The record send_robust() would have written on the "django.dispatch" logger.
        log_robust_failure = getattr(signal, "_log_robust_failure", None)
        if log_robust_failure is not None:
            log_robust_failure(receiver, exc)
    logger.warning(
        "metrics receiver %r failed for stream %r",
        receiver,
        stream,
        exc_info=(type(exc), exc, exc.__traceback__),
    )
