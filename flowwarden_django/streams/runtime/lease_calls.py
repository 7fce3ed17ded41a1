"""``LeaseCalls``: the thread that makes one lease's lock-service calls.

The supervisor renews every ``SINGLE_LEADER`` lease of its process, publishes the
status rows and applies operators' requests on one thread. A lock service that went
silent (a partition, a client without a socket timeout) would hold that thread for
as long as the call blocks, up to the kernel's retransmission timeout. The calls run
here instead, and the supervisor waits for each at most a moment: an unanswered call
stays pending, its answer is taken on a later pass.

The thread is a daemon (a call stuck on a dead connection must not hold the process's
exit), started on the first call and ended after a minute without one; it closes its
Django database connections as it ends (the ORM lock service's).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from django.db import connections

#: Seconds without a call after which the thread ends (the next call starts another).
IDLE_SECONDS = 60.0


class LeaseCalls:
    """Runs callables on one daemon thread, in order; see the module docstring."""

    def __init__(self, name: str, idle_seconds: float = IDLE_SECONDS) -> None:
        self.name = name
        self.idle_seconds = idle_seconds
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]]
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """``fn(*args)`` on the thread; its future."""
        future: Future[Any] = Future()
        with self._lock:
            self._queue.put((future, fn, args))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name=f"fw-lease-{self.name}", daemon=True
                )
                self._thread.start()
        return future

    def _work(self) -> None:
        try:
            while True:
                try:
                    future, fn, args = self._queue.get(timeout=self.idle_seconds)
                except queue.Empty:
                    with self._lock:
                        if self._queue.empty():
                            self._thread = None
                            return
                    continue
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:
                    future.set_exception(exc)
        finally:
            connections.close_all()
