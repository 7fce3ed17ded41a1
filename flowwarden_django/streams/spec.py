"""What a declared stream is: ``StreamSpec`` and its policies, with their defaults.

Both ways of declaring a stream (the ``@change_stream`` class decorator and the
programmatic ``register_stream``) build a ``StreamSpec``; ``validation.py`` checks
both the same way.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..common.durations import parse_duration

#: Operation types a typed handler can be declared for.
TYPED_OPERATIONS = ("insert", "update", "delete", "replace")
#: Operation types that never carry a full document.
NO_DOCUMENT_OPERATIONS = ("delete", "drop", "dropDatabase", "rename", "invalidate")
#: Lifecycle events: dispatched to ``on_change`` but never a resume position.
LIFECYCLE_OPERATIONS = ("drop", "dropDatabase", "rename", "invalidate")
#: The operation type of a document read by an initial sync (not a change event).
SNAPSHOT_OPERATION = "snapshot"
#: Every operation a typed ``on_<operation>`` handler can be declared for.
HANDLER_OPERATIONS = (*TYPED_OPERATIONS, SNAPSHOT_OPERATION)

FULL_DOCUMENT_MODES = ("default", "updateLookup", "whenAvailable", "required")
FULL_DOCUMENT_BEFORE_CHANGE_MODES = ("off", "whenAvailable", "required")
DEPLOYMENT_MODES = ("ALL_INSTANCES", "SINGLE_LEADER")
START_POSITIONS = ("RESUME", "LATEST", "COPY_EXISTING")
HISTORY_LOST_STRATEGIES = ("FAIL", "RESUME_FROM_NOW", "RESUME_FROM_OPLOG_START", "RESYNC")


def backoff_delay(
    initial: str | float, multiplier: float, maximum: str | float, attempt: int
) -> float:
    """``min(initial * multiplier ** (attempt - 1), maximum)`` in seconds (durations as
    ``parse_duration`` reads them)."""
    return min(parse_duration(initial) * multiplier ** (attempt - 1), parse_duration(maximum))


def kebab_case(name: str) -> str:
    """``OrderEvents`` → ``order-events``: the default stream name of a class."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


@dataclasses.dataclass(frozen=True)
class CheckpointSpec:
    """How a stream keeps its checkpoint (the ``@checkpoint`` decorator's arguments).

    ``save_every_n``: persist the processed anchor every N settled events (a crash
    replays up to N-1 settled events, plus the one in flight).
    ``save_interval_seconds``: the longest a settled but unsaved anchor waits (0 = off).
    ``idle_heartbeat_interval_seconds``: how often an idle stream certifies its
    position (0 = off). ``start_position``: ``RESUME`` the saved anchors, start at
    ``LATEST``, or ``COPY_EXISTING``: on the first start, copy the collection's
    documents to the snapshot handler, then stream from the position captured before
    the copy (see ``initial_sync``). ``on_history_lost``: ``FAIL``,
    ``RESUME_FROM_NOW``, ``RESUME_FROM_OPLOG_START`` or ``RESYNC`` (copy the
    collection again, then stream). ``copy_batch_size``: documents per copied batch
    (one progress write each).
    """

    save_every_n: int = 1
    save_interval_seconds: float = 5
    idle_heartbeat_interval_seconds: float = 300
    start_position: str = "RESUME"
    on_history_lost: str = "FAIL"
    copy_batch_size: int = 1000

    @property
    def copies(self) -> bool:
        """Whether the stream may copy the collection (``COPY_EXISTING`` or ``RESYNC``)."""
        return self.start_position == "COPY_EXISTING" or self.on_history_lost == "RESYNC"


@dataclasses.dataclass(frozen=True)
class RestartPolicySpec:
    """Backoff of the managed restart after a cursor dies (``@restart_policy``).

    ``max_attempts`` 0 means unlimited. Delays accept ``"500ms"``, ``"1s"``, ``"2m"``.
    """

    max_attempts: int = 0
    initial_delay: str | float = "1s"
    max_delay: str | float = "60s"
    multiplier: float = 2.0
    jitter: bool = False

    def delay(self, attempt: int) -> float:
        """Seconds to wait before restart *attempt* (1-based), before jitter."""
        return backoff_delay(self.initial_delay, self.multiplier, self.max_delay, attempt)


class ErrorAction(enum.StrEnum):
    """What an ``on_error`` handler decides for a failed event.

    ``SKIP``: settle it, no retry, no DLQ. ``RETRY``: retry while attempts remain
    (ignoring ``retry_on``/``no_retry_on``), then the DLQ. ``DLQ``: to the DLQ now.
    ``RETHROW``: the standard policy (retry if the retry policy allows, then DLQ).
    """

    SKIP = "SKIP"
    RETRY = "RETRY"
    DLQ = "DLQ"
    RETHROW = "RETHROW"


#: Exceptions never retried by default: bugs or bad data, not transient failures.
DEFAULT_NO_RETRY_ON: tuple[type[BaseException], ...] = (ValueError, TypeError, AttributeError)


@dataclasses.dataclass(frozen=True)
class RetryPolicySpec:
    """How a failed handler is retried (``@retry_policy``), on the stream's own thread.

    ``max_attempts`` counts the first attempt. The delay before retry *n* is
    ``min(initial_delay * multiplier ** (n - 1), max_delay)``, then ±20% with
    ``jitter``. ``no_retry_on`` wins over ``retry_on``; an empty ``retry_on``
    retries every other exception.
    """

    max_attempts: int = 3
    initial_delay: str | float = "500ms"
    max_delay: str | float = "30s"
    multiplier: float = 2.0
    retry_on: tuple[type[BaseException], ...] = ()
    no_retry_on: tuple[type[BaseException], ...] = DEFAULT_NO_RETRY_ON
    jitter: bool = True

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """Whether failed attempt *attempt* (1-based) with *error* gets another try."""
        if attempt >= self.max_attempts or isinstance(error, tuple(self.no_retry_on)):
            return False
        return not self.retry_on or isinstance(error, tuple(self.retry_on))

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt *attempt* (1-based), before jitter."""
        return backoff_delay(self.initial_delay, self.multiplier, self.max_delay, attempt)


#: A stream without ``@retry_policy`` tries each event once.
NO_RETRY = RetryPolicySpec(max_attempts=1, jitter=False)


@dataclasses.dataclass(frozen=True)
class DeadLetterQueueSpec:
    """Where and how failed events are parked (``@dead_letter_queue``).

    ``store`` is a ``FLOWWARDEN["DLQ_STORES"]`` alias. ``retention_days`` 0 keeps
    entries forever.
    """

    enabled: bool = True
    retention_days: int = 30
    include_original_document: bool = True
    include_stack_trace: bool = True
    store: str = "default"


Handler = Callable[..., Any]


@dataclasses.dataclass
class StreamSpec:
    """A declared change stream: where to read, how to checkpoint, what to call.

    ``handlers`` maps ``insert``/``update``/``delete``/``replace`` (and ``snapshot``,
    the documents of an initial sync) to callables taking ``(ctx)``, ``(doc)`` or
    ``(doc, ctx)`` (``def`` or ``async def``); ``on_change`` catches every other
    operation except ``invalidate``.
    ``transactional`` runs each handler and its processed-anchor write in one
    transaction on ``transaction_using`` (needs the ORM checkpoint store there).
    ``parallelism`` > 1 handles up to that many events at once, in stream order per
    ``key`` (a function of the change event; by default its ``documentKey``), with at
    most ``window`` events (default 4 per slot) between the checkpoint and the reader
    (``core.window``).
    """

    name: str
    collection: str
    database: str | None = None
    client: str = "default"
    lock_service: str = "default"
    full_document: str = "default"
    full_document_before_change: str = "off"
    deployment_mode: str = "ALL_INSTANCES"
    enabled: bool = True
    auto_start: bool = True
    transactional: bool = False
    transaction_using: str = "default"
    checkpoint_store: str = "default"
    description: str = ""
    handlers: Mapping[str, Handler] = dataclasses.field(default_factory=dict)
    on_change: Handler | None = None
    pipeline: Callable[[], Sequence[Mapping[str, Any]]] | None = None
    filter: Callable[[Any], bool] | None = None
    on_error: Sequence[tuple[tuple[type[BaseException], ...], Handler]] = ()
    checkpoint: CheckpointSpec = dataclasses.field(default_factory=CheckpointSpec)
    restart_policy: RestartPolicySpec = dataclasses.field(default_factory=RestartPolicySpec)
    #: ``None``: each event is tried once. ``dead_letter_queue`` ``None``: no DLQ.
    retry_policy: RetryPolicySpec | None = None
    dead_letter_queue: DeadLetterQueueSpec | None = None
    #: Where it was declared, for messages ("myapp.streams.OrdersStream").
    origin: str = ""
    parallelism: int = 1
    key: Callable[[Mapping[str, Any]], Any] | None = None
    window: int | None = None
    #: ``"inline"``: handlers run in the consumer's process; ``"celery"``: each event
    #: is a Celery task (``remote_events``), the window stays here.
    execution: str = "inline"

    @property
    def windowed(self) -> bool:
        """Whether events go through a window (``core.window``): handled in parallel,
        or each sent to another process (``execution``)."""
        return self.parallelism > 1 or self.execution != "inline"

    def error_handler_for(self, error: BaseException) -> Handler | None:
        """The ``on_error`` handler for *error*: exact type, then the nearest parent
        type (in the exception's MRO), then the catch-all."""
        by_type: dict[type[BaseException], Handler] = {}
        catch_all: Handler | None = None
        for types, handler in self.on_error:
            if not types:
                catch_all = handler
            for kind in types:
                by_type[kind] = handler
        for kind in type(error).__mro__:
            if kind in by_type:
                return by_type[kind]
        return catch_all

    def handler_for(self, operation: str) -> Handler | None:
        """The typed handler of *operation*, else ``on_change`` (never for invalidate).

        A ``snapshot`` (a copied document) goes to ``on_snapshot``, else ``on_insert``,
        else ``on_change``.
        """
        if operation == "invalidate":
            return None
        if operation == SNAPSHOT_OPERATION:
            return self.snapshot_handler()
        return self.handlers.get(operation) or self.on_change

    def snapshot_handler(self) -> Handler | None:
        """Who receives a copied document: ``on_snapshot``, ``on_insert``, ``on_change``."""
        return (
            self.handlers.get(SNAPSHOT_OPERATION) or self.handlers.get("insert") or self.on_change
        )
