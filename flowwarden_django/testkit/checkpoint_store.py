"""The ``CheckpointStore`` contract: the reference suite plus what it lacked.

Covers upsert/find/delete, the field isolation of every partial operation, the
anchor+heartbeat writes, the history-lost reset and its guard, and, beyond the
reference, races made to happen with real threads, the preservation of
``instance_id``/``metadata`` by partial writes, exact BSON token round trips, and
the conditional ``save_initial_sync`` (its condition, its isolation from the other
writes, exact JSON round trips, and its atomicity under concurrent writers).

The tests live in ``testkit/_checkpoint_contract/``, one mixin per concern; this
module composes them with the hooks and fixtures into the public classes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from asgiref.sync import async_to_sync

from ..streams.checkpoint import Checkpoint, CheckpointStore
from ._checkpoint_contract.exactness import ExactnessContract
from ._checkpoint_contract.history_lost import HistoryLostContract
from ._checkpoint_contract.initial_sync import InitialSyncContract
from ._checkpoint_contract.partial_writes import PartialWriteContract
from ._checkpoint_contract.races import RaceContract
from ._checkpoint_contract.records import RecordContract
from ._checkpoint_contract.values import now_ms, sync_progress, token
from ._harness import AsyncStoreContract, StoreContract, UniqueNameContract

__all__ = [
    "CHECKPOINT_OPERATIONS",
    "AsyncCheckpointStoreContract",
    "CheckpointStoreContract",
    "now_ms",
    "sync_progress",
    "token",
]


# The concerns last-first: pytest collects the tests of the last base first, so they
# run records first and races last, as they did in one class.
class CheckpointStoreContract(
    RaceContract,
    ExactnessContract,
    InitialSyncContract,
    HistoryLostContract,
    PartialWriteContract,
    RecordContract,
    UniqueNameContract,
    StoreContract,
):
    """Behaviour every ``CheckpointStore`` must have. Subclass it and implement
    :meth:`make_store`; override :meth:`clean_state` if the store needs wiping.

    Each test uses stream names of its own, so a shared backend needs no cleanup.
    The race tests run real threads; :meth:`thread_finished` closes the Django
    connections each thread opened.
    """

    #: Writes per anchor in the two-writer race.
    race_writes: int = 2000
    #: Rounds of the processed-write versus reset race.
    reset_race_rounds: int = 100
    #: Rounds of the two initial-sync races.
    initial_sync_race_rounds: int = 50
    #: Threads competing for each batch in the initial-sync race.
    initial_sync_writers: int = 4


#: The operations :class:`AsyncCheckpointStoreContract` drives through their ``a…`` twins.
CHECKPOINT_OPERATIONS = CheckpointStore._thread_twinned


class AsyncCheckpointStoreContract(AsyncStoreContract, CheckpointStoreContract):
    """The same contract through the async API (``asave``, ``afind``…).

    Every test of :class:`CheckpointStoreContract` runs against a stand-in whose
    sync operations await the store's ``a…`` variants on an event loop
    (``testkit/_async_driven.py``): the same values, errors and races, from async
    code. Then a few tests of its own await many calls at once.

    Subclass it like the sync contract (``make_store``), or put it first in front
    of an existing sync test class to run that class's setup through the async API::

        class TestMyStoreAsync(AsyncCheckpointStoreContract, TestMyStore):
            pass
    """

    #: Each driven call awaits on a fresh event loop (``async_to_sync``), some ten
    #: times the cost of a sync call: fewer writes race in the race test.
    race_writes = 300
    async_operations = CHECKPOINT_OPERATIONS

    def test_gathered_async_writes_all_land(self, store: Any, name: str) -> None:
        real: CheckpointStore = store.driven
        now = now_ms()
        streams = [f"{name}-{index}" for index in range(10)]

        async def scenario() -> list[Checkpoint | None]:
            await asyncio.gather(
                *(real.asave_seen(s, token(f"s{i}"), now) for i, s in enumerate(streams)),
                *(real.asave_processed(s, token(f"p{i}"), now) for i, s in enumerate(streams)),
            )
            written = await asyncio.gather(
                *(
                    real.asave_initial_sync(s, sync_progress(0), expected_batch=None)
                    for s in streams
                )
            )
            assert written == [True] * len(streams)
            return list(await asyncio.gather(*(real.afind(s) for s in streams)))

        for index, found in enumerate(async_to_sync(scenario)()):
            assert found is not None
            assert found.last_seen_token == token(f"s{index}")
            assert found.last_processed_token == token(f"p{index}")
            assert found.initial_sync == sync_progress(0)
