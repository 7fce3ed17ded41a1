"""The per-event signals of one stream, sent as cheaply as their receivers allow.

``event_received`` and ``event_processed`` go out for every event. An
:class:`EventAnnouncer` looks their receivers up once, and again only after a
receiver was connected or disconnected (``metrics.receivers_version``). A receiver
with a fast path (``metrics.fast_path``: the Prometheus counters) is called through
it with positional arguments; the others get the signal as always, with the event id
and wall time made only for receivers that read them (``metrics.reads``).

Receivers that cannot be looked up once (a weak receiver, an ``async`` one) are
looked up for each event, as a signal's ``send`` would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from . import metrics
from .context import aware_datetime, new_event_id

__all__ = ["EventAnnouncer", "announcer_for"]

_NONE: tuple[Any, ...] = ()


class EventAnnouncer:
    """Sends ``event_received`` and ``event_processed`` for one stream, from any thread."""

    __slots__ = (
        "_dynamic",
        "_processed",
        "_processed_fast",
        "_processed_solo",
        "_received",
        "_received_fast",
        "_received_solo",
        "_version",
        "name",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self._version = -1
        #: Whether the receivers are looked up for each event (weak or async ones).
        self._dynamic = False
        self._received: Any = _NONE
        self._received_fast: tuple[Callable[[Any], None], ...] = _NONE
        self._processed: Any = _NONE
        self._processed_fast: tuple[Callable[[Any, float], None], ...] = _NONE
        # The one fast path of a signal that has no other receiver (the Prometheus
        # counters alone, say): called without the general path's checks.
        self._received_solo: Callable[[Any], None] | None = None
        self._processed_solo: Callable[[Any, float], None] | None = None

    def received(self, event: Mapping[str, Any], operation: str) -> str | None:
        """Announce *event*; the event id given to its receivers (``None`` when none
        needed one: the context makes its own when asked)."""
        if self._version != metrics.receivers_version[0]:
            self._look_up()
        solo = self._received_solo
        if solo is not None:
            solo(event.get("clusterTime"))
            return None
        if self._dynamic:
            receivers = metrics.listeners(metrics.event_received, self.name)
        else:
            for fast in self._received_fast:
                fast(event.get("clusterTime"))
            receivers = self._received
        if not receivers:
            return None
        lean = receivers.lean if type(receivers) is metrics.Receivers else False
        event_id = None if lean else new_event_id()
        metrics.send_event_received(
            self.name,
            receivers,
            event_id,
            operation,
            (event.get("ns") or {}).get("coll"),
            event.get("documentKey"),
            event.get("clusterTime"),
            None if lean else aware_datetime(event.get("wallTime")),
        )
        return event_id

    def processed(self, began: float, outcome: bool | None) -> None:
        """Announce the end of an event's handling, which began at *began*
        (``time.perf_counter()``), with *outcome*."""
        if self._version != metrics.receivers_version[0]:
            self._look_up()
        solo = self._processed_solo
        if solo is not None:
            solo(outcome, time.perf_counter() - began)
            return
        if self._dynamic:
            receivers, fast_paths = metrics.listeners(metrics.event_processed, self.name), _NONE
        else:
            receivers, fast_paths = self._processed, self._processed_fast
        if not (fast_paths or receivers):
            return
        duration = time.perf_counter() - began
        for fast in fast_paths:
            fast(outcome, duration)
        if receivers:
            metrics.send_event_processed(self.name, receivers, duration, outcome)

    def _look_up(self) -> None:
        version = metrics.receivers_version[0]
        received = metrics.listeners(metrics.event_received, self.name)
        processed = metrics.listeners(metrics.event_processed, self.name)
        # Weak or async receivers: resolved for each event by metrics.listeners().
        self._dynamic = (
            type(received) is not metrics.Receivers or type(processed) is not metrics.Receivers
        )
        self._received_solo = self._processed_solo = None
        if not self._dynamic:
            self._received_fast, self._received = self._split(received)
            self._processed_fast, self._processed = self._split(processed)
            self._received_solo = _solo(self._received_fast, self._received)
            self._processed_solo = _solo(self._processed_fast, self._processed)
        # A receiver connected meanwhile: look up again at the next event.
        self._version = version if version == metrics.receivers_version[0] else -1

    def _split(self, receivers: metrics.Receivers) -> tuple[tuple[Any, ...], Any]:
        """The fast paths of *receivers*, and the receivers without one."""
        fast: list[Any] = []
        rest: list[Any] = []
        for receiver in receivers:
            make = getattr(receiver, "flowwarden_fast_path", None)
            if make is None:
                rest.append(receiver)
            else:
                fast.append(make(getattr(receiver, "__self__", None), self.name))
        if not rest:
            return tuple(fast), metrics.Receivers()
        others = metrics.Receivers(rest)
        others.lean = all(metrics.reads_nothing_costly(receiver) for receiver in rest)
        return tuple(fast), others


def _solo(fast: tuple[Any, ...], others: metrics.Receivers) -> Any:
    """The one fast path of a signal with no other receiver, else None."""
    return fast[0] if len(fast) == 1 and not others else None


_announcers: dict[str, EventAnnouncer] = {}


def announcer_for(name: str) -> EventAnnouncer:
    """The announcer of stream *name* in this process."""
    announcer = _announcers.get(name)
    if announcer is None:
        announcer = _announcers.setdefault(name, EventAnnouncer(name))
    return announcer
