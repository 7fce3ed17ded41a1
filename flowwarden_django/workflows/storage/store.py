"""The ``SnapshotStore`` SPI: where workflow snapshots live.

Backends: ``backends.memory.InMemorySnapshotStore`` and ``backends.orm.OrmSnapshotStore``,
chosen by alias in ``FLOWWARDEN["SNAPSHOT_STORES"]`` (see ``snapshot_stores``).
Every backend emits the same events for the same operations, to its listeners and
as Django signals (``workflows/signals.py``); a failing listener is logged and
never aborts the operation.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

from asgiref.sync import sync_to_async
from django.utils import timezone

from ...common.async_twins import method_twin
from ...common.backend_aliases import BackendAliases
from . import signals
from .retention import check_prune_arguments
from .snapshot import (
    CheckpointQuery,
    Deleted,
    Forked,
    Loaded,
    SnapshotEvent,
    WorkflowSnapshot,
)

logger = logging.getLogger("flowwarden_django.workflows")

Listener = Callable[[SnapshotEvent], None]
T = TypeVar("T")


class UnknownSnapshotError(ValueError):
    """``fork`` (or another operation) named a snapshot id the store does not have."""


class SnapshotConflictError(RuntimeError):
    """A save would give a coordination two snapshots at one ``seq``: another runner
    advanced the coordination first."""


class SnapshotStore(ABC):
    """Persists workflow snapshots (``WorkflowSnapshot``). Thread-safe.

    * ``save(snapshot)``: upsert by id (the same id replaces its snapshot, keeping its
      ``seq`` unless one is given). A snapshot without ``seq`` gets the next one of its
      coordination; one with ``seq`` set keeps it, and ``SnapshotConflictError`` is
      raised when another snapshot of the coordination already has it. Returns the
      stored snapshot (with its ``seq``). Emits ``Saved``.
    * ``load(id)``: the snapshot or ``None`` (``Loaded`` only on a hit).
    * ``fork(source_id, new_state)``: a new snapshot whose parent is the source, with
      the source's coordination, agent and metadata; ``UnknownSnapshotError`` for an
      unknown source. Emits ``Forked`` (and ``Saved``).
    * ``list(query)``: matches in the query's order (see ``CheckpointQuery``).
    * ``latest(coordination_id)``: the snapshot with the highest ``seq``, or ``None``.
    * ``delete(id)`` → bool; ``delete_coordination(cid)`` → count: ``Deleted`` for
      every removed snapshot.
    * ``prune(keep_last=, older_than=, coordination_id=)`` → count: retention that
      never removes a coordination's newest snapshot, an ancestor of a kept fork, or
      a snapshot waiting for approval (``workflows/retention.py``); ``Deleted`` for
      every removed snapshot.

    Async API: ``asave``, ``aload``, ``alist``, ``alatest``, ``afork``, ``adelete``,
    ``adelete_coordination`` and ``aprune`` have the semantics, errors and events of
    their sync twins. The defaults run the sync method through
    ``asgiref.sync.sync_to_async(thread_sensitive=async_thread_sensitive)``: ``True``
    here and on the ORM store (Django's connections and transactions belong to the
    thread-sensitive executor, so the call joins the caller's connection), ``False`` on
    stores that never touch the Django database (memory), whose calls then run in
    parallel on the default executor. Every operation of a store touches the same
    storage, so one class attribute decides for all of them; a backend with a native
    async client overrides the ``a…`` methods themselves. Listeners and signal
    receivers run on the thread that runs the operation.
    """

    #: Whether state and metadata are encrypted where they are stored.
    encrypts_at_rest: ClassVar[bool] = False
    #: ``thread_sensitive`` of the ``a…`` defaults: ``True`` for stores on the Django
    #: database, ``False`` for those that never touch it.
    async_thread_sensitive: ClassVar[bool] = True

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._listeners_lock = threading.Lock()

    # -- the SPI -----------------------------------------------------------------------

    @abstractmethod
    def save(self, snapshot: WorkflowSnapshot) -> WorkflowSnapshot:
        """Store *snapshot*; return it as stored (with its ``seq``)."""

    @abstractmethod
    def load(self, snapshot_id: str) -> WorkflowSnapshot | None:
        """The snapshot *snapshot_id*, or ``None``."""

    @abstractmethod
    def list(self, query: CheckpointQuery | None = None) -> list[WorkflowSnapshot]:
        """The snapshots matching *query* (all when ``None``)."""

    @abstractmethod
    def latest(self, coordination_id: str) -> WorkflowSnapshot | None:
        """The newest snapshot of a coordination (highest ``seq``)."""

    @abstractmethod
    def delete(self, snapshot_id: str) -> bool:
        """Remove one snapshot; True if it existed."""

    @abstractmethod
    def delete_coordination(self, coordination_id: str) -> int:
        """Remove every snapshot of a coordination; how many."""

    def prune(
        self,
        keep_last: int | None = None,
        older_than: timedelta | None = None,
        coordination_id: str | None = None,
        *,
        protected_ids: Iterable[str] = (),
    ) -> int:
        """Remove old snapshots (of one coordination, or of all); how many.

        ``keep_last`` keeps each coordination's N newest, ``older_than`` those younger
        than that age; a snapshot either rule keeps stays. Never removed: each
        coordination's newest snapshot, the ancestors of a kept fork, the head of a
        run waiting for approval, and *protected_ids*. Emits ``Deleted`` per snapshot.
        Backends implement ``_prune``.
        """
        check_prune_arguments(keep_last, older_than)
        cutoff = timezone.now() - older_than if older_than is not None else None
        return self._prune(keep_last, cutoff, coordination_id, set(protected_ids))

    def _prune(
        self, keep_last: int | None, cutoff: Any, coordination_id: str | None, protected: set[str]
    ) -> int:
        """``prune`` with its arguments checked: *cutoff* the time before which a
        snapshot is old (``None``: no age rule), *protected* the caller's ids (the
        backend adds the heads of waiting runs, and what else it protects)."""
        raise NotImplementedError(f"{type(self).__name__} does not support prune")

    def fork(self, source_id: str, new_state: Any) -> WorkflowSnapshot:
        """Branch off *source_id* with *new_state* (saved)."""
        source = self._get(source_id)
        if source is None:
            raise UnknownSnapshotError(f"unknown source snapshot: {source_id!r}")
        child = self.save(source.derive_with(new_state))
        self._emit(Forked, child, source_id=source.id)
        return child

    def _get(self, snapshot_id: str) -> WorkflowSnapshot | None:
        """``load`` without the ``Loaded`` event: ``fork`` emits only ``Saved`` and
        ``Forked``. Backends override it; the default calls ``load``."""
        return self.load(snapshot_id)

    def _loaded(self, snapshot: WorkflowSnapshot | None) -> WorkflowSnapshot | None:
        """*snapshot*, once ``Loaded`` is emitted for it (when there is one): what a
        backend's ``load`` returns."""
        if snapshot is not None:
            self._emit(Loaded, snapshot)
        return snapshot

    def close(self) -> None:  # noqa: B027  (optional hook, not abstract)
        """Release connections (called when settings change)."""

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[Any]:
        """System-check messages about this backend's ``OPTIONS`` (none by default)."""
        return []

    # -- the async API: the sync operations run through ``sync_to_async`` ----------------

    async def _run_sync(self, method: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``method(*args, **kwargs)`` off the event loop, on the executor that
        :attr:`async_thread_sensitive` names."""
        call = sync_to_async(method, thread_sensitive=self.async_thread_sensitive)
        return await call(*args, **kwargs)

    asave = method_twin(save, "Async ``save``.", own_executor=True)
    aload = method_twin(load, "Async ``load``.", own_executor=True)
    alist = method_twin(list, "Async ``list``.", own_executor=True)
    alatest = method_twin(latest, "Async ``latest``.", own_executor=True)
    afork = method_twin(fork, "Async ``fork``.", own_executor=True)
    adelete = method_twin(delete, "Async ``delete``.", own_executor=True)
    adelete_coordination = method_twin(delete_coordination, "Async ``delete_coordination``.")
    aprune = method_twin(prune, "Async ``prune``.", own_executor=True)

    # -- listeners and events ----------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        """Call *listener(event)* after each operation, on the calling thread."""
        with self._listeners_lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling *listener* (no error if it was never added)."""
        with self._listeners_lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _emit(self, kind: type[SnapshotEvent], snapshot: WorkflowSnapshot, **fields: Any) -> None:
        if not self._listeners and not signals.has_receivers(kind):
            return  # nobody to tell: no event is made (every workflow step comes here)
        self._emit_event(kind(snapshot.id, snapshot.coordination_id, timezone.now(), **fields))

    def _emit_deleted(self, removed: Iterable[tuple[str, str]]) -> None:
        """``Deleted`` for each ``(snapshot_id, coordination_id)`` removed."""
        now = timezone.now()
        for snapshot_id, coordination_id in removed:
            self._emit_event(Deleted(snapshot_id, coordination_id, now))

    def _emit_event(self, event: SnapshotEvent) -> None:
        with self._listeners_lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                logger.warning("snapshot listener %r failed on %r", listener, event, exc_info=True)
        signals.send(self, event)


#: Snapshot stores by alias: ``snapshot_stores["default"]``.
snapshot_stores: BackendAliases[SnapshotStore] = BackendAliases(
    "SNAPSHOT_STORES", SnapshotStore, "snapshot store"
)
