"""Snapshot store in process memory, for tests, demos and single-process tools.

State goes through the store's serializer on save and load, as in the ORM store:
a stored snapshot is a copy the caller cannot change afterwards, and a state the
ORM store would refuse is refused here too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from django.core import checks

from ..storage.retention import PruneRow, plan_prune
from ..storage.serializers import StateSerializer, resolve_serializer
from ..storage.snapshot import CheckpointQuery, Saved, WorkflowSnapshot
from ..storage.store import SnapshotConflictError, SnapshotStore, snapshot_stores
from ._common import check_query, check_serializer_option, unreadable

logger = logging.getLogger("flowwarden_django.workflows")


class _Entry(NamedTuple):
    snapshot: WorkflowSnapshot  # as stored, with ``seq``; state kept as text below
    state_text: str
    state_type: str


class InMemorySnapshotStore(SnapshotStore):
    """Thread-safe snapshot store in a dict, bounded by ``max_snapshots``.

    Past the cap, the snapshots written longest ago are evicted, except each
    coordination's newest one (where its run resumes): a busy coordination never
    evicts a dormant run's only snapshot. When only newest snapshots are left the
    store grows past the cap and logs a warning. Evicted snapshots emit ``Deleted``.

    ``protect`` (optional) returns ids ``prune`` must keep, e.g. the heads of runs
    waiting for approval (the ORM store reads those from ``WorkflowRun``).
    """

    #: The async API runs on the default executor: this store never touches the
    #: Django database (a ``protect`` hook that does should be thread-safe).
    async_thread_sensitive = False

    def __init__(
        self,
        max_snapshots: int = 10_000,
        serializer: StateSerializer | str | None = None,
        protect: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        super().__init__()
        if isinstance(max_snapshots, bool) or not isinstance(max_snapshots, int):
            raise ValueError(f"max_snapshots must be an integer, not {max_snapshots!r}")
        if max_snapshots <= 0:
            raise ValueError(f"max_snapshots must be positive, not {max_snapshots}")
        self.max_snapshots = max_snapshots
        self.serializer = resolve_serializer(serializer)
        self.protect = protect
        self._lock = threading.RLock()
        # Insertion order is write order: eviction takes the front.
        self._entries: dict[str, _Entry] = {}
        self._seqs: dict[str, dict[int, str]] = {}  # coordination -> seq -> id
        self._over_cap_warned = False

    def __len__(self) -> int:
        return len(self._entries)

    def size(self) -> int:
        """How many snapshots are stored."""
        return len(self._entries)

    # -- the SPI -----------------------------------------------------------------------

    def save(self, snapshot: WorkflowSnapshot) -> WorkflowSnapshot:
        text, label = self.serializer.dumps(snapshot.state)
        cid = snapshot.coordination_id
        with self._lock:
            old = self._entries.get(snapshot.id)
            seqs = self._seqs.get(cid, {})
            if snapshot.seq is not None:
                seq = snapshot.seq
                holder = seqs.get(seq)
                if holder is not None and holder != snapshot.id:
                    raise SnapshotConflictError(
                        f"coordination {cid!r} already has snapshot {holder!r} at seq {seq}"
                    )
            elif old is not None and old.snapshot.coordination_id == cid:
                seq = old.snapshot.seq
            else:
                seq = max(seqs, default=0) + 1
            stored = snapshot.replace(seq=seq)
            if old is not None:
                self._remove(snapshot.id)
            self._entries[snapshot.id] = _Entry(stored.replace(state=None), text, label)
            self._seqs.setdefault(cid, {})[seq] = snapshot.id
            evicted = self._evict()
        self._emit_deleted(evicted)
        self._emit(Saved, stored)
        return stored

    def load(self, snapshot_id: str) -> WorkflowSnapshot | None:
        return self._loaded(self._get(snapshot_id))

    def _get(self, snapshot_id: str) -> WorkflowSnapshot | None:
        entry = self._entries.get(snapshot_id)
        return None if entry is None else self._decode(entry)

    def list(self, query: CheckpointQuery | None = None) -> list[WorkflowSnapshot]:
        query = check_query(query)
        with self._lock:
            if query.coordination_id is not None:
                ids = self._seqs.get(query.coordination_id, {}).values()
                entries = [self._entries[i] for i in ids]
            else:
                entries = list(self._entries.values())
        matches = [e for e in entries if _matches(e.snapshot, query)]
        matches.sort(key=lambda e: query.sort_key(e.snapshot), reverse=query.newest_first)
        if query.after is not None:
            mark = query.sort_key(query.after)
            if query.newest_first:
                matches = [e for e in matches if query.sort_key(e.snapshot) < mark]
            else:
                matches = [e for e in matches if query.sort_key(e.snapshot) > mark]
        if query.limit:
            matches = matches[: query.limit]
        if not query.with_state:
            return [e.snapshot.replace(state=None) for e in matches]
        return [self._decode_listed(e) for e in matches]

    def latest(self, coordination_id: str) -> WorkflowSnapshot | None:
        with self._lock:
            seqs = self._seqs.get(coordination_id)
            entry = self._entries[seqs[max(seqs)]] if seqs else None
        return None if entry is None else self._decode(entry)

    def delete(self, snapshot_id: str) -> bool:
        with self._lock:
            removed = self._remove(snapshot_id)
        if removed is None:
            return False
        self._emit_deleted([removed])
        return True

    def delete_coordination(self, coordination_id: str) -> int:
        with self._lock:
            seqs = self._seqs.get(coordination_id, {})
            removed = [self._remove(seqs[seq]) for seq in sorted(seqs)]
        self._emit_deleted(r for r in removed if r is not None)
        return len(removed)

    def _prune(
        self, keep_last: int | None, cutoff: Any, coordination_id: str | None, protected: set[str]
    ) -> int:
        if self.protect is not None:
            protected.update(self.protect())
        removed: list[tuple[str, str]] = []
        with self._lock:
            scope = [coordination_id] if coordination_id is not None else list(self._seqs)
            for cid in scope:
                rows = [
                    PruneRow(s.id, s.parent_id, s.seq, s.created_at)
                    for s in (self._entries[i].snapshot for i in self._seqs.get(cid, {}).values())
                ]
                for snapshot_id in plan_prune(
                    rows, keep_last=keep_last, cutoff=cutoff, protected=protected
                ):
                    removed.append(self._remove(snapshot_id))
        self._emit_deleted(removed)
        return len(removed)

    def clear(self) -> None:
        """Forget every snapshot (no events)."""
        with self._lock:
            self._entries.clear()
            self._seqs.clear()

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[checks.CheckMessage]:
        messages = []
        where = f'{snapshot_stores.alias_setting(alias)}["OPTIONS"]'
        cap = options.get("max_snapshots", 10_000)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
            messages.append(
                checks.Error(
                    f'{where}["max_snapshots"] = {cap!r} is not a positive integer.',
                    hint="The default is 10000.",
                    id="flowwarden_django.E008",
                )
            )
        if "serializer" in options:
            messages.extend(check_serializer_option(where, options["serializer"]))
        return messages

    # -- internals (call with the lock held) -------------------------------------------

    def _decode(self, entry: _Entry) -> WorkflowSnapshot:
        return entry.snapshot.replace(
            state=self.serializer.loads(entry.state_text, entry.state_type)
        )

    def _decode_listed(self, entry: _Entry) -> WorkflowSnapshot:
        try:
            return self._decode(entry)
        except Exception as exc:  # one bad row must not fail the listing
            return unreadable(entry.snapshot, exc)

    def _remove(self, snapshot_id: str) -> tuple[str, str] | None:
        entry = self._entries.pop(snapshot_id, None)
        if entry is None:
            return None
        cid = entry.snapshot.coordination_id
        seqs = self._seqs.get(cid)
        if seqs is not None:
            seqs.pop(entry.snapshot.seq, None)
            if not seqs:
                del self._seqs[cid]
        return snapshot_id, cid

    def _evict(self) -> list[tuple[str, str]]:
        overflow = len(self._entries) - self.max_snapshots
        if overflow <= 0:
            self._over_cap_warned = False
            return []
        newest: dict[str, int] = {}
        victims = []
        for snapshot_id, entry in self._entries.items():
            cid = entry.snapshot.coordination_id
            if cid not in newest:
                newest[cid] = max(self._seqs[cid])
            if entry.snapshot.seq != newest[cid]:
                victims.append(snapshot_id)
                if len(victims) == overflow:
                    break
        if len(victims) < overflow and not self._over_cap_warned:
            self._over_cap_warned = True
            logger.warning(
                "InMemorySnapshotStore holds %d snapshots, over its cap of %d: only the "
                "newest snapshot of each coordination is left, and those are never evicted",
                len(self._entries) - len(victims),
                self.max_snapshots,
            )
        return [r for r in map(self._remove, victims) if r is not None]


def _matches(snapshot: WorkflowSnapshot, query: CheckpointQuery) -> bool:
    return (
        (query.coordination_ids is None or snapshot.coordination_id in query.coordination_ids)
        and (query.agent_name is None or snapshot.agent_name == query.agent_name)
        and (query.since is None or snapshot.created_at >= query.since)
        and (query.until is None or snapshot.created_at <= query.until)
    )
