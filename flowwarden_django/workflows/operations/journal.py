"""The journal bridge: an application's own event sequence recorded as a parent-linked
snapshot chain per coordination (the reference's ``CheckpointingCoordinationJournal``).

::

    journal = CheckpointingJournal(snapshot_stores["default"], snapshot_filter=on_kinds("done"))
    journal.record(JournalEvent("order-42", "started", agent_name="intake", data={...}))

Each recorded event becomes a snapshot whose parent is the previous snapshot of its
coordination, so the journal reads as a chain. After a restart the journal
re-attaches to the coordination's NEWEST snapshot (the reference re-attaches to the
oldest, which forks every restarted chain off its root). Recording never fails the
caller: a store error is logged and the event is still passed to the delegate.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

from django.utils import timezone

from ..storage.snapshot import WorkflowSnapshot, new_snapshot_id
from ..storage.store import SnapshotStore

logger = logging.getLogger("flowwarden_django.workflows.journal")


@dataclasses.dataclass(frozen=True)
class JournalEvent:
    """One event of an application's coordination: what happened (``kind``), to
    which agent, with which data, and when."""

    coordination_id: str
    kind: str
    agent_name: str | None = None
    data: Any = None
    timestamp: datetime = dataclasses.field(default_factory=timezone.now)

    def summary(self) -> str:
        """One line for logs and snapshot states: ``kind agent``."""
        return " ".join(part for part in (self.kind.upper(), self.agent_name) if part)


class Journal(Protocol):
    """What the bridge decorates: anything with ``record(event)``."""

    def record(self, event: JournalEvent) -> Any: ...


EventFilter = Callable[[JournalEvent], bool]
StateExtractor = Callable[[JournalEvent], Any]


def on_every_event(event: JournalEvent) -> bool:
    """Record every event."""
    return True


def on_kinds(*kinds: str) -> EventFilter:
    """Record only events of these kinds (for example the agents' boundaries)."""
    wanted = frozenset(kinds)
    return lambda event: event.kind in wanted


def event_data(event: JournalEvent) -> Any:
    """The snapshot state is the event's ``data``."""
    return event.data


def event_summary(event: JournalEvent) -> str:
    """The snapshot state is the event's one-line summary."""
    return event.summary()


def whole_event(event: JournalEvent) -> Mapping[str, Any]:
    """The snapshot state is the whole event, as a dict."""
    return dataclasses.asdict(event)


@dataclasses.dataclass(eq=False, repr=False)
class CheckpointingJournal:
    """Decorates a journal (optional) and records events as snapshot chains in *store*.

    ``snapshot_filter`` decides which events become snapshots; ``extractor`` makes
    each snapshot's state from its event. ``last_snapshot(cid)`` is the id of the
    coordination's newest snapshot (from the store after a restart).
    """

    store: SnapshotStore
    _: dataclasses.KW_ONLY
    delegate: Journal | None = None
    snapshot_filter: EventFilter = on_every_event
    extractor: StateExtractor = event_data
    _heads: dict[str, str] = dataclasses.field(default_factory=dict, init=False)
    _locks: dict[str, threading.Lock] = dataclasses.field(default_factory=dict, init=False)
    _locks_guard: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False)

    def record(self, event: JournalEvent) -> WorkflowSnapshot | None:
        """Pass *event* to the delegate, then record it if the filter takes it; the
        saved snapshot, or ``None`` (filtered out, or the store failed: logged)."""
        if self.delegate is not None:
            self.delegate.record(event)
        try:
            if not self.snapshot_filter(event):
                return None
            with self._lock_of(event.coordination_id):
                parent_id = self.last_snapshot(event.coordination_id)
                snapshot = self.store.save(
                    WorkflowSnapshot(
                        id=new_snapshot_id(),
                        coordination_id=event.coordination_id,
                        parent_id=parent_id,
                        agent_name=event.agent_name,
                        state=self.extractor(event),
                        metadata={"journal.kind": event.kind},
                        created_at=event.timestamp,
                    )
                )
                self._heads[event.coordination_id] = snapshot.id
                return snapshot
        except Exception:
            logger.warning(
                "journal: recording %s of %r failed",
                event.kind,
                event.coordination_id,
                exc_info=True,
            )
            return None

    def last_snapshot(self, coordination_id: str) -> str | None:
        """The newest snapshot id of *coordination_id*: cached, else the store's latest."""
        head = self._heads.get(coordination_id)
        if head is None:
            latest = self.store.latest(coordination_id)
            if latest is not None:
                head = self._heads[coordination_id] = latest.id
        return head

    def forget(self, coordination_id: str) -> None:
        """Drop the cached head of a coordination (the store is asked next time)."""
        self._heads.pop(coordination_id, None)

    def _lock_of(self, coordination_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(coordination_id, threading.Lock())
