"""What every store contract of the testkit shares, written once.

The checkpoint, dead-letter and snapshot contracts (and, for its threads, the lock
contract) make the object under test before each test and release it after, and
their race tests run real threads that each close their Django connections at the
end. Each async twin runs the same tests against a stand-in that drives the store's
``a…`` operations (``_async_driven.py``): it only names those operations.
"""

from __future__ import annotations

import inspect
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest

from ._async_driven import async_driven


class UniqueNameContract:
    """The ``name`` fixture: a name of each test's own (its ids, streams or leases), so
    tests can share one backend without cleaning it between them."""

    #: What the ``name`` fixture's names start with.
    name_prefix: ClassVar[str] = "contract-"

    @pytest.fixture
    def name(self) -> str:
        """:attr:`name_prefix` and twelve random hex digits."""
        return f"{self.name_prefix}{uuid.uuid4().hex[:12]}"


class ThreadedContract:
    """The race tests' threads: :meth:`run_threads` and :meth:`thread_finished`."""

    #: Whether :meth:`run_threads` holds every thread until all have started.
    start_threads_together: ClassVar[bool] = False

    def thread_finished(self) -> None:
        """Called at the end of every worker thread the race tests start (closes the
        thread's Django connections)."""
        from django.db import connections

        connections.close_all()

    def run_threads(self, *targets: Callable[[], None]) -> None:
        """Run *targets* in threads, wait for all, and re-raise the first error."""
        errors: list[BaseException] = []
        start = threading.Barrier(len(targets)) if self.start_threads_together else None

        def wrap(target: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                try:
                    if start is not None:
                        start.wait(timeout=60)
                    target()
                except BaseException as exc:  # re-raised below, in the test's thread
                    errors.append(exc)
                finally:
                    self.thread_finished()

            return run

        threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
            assert not thread.is_alive(), "a worker thread did not finish within 600 s"
        if errors:
            raise errors[0]


class StoreContract(ThreadedContract):
    """A store's life around each test: :meth:`make_store`, :meth:`clean_state`
    before, :meth:`teardown_store` after; the ``store`` fixture yields it (through
    its async API when :attr:`async_operations` names the operations to drive)."""

    #: The operations an async twin drives through their ``a…`` variants (none: the
    #: sync contract uses the store itself).
    async_operations: ClassVar[tuple[str, ...]] = ()

    def make_store(self) -> Any:
        """Return the store under test."""
        raise NotImplementedError("Subclasses return the store under test")

    def clean_state(self, store: Any) -> None:
        """Wipe the store before each test (nothing by default)."""

    def teardown_store(self, store: Any) -> None:
        """Release or wipe the store after each test (``store.close()`` by default)."""
        store.close()

    @pytest.fixture
    def store(self) -> Iterator[Any]:
        store = self.make_store()
        self.clean_state(store)
        operations = self.async_operations
        yield async_driven(store, operations) if operations else store
        self.teardown_store(store)


class AsyncStoreContract(StoreContract):
    """What the ``Async…Contract`` twins share: the ``store`` fixture again (so it comes
    before a sync test class put behind the twin), and a check that every operation of
    :attr:`async_operations` has a coroutine function for its ``a…`` variant."""

    store = StoreContract.store

    def test_async_variants_are_coroutine_functions(self, store: Any) -> None:
        for operation in self.async_operations:
            assert inspect.iscoroutinefunction(getattr(store.driven, f"a{operation}")), operation
