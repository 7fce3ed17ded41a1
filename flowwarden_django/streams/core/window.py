"""The window of a stream handled in parallel: per-key order and the low watermark.

A stream declared with ``parallelism=N`` hands its events to up to N handler calls at
once. ``KeyedWindow`` decides, with no I/O and no lock (its drivers serialize their
calls), which event may run and how far the processed anchor may go:

* events of one key (``key=``, by default the document key) run strictly in stream
  order: an event waits while an earlier event of its key is unsettled;
* events of different keys run concurrently, in stream order as slots free up;
* the **watermark** is the last event of the contiguous prefix of settled events:
  the processed anchor never passes an unsettled event, so a crash re-delivers what
  was in the window (and what the anchor policy had not written yet), never less;
* the window holds at most ``capacity`` events between the watermark and the
  reader: when it is full the reader stops fetching (backpressure, bounded memory).

As in Confluent's Parallel Consumer, a slow or failing event holds its key and the
watermark, not the other keys.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import Any

#: The most events a window holds per handler slot, by default.
WINDOW_PER_SLOT = 4


def default_capacity(parallelism: int) -> int:
    """The window of a stream that does not set one: 4 events per handler slot."""
    return max(1, parallelism) * WINDOW_PER_SLOT


class EventKeyError(RuntimeError):
    """The stream's ``key`` function raised: the event cannot be ordered, so the
    stream restarts and the event is redelivered (like a failing filter)."""


def hashable(value: Any) -> Hashable:
    """*value* as a dictionary key: mappings and sequences become tuples, recursively
    (a ``documentKey`` is a dict; sharded collections give it several fields)."""
    if type(value) is dict:
        items = tuple(value.items())
        try:
            hash(items)  # the common case: {"_id": <a scalar or an ObjectId>}
        except TypeError:
            return tuple((name, hashable(item)) for name, item in items)
        return items
    if isinstance(value, Mapping):
        return tuple((name, hashable(item)) for name, item in value.items())
    if isinstance(value, list | tuple):
        return tuple(hashable(item) for item in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def event_key(key: Callable[[Mapping[str, Any]], Any] | None, event: Mapping[str, Any]) -> Hashable:
    """The ordering key of *event*: ``key(event)`` when the stream declares one, else
    the event's ``documentKey`` (events without one share a single key)."""
    if key is None:
        return hashable(event.get("documentKey"))
    try:
        return hashable(key(event))
    except Exception as exc:
        raise EventKeyError(f"the stream's key function raised {exc!r}") from exc


#: The most parked keys a window reports (operators see the first ones).
REPORTED_PARKED_KEYS = 20


@dataclasses.dataclass(frozen=True)
class WindowStats:
    """What operators see of a window: events admitted and not settled, events
    settled but held behind an unsettled one (the watermark's lag), and the keys
    parked behind a failing event (as text, at most ``REPORTED_PARKED_KEYS``)."""

    in_flight: int = 0
    watermark_lag: int = 0
    parked_keys: tuple[str, ...] = ()


@dataclasses.dataclass(slots=True, eq=False, repr=False)
class WindowEntry:
    """One event in the window: where it is in the stream (``seq``), its key, and
    whether it waits, runs or has settled."""

    WAITING = "waiting"
    READY = "ready"
    RUNNING = "running"
    SETTLED = "settled"

    seq: int
    key: Hashable
    event: Mapping[str, Any]
    operation: str
    event_id: str | None
    state: str = dataclasses.field(default=WAITING, init=False)
    #: ``time.perf_counter()`` when its handling began (the drivers set it).
    began: float = dataclasses.field(default=0.0, init=False)
    #: Whether an attempt has failed (its key is parked behind it while it retries).
    failing: bool = dataclasses.field(default=False, init=False)

    def __repr__(self) -> str:
        return f"<WindowEntry #{self.seq} key={self.key!r} {self.state}>"


class KeyedWindow:
    """What is in flight for one stream generation (see the module docstring).

    ``admit`` takes the reader's next event; ``take`` gives a free handler slot the
    next event it may run; ``settle`` records an event's end and returns the events
    the watermark passed, in stream order, for the anchor policy. ``close`` stops
    handing out events (a stop or a failure): what has not started stays unsettled.
    """

    def __init__(self, parallelism: int, capacity: int | None = None) -> None:
        self.parallelism = max(1, parallelism)
        self.capacity = max(self.parallelism, capacity or default_capacity(parallelism))
        self._order: deque[WindowEntry] = deque()
        self._ready: deque[WindowEntry] = deque()
        #: Per key, its unsettled events in stream order (the first one runs).
        self._keys: dict[Hashable, deque[WindowEntry]] = {}
        self._next_seq = 0
        self.running = 0
        self.closed = False
        #: Events settled in this window, and the last one the watermark passed.
        self.settled_count = 0
        self.watermark: WindowEntry | None = None

    # -- what operators and the reader ask --------------------------------------------

    @property
    def held(self) -> int:
        """Events between the watermark and the reader (waiting, running or settled
        behind an unsettled one)."""
        return len(self._order)

    @property
    def full(self) -> bool:
        """Whether the reader must wait before fetching another event."""
        return len(self._order) >= self.capacity

    @property
    def empty(self) -> bool:
        """Whether every admitted event is settled and passed by the watermark."""
        return not self._order

    @property
    def ready(self) -> int:
        """Events that may run now, waiting for a free slot."""
        return len(self._ready)

    @property
    def in_flight(self) -> int:
        """Events admitted and not yet settled."""
        return sum(1 for entry in self._order if entry.state != WindowEntry.SETTLED)

    @property
    def settled_beyond_watermark(self) -> int:
        """Events settled but held behind an unsettled one (the watermark's lag)."""
        return sum(1 for entry in self._order if entry.state == WindowEntry.SETTLED)

    def parked_keys(self) -> list[Hashable]:
        """Keys whose first unsettled event has failed and is being retried."""
        return [queue[0].key for queue in self._keys.values() if queue and queue[0].failing]

    def stats(self) -> WindowStats:
        """The operators' view (``WindowStats``), read without a lock: the figures
        may be a moment apart, never wrong for long."""
        try:
            parked = self.parked_keys()
            order = list(self._order)
        except RuntimeError:  # changed while read (another thread): the next read
            return WindowStats()
        settled = sum(1 for entry in order if entry.state == WindowEntry.SETTLED)
        return WindowStats(
            in_flight=len(order) - settled,
            watermark_lag=settled,
            parked_keys=tuple(str(key) for key in parked[:REPORTED_PARKED_KEYS]),
        )

    # -- the reader, the slots and the settlements ------------------------------------

    def admit(
        self, key: Hashable, event: Mapping[str, Any], operation: str, event_id: Any
    ) -> WindowEntry:
        """Add the reader's next event; it is ready at once unless an earlier event
        of its key is unsettled."""
        self._next_seq += 1
        entry = WindowEntry(self._next_seq, key, event, operation, event_id)
        self._order.append(entry)
        queue = self._keys.get(key)
        if queue is None:
            self._keys[key] = deque((entry,))
            self._make_ready(entry)
        else:
            queue.append(entry)
        return entry

    def admit_running(
        self,
        key: Hashable,
        event: Mapping[str, Any],
        operation: str,
        event_id: Any,
        began: float = 0.0,
    ) -> WindowEntry:
        """Add an event the reader began at *began* while the window was empty (see the
        drivers' ``_alone``) straight into a slot, as ``admit`` and ``take`` would have."""
        entry = self.admit(key, event, operation, event_id)
        taken = self.take()
        assert taken is entry, "admit_running needs an empty, open window"
        entry.began = began
        return entry

    def _make_ready(self, entry: WindowEntry) -> None:
        entry.state = WindowEntry.READY
        self._ready.append(entry)

    def take(self) -> WindowEntry | None:
        """The next ready event for a free slot (marked running), or ``None``: nothing
        ready, every slot busy, or the window closed."""
        if self.closed or not self._ready or self.running >= self.parallelism:
            return None
        entry = self._ready.popleft()
        entry.state = WindowEntry.RUNNING
        self.running += 1
        return entry

    def release(self, entry: WindowEntry) -> None:
        """*entry* ended unsettled (a stop cut its retries short, or it raised): its
        slot is free, the watermark stays before it, and the window closes."""
        self.running -= 1
        self.closed = True

    def settle(self, entry: WindowEntry) -> list[WindowEntry]:
        """*entry* is settled (handled, skipped or parked in the DLQ): free its slot,
        make its key's next event ready, and return the events the watermark passed."""
        entry.state = WindowEntry.SETTLED
        entry.failing = False
        self.running -= 1
        self.settled_count += 1
        queue = self._keys[entry.key]
        queue.popleft()
        if queue:
            self._make_ready(queue[0])
        else:
            del self._keys[entry.key]
        passed: list[WindowEntry] = []
        order = self._order
        while order and order[0].state == WindowEntry.SETTLED:
            passed.append(order.popleft())
        if passed:
            self.watermark = passed[-1]
        return passed

    def close(self) -> None:
        """Hand out nothing more (a stop, a failure, a lifecycle event's barrier)."""
        self.closed = True

    @property
    def idle(self) -> bool:
        """Whether no event runs (after ``close``: whether the drain is done)."""
        return self.running == 0
