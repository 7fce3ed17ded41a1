"""What a declared stream is: ``StreamSpec`` and its policies, with their defaults.

Both ways of declaring a stream (the ``@change_stream`` class decorator and the
programmatic ``register_stream``) build a ``StreamSpec``; ``validation.py`` checks
both the same way.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: Operation types a typed handler can be declared for.
TYPED_OPERATIONS = ("insert", "update", "delete", "replace")
#: Operation types that never carry a full document.
NO_DOCUMENT_OPERATIONS = ("delete", "drop", "dropDatabase", "rename", "invalidate")
#: Lifecycle events: dispatched to ``on_change`` but never a resume position.
LIFECYCLE_OPERATIONS = ("drop", "dropDatabase", "rename", "invalidate")

FULL_DOCUMENT_MODES = ("default", "updateLookup", "whenAvailable", "required")
FULL_DOCUMENT_BEFORE_CHANGE_MODES = ("off", "whenAvailable", "required")
DEPLOYMENT_MODES = ("ALL_INSTANCES", "SINGLE_LEADER")
START_POSITIONS = ("RESUME", "LATEST")
HISTORY_LOST_STRATEGIES = ("FAIL", "RESUME_FROM_NOW", "RESUME_FROM_OPLOG_START")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m)\s*$")


def parse_duration(value: str | float | int) -> float:
    """Seconds from ``"500ms"``, ``"30s"``, ``"2m"`` or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"invalid duration {value!r}: use a number with ms, s or m, like '500ms'")
    number, unit = float(match.group(1)), match.group(2)
    return number / 1000 if unit == "ms" else number * 60 if unit == "m" else number


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
    position (0 = off). ``start_position``: ``RESUME`` the saved anchors or start at
    ``LATEST``. ``on_history_lost``: ``FAIL``, ``RESUME_FROM_NOW`` or
    ``RESUME_FROM_OPLOG_START``.
    """

    save_every_n: int = 1
    save_interval_seconds: float = 5
    idle_heartbeat_interval_seconds: float = 300
    start_position: str = "RESUME"
    on_history_lost: str = "FAIL"


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
        initial = parse_duration(self.initial_delay)
        return min(initial * self.multiplier ** (attempt - 1), parse_duration(self.max_delay))


Handler = Callable[..., Any]


@dataclasses.dataclass
class StreamSpec:
    """A declared change stream: where to read, how to checkpoint, what to call.

    ``handlers`` maps ``insert``/``update``/``delete``/``replace`` to callables
    taking ``(ctx)``, ``(doc)`` or ``(doc, ctx)`` (``def`` or ``async def``);
    ``on_change`` catches every other operation except ``invalidate``.
    ``transactional`` runs each handler and its processed-anchor write in one
    transaction on ``transaction_using`` (needs the ORM checkpoint store there).
    """

    name: str
    collection: str
    database: str | None = None
    client: str = "default"
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
    #: Where it was declared, for messages ("myapp.streams.OrdersStream").
    origin: str = ""

    def handler_for(self, operation: str) -> Handler | None:
        """The typed handler of *operation*, else ``on_change`` (never for invalidate)."""
        if operation == "invalidate":
            return None
        return self.handlers.get(operation) or self.on_change
