"""What a workflow's history is made of: ``WorkflowSnapshot``, ``CheckpointQuery`` and
the lifecycle events stores emit (``Saved``, ``Loaded``, ``Forked``, ``Deleted``).

A coordination (one workflow run) is a chain of snapshots: each links to the one it
was derived from (``parent_id``), and a fork is a branch off any of them. Inside a
coordination, snapshots are ordered by ``seq``, a monotonic integer the store
assigns and keeps unique per coordination: never by wall-clock time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone


class _IdSource:
    """Unpredictable 128-bit values without a system call each: BLAKE2b keyed with 32
    random bytes of this process, over a counter and the calling thread. ``os.urandom``
    per id lets go of the GIL, and in a worker whose other threads are busy (Celery's
    consumer, say) getting it back costs more than the rest of a step's bookkeeping."""

    def __init__(self) -> None:
        #: (pid, key, counter), read as one: a key is only ever used with its own
        #: counter (two threads that both draw a key at once each use their own).
        self._state: tuple[int, bytes, Iterator[int]] = (-1, b"", itertools.count())

    def take(self) -> bytes:
        state = self._state
        # A new process (forked by os.fork, or by a server's plain fork(), as uWSGI's
        # workers are, which runs no Python fork hook) must not repeat its parent's
        # values: it draws a key of its own.
        if state[0] != os.getpid():
            state = self._state = (os.getpid(), os.urandom(32), itertools.count())
        _, key, counter = state
        # The thread's ident too: two threads never hash the same input, even where
        # taking the next count were not atomic (a build without the GIL).
        number = next(counter).to_bytes(16, "big")
        thread = threading.get_ident().to_bytes(8, "big")
        return hashlib.blake2b(number + thread, key=key, digest_size=16).digest()


_ids = _IdSource()


def new_snapshot_id() -> str:
    """A fresh snapshot id (a UUID4 hex string)."""
    raw = bytearray(_ids.take())
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    return raw.hex()


def storable_id(value: object) -> bool:
    """Whether *value* could be the id of a stored snapshot (``check_id`` passes it):
    an id from a URL may be anything, and PostgreSQL refuses even to compare a NUL."""
    try:
        check_id(value)
    except ValueError:
        return False
    return True


def check_id(value: object, argument: str = "id") -> str:
    """Raise unless *value* is a non-blank string of at most 64 characters, no NUL."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{argument} must be a non-blank string, not {value!r}")
    if len(value) > 64:
        raise ValueError(f"{argument} is {len(value)} characters long; the most is 64")
    if "\x00" in value:
        raise ValueError(f"{argument} holds a NUL character")
    return value


@dataclasses.dataclass(frozen=True)
class WorkflowSnapshot:
    """One immutable point in a workflow's history.

    ``state`` is the application's (any value the store's serializer handles);
    ``metadata`` maps strings to strings. ``seq`` is ``None`` until a store has
    saved it; the store then returns a copy with its position in the coordination.
    """

    id: str
    coordination_id: str
    state: Any = None
    parent_id: str | None = None
    agent_name: str | None = None
    seq: int | None = None
    metadata: Mapping[str, str] = dataclasses.field(default_factory=dict)
    created_at: datetime = dataclasses.field(default_factory=timezone.now)

    def __post_init__(self) -> None:
        check_id(self.id)
        if self.parent_id is not None:
            check_id(self.parent_id, "parent_id")
        if not isinstance(self.coordination_id, str) or not self.coordination_id.strip():
            raise ValueError(
                f"coordination_id must be a non-blank string, not {self.coordination_id!r}"
            )
        if len(self.coordination_id) > 255:
            raise ValueError("coordination_id is longer than 255 characters")
        for key, value in dict(self.metadata).items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(f"metadata maps str to str; got {key!r}: {value!r}")
        object.__setattr__(self, "metadata", dict(self.metadata))
        if self.created_at.tzinfo is None:
            raise ValueError("created_at must be timezone-aware")

    @property
    def is_root(self) -> bool:
        """Whether it starts a chain (no parent)."""
        return self.parent_id is None

    @classmethod
    def root(
        cls,
        coordination_id: str,
        state: Any = None,
        *,
        agent_name: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> WorkflowSnapshot:
        """A new first snapshot of *coordination_id* (not saved)."""
        return cls(
            id=new_snapshot_id(),
            coordination_id=coordination_id,
            state=state,
            agent_name=agent_name,
            metadata=dict(metadata or {}),
        )

    def derive_with(self, state: Any, **changes: Any) -> WorkflowSnapshot:
        """The next snapshot after this one: a new id, this one as parent, the same
        coordination, agent and metadata (plus *changes*), *state*. Not saved."""
        values = {
            "id": new_snapshot_id(),
            "coordination_id": self.coordination_id,
            "state": state,
            "parent_id": self.id,
            "agent_name": self.agent_name,
            "seq": None,
            "metadata": dict(self.metadata),
            "created_at": timezone.now(),
        }
        values.update(changes)
        return WorkflowSnapshot(**values)

    def successor(
        self, state: Any, *, agent_name: str | None, metadata: Mapping[str, str]
    ) -> WorkflowSnapshot:
        """The snapshot of the next step: ``derive_with(state, seq=seq + 1,
        agent_name=agent_name, metadata=metadata)``, without checking again what was
        checked when this one was made (the ids and the coordination). Not saved."""
        if not all(type(key) is str and type(value) is str for key, value in metadata.items()):
            # derive_with says what is wrong
            return self.derive_with(
                state, seq=(self.seq or 0) + 1, agent_name=agent_name, metadata=metadata
            )
        snapshot = object.__new__(WorkflowSnapshot)
        # Frozen: set the fields as __init__ would, skipping __post_init__'s checks.
        snapshot.__dict__.update(
            id=new_snapshot_id(),
            coordination_id=self.coordination_id,
            state=state,
            parent_id=self.id,
            agent_name=agent_name,
            seq=(self.seq or 0) + 1,
            metadata=dict(metadata),
            created_at=datetime.now(UTC),  # aware, as __post_init__ wants it
        )
        return snapshot

    def replace(self, **changes: Any) -> WorkflowSnapshot:
        """A copy with *changes* (same id unless changed)."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class UnreadableSnapshot(WorkflowSnapshot):
    """A listed snapshot whose stored state or metadata could not be read (a wrong
    key, tampered data, a serializer that refuses the text): its place in the chain,
    with ``state`` ``None``, empty ``metadata`` and ``error``, a short reason.

    ``SnapshotStore.list`` returns one instead of failing the whole listing for one
    bad row; ``load`` and ``latest`` still raise, since a run must not continue
    from a state it cannot read."""

    error: str = ""


@dataclasses.dataclass(frozen=True)
class CheckpointQuery:
    """Which snapshots ``SnapshotStore.list`` returns, in which order.

    ``since``/``until`` are inclusive bounds on ``created_at``; ``limit`` 0 means
    all. Order: within one coordination (``coordination_id`` set) by ``seq`` (never
    by wall-clock time); across coordinations by (``created_at``,
    ``coordination_id``, ``seq``). Oldest first, or newest first with
    ``newest_first`` (a limit then returns the NEWEST rows).
    Paging: pass the last snapshot of a page as ``after`` to get the next page in
    the same order (keyset paging; stable while rows are added).

    ``coordination_ids`` keeps only those coordinations (the store filters, so a
    caller who may see a few runs never reads the others' rows); an empty set lists
    nothing. ``with_state=False`` lists positions only: the store need not read,
    decrypt or decode the states, and the snapshots' ``state`` is ``None``.
    """

    coordination_id: str | None = None
    coordination_ids: frozenset[str] | None = None
    with_state: bool = True
    agent_name: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = 0
    newest_first: bool = False
    after: WorkflowSnapshot | None = None

    @classmethod
    def for_coordination(cls, coordination_id: str, **options: Any) -> CheckpointQuery:
        return cls(coordination_id=coordination_id, **options)

    def next_page(self, page: list[WorkflowSnapshot]) -> CheckpointQuery | None:
        """The query of the page after *page*, or ``None`` when *page* was the last."""
        if not page or (self.limit and len(page) < self.limit) or not self.limit:
            return None
        return dataclasses.replace(self, after=page[-1])

    def sort_key(self, snapshot: WorkflowSnapshot) -> tuple[Any, ...]:
        """The key this query orders by (ascending; reversed for ``newest_first``)."""
        if self.coordination_id is not None:
            return (snapshot.seq or 0,)
        return (snapshot.created_at, snapshot.coordination_id, snapshot.seq or 0)


@dataclasses.dataclass(frozen=True)
class SnapshotEvent:
    """Something a store did to a snapshot; ``timestamp`` is when it was reported."""

    snapshot_id: str
    coordination_id: str
    timestamp: datetime


@dataclasses.dataclass(frozen=True)
class Saved(SnapshotEvent):
    """A snapshot was written (new or replaced)."""


@dataclasses.dataclass(frozen=True)
class Loaded(SnapshotEvent):
    """A snapshot was read by id."""


@dataclasses.dataclass(frozen=True)
class Forked(SnapshotEvent):
    """``snapshot_id`` was forked off ``source_id``."""

    source_id: str = ""


@dataclasses.dataclass(frozen=True)
class Deleted(SnapshotEvent):
    """A snapshot was removed (by ``delete``, ``delete_coordination`` or ``prune``)."""
