"""The threads that continue dispatched runs in-process (``DispatchThreads``).

A thread pool of the standard library would do, but for one thing: its threads keep
the database connections they opened for as long as the process lives, or close them
after every run (and pay a new connection for the next). These threads keep theirs
while work keeps coming and close them after :data:`IDLE_SECONDS` without any.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

logger = logging.getLogger("flowwarden_django.workflows")

#: Seconds a thread waits for work before it closes its database connections.
IDLE_SECONDS = 2.0


class DispatchThreads:
    """Up to *size* daemon threads named ``fw-queue-N`` that run what :meth:`submit` is
    given, started as work comes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._work: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0

    def submit(self, work: Callable[[], None]) -> None:
        """Run *work* on one of the threads (it logs its own errors)."""
        self._work.put(work)
        with self._lock:
            self._threads = [thread for thread in self._threads if thread.is_alive()]
            if self._idle == 0 and len(self._threads) < self.size:
                thread = threading.Thread(
                    target=self._serve, name=f"fw-queue-{len(self._threads) + 1}", daemon=True
                )
                self._threads.append(thread)
                self._idle += 1
                thread.start()

    def _serve(self) -> None:
        from django.db import connections

        while True:
            try:
                work = self._work.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                connections.close_all()
                work = self._work.get()
            with self._lock:
                self._idle -= 1
            try:
                work()
            except Exception:  # pragma: no cover - the work logs its own
                logger.exception("a queue dispatch thread's work failed")
            finally:
                with self._lock:
                    self._idle += 1

    def __len__(self) -> int:
        with self._lock:
            return len(self._threads)

    def close_connections(self, timeout: float = 30.0) -> None:
        """Have every thread close its database connections now (tests, before the
        test databases go; a busy thread does it when its work is done)."""
        from django.db import connections

        with self._lock:
            count = len([thread for thread in self._threads if thread.is_alive()])
        if not count:
            return
        # Each thread takes one of these and holds it until all are taken.
        everyone = threading.Barrier(count + 1, timeout=timeout)

        def close() -> None:
            connections.close_all()
            everyone.wait()

        for _ in range(count):
            self._work.put(close)
        everyone.wait()
