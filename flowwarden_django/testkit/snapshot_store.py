"""The ``SnapshotStore`` contract: what every workflow snapshot store must do.

Covers save/load/replace, fork, listing (filters, both orders, limits, keyset
paging while rows are added), ``latest`` by ``seq`` whatever the clock says, ``seq``
assignment under real concurrent writers, explicit-``seq`` conflicts, deletes and
their events, listeners and Django signals, state round trips, retention (``prune``)
and, for stores that encrypt, failing closed without the right key.

Subclass :class:`SnapshotStoreContract` with a name pytest collects and implement
:meth:`~SnapshotStoreContract.make_store`; override the optional hooks to enable
the waiting-run and encryption tests.

The tests live in ``testkit/_snapshot_contract/``, one mixin per concern; this module
composes them with the hooks, fixtures and helpers into the public classes.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from ..workflows.storage.snapshot import SnapshotEvent, WorkflowSnapshot
from ..workflows.storage.store import SnapshotStore
from ._async_driven import async_driven
from ._harness import AsyncStoreContract, StoreContract
from ._snapshot_contract.encryption import EncryptionContract
from ._snapshot_contract.events import DeleteAndEventContract
from ._snapshot_contract.listing import ListingContract
from ._snapshot_contract.retention import RetentionContract
from ._snapshot_contract.saving import SavingContract
from ._snapshot_contract.sequences import SequenceContract
from ._snapshot_contract.values import BASE, ContractLine, ContractOrder

__all__ = [
    "BASE",
    "SNAPSHOT_OPERATIONS",
    "AsyncSnapshotStoreContract",
    "ContractLine",
    "ContractOrder",
    "SnapshotStoreContract",
]


# The concerns last-first: pytest collects the tests of the last base first, so they
# run saving first and encryption last, as they did in one class.
class SnapshotStoreContract(
    EncryptionContract,
    RetentionContract,
    DeleteAndEventContract,
    SequenceContract,
    ListingContract,
    SavingContract,
    StoreContract,
):
    """Behaviour every ``SnapshotStore`` must have.

    Required: :meth:`make_store`. Optional: :meth:`teardown_store`,
    :meth:`thread_finished`, :meth:`mark_waiting` (how a run waits for approval in
    this backend), :meth:`make_encrypting_store` and :meth:`raw_texts` (the
    encryption tests skip without them).

    Tests use coordination ids of their own, but some list or prune the whole store:
    run the contract against a test database, not one holding data you keep.
    """

    #: The race tests start their threads together.
    start_threads_together = True
    #: Threads and saves per thread of the concurrent ``seq`` test.
    race_threads: int = 8
    race_saves: int = 5

    def mark_waiting(self, store: SnapshotStore, snapshot: WorkflowSnapshot) -> dict[str, Any]:
        """Make *snapshot* the head of a run waiting for approval; return extra
        ``prune`` arguments. By default: ``{"protected_ids": {snapshot.id}}``."""
        return {"protected_ids": {snapshot.id}}

    def make_encrypting_store(self, keys: list[str] | None, **options: Any) -> SnapshotStore | None:
        """A store on the same storage as :meth:`make_store` with these encryption keys
        (``None``: no encryption) and *options* (``require_encryption``), or ``None``
        when the backend does not encrypt."""
        return None

    def raw_texts(self, store: SnapshotStore, snapshot_id: str) -> tuple[str, str] | None:
        """The stored (state, metadata) text of a snapshot, or ``None`` if unknown."""
        return None

    def move_row(self, store: SnapshotStore, snapshot_id: str, coordination_id: str) -> bool:
        """Move a stored snapshot to another coordination behind the store's back, as
        someone with write access to the storage could; False if unsupported."""
        return False

    # -- fixtures and helpers ----------------------------------------------------------

    @pytest.fixture
    def cid(self) -> str:
        return f"contract-{uuid.uuid4().hex[:12]}"

    @pytest.fixture
    def events(self, store: SnapshotStore) -> Iterator[list[SnapshotEvent]]:
        seen: list[SnapshotEvent] = []
        store.add_listener(seen.append)
        yield seen
        store.remove_listener(seen.append)

    @staticmethod
    def chain(
        store: SnapshotStore, cid: str, count: int, *, start: datetime = BASE, **fields: Any
    ) -> list[WorkflowSnapshot]:
        """Save *count* snapshots, each the child of the one before, a second apart."""
        saved: list[WorkflowSnapshot] = []
        for index in range(count):
            parent = saved[-1].id if saved else None
            snapshot = WorkflowSnapshot(
                id=uuid.uuid4().hex,
                coordination_id=cid,
                state={"step": index},
                parent_id=parent,
                created_at=start + timedelta(seconds=index),
                **fields,
            )
            saved.append(store.save(snapshot))
        return saved

    @staticmethod
    def ids(snapshots: list[WorkflowSnapshot]) -> list[str]:
        return [s.id for s in snapshots]


#: The operations :class:`AsyncSnapshotStoreContract` drives through their ``a…`` twins.
SNAPSHOT_OPERATIONS = (
    "save",
    "load",
    "list",
    "latest",
    "fork",
    "delete",
    "delete_coordination",
    "prune",
)


class AsyncSnapshotStoreContract(AsyncStoreContract, SnapshotStoreContract):
    """The same contract through the async API (``asave``, ``aload``, ``alatest``…).

    Every test of :class:`SnapshotStoreContract` runs against a stand-in whose sync
    operations await the store's ``a…`` variants on an event loop
    (``testkit/_async_driven.py``): the same values, errors, events and signals, from
    async code. The encrypting stores of :meth:`make_encrypting_store` are driven the
    same way when this class comes first in front of the class that defines it::

        class TestMyStoreAsync(AsyncSnapshotStoreContract, TestMyStore):
            pass

    Then a test of its own awaits many saves at once.
    """

    async_operations = SNAPSHOT_OPERATIONS

    def make_encrypting_store(self, keys: list[str] | None, **options: Any) -> SnapshotStore | None:
        store = super().make_encrypting_store(keys, **options)
        return None if store is None else async_driven(store, SNAPSHOT_OPERATIONS)

    def test_gathered_async_saves_get_distinct_seqs(self, store: Any, cid: str) -> None:
        real: SnapshotStore = store.driven

        async def scenario() -> tuple[list[WorkflowSnapshot], WorkflowSnapshot | None]:
            saved = await asyncio.gather(
                *(real.asave(WorkflowSnapshot.root(cid, {"n": n})) for n in range(6))
            )
            return list(saved), await real.alatest(cid)

        saved, latest = async_to_sync(scenario)()
        assert sorted(s.seq for s in saved) == list(range(1, 7))
        assert latest is not None and latest.seq == 6
