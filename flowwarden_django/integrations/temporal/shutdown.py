"""How the Temporal worker stops: steps in flight finish, then the SDK's shutdown gets
a short while to say goodbye to the server.

With the server down, the SDK's shutdown can wait on calls that never answer (the
worker-shutdown RPC, a poll's retries: temporalio/sdk-python#1557). Nothing durable
depends on them: a step's own work commits to the project's database, and Temporal
retries on another worker whatever this one did not report."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

logger = logging.getLogger("flowwarden_django.temporal")

#: Seconds the SDK's shutdown may take once no step is in flight.
SHUTDOWN_LINGER = 3.0


class StepExecutor(ThreadPoolExecutor):
    """The activities' thread pool, counting the steps that run on it."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers, thread_name_prefix="flowwarden-step")
        self._lock = threading.Lock()
        self._running = 0

    @property
    def in_flight(self) -> int:
        """Steps submitted and not yet finished."""
        with self._lock:
            return self._running

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            self._running += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._finished(None)
            raise
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future: Future | None) -> None:
        with self._lock:
            self._running -= 1


async def shut_down(worker: Any, steps: StepExecutor, *, linger: float = SHUTDOWN_LINGER) -> None:
    """Shut *worker* down: wait while steps run on *steps* (the SDK bounds that by
    its graceful timeout), then at most *linger* seconds more for the SDK."""
    loop = asyncio.get_running_loop()
    shutdown = asyncio.ensure_future(worker.shutdown())
    idle_since: float | None = None
    while not shutdown.done():
        await asyncio.wait({shutdown}, timeout=0.1)
        if steps.in_flight:
            idle_since = None
            continue
        idle_since = idle_since if idle_since is not None else loop.time()
        if not shutdown.done() and loop.time() - idle_since >= linger:
            logger.warning(
                "flowwarden Temporal worker: no step in flight and the SDK's shutdown "
                "has not finished after %.0f s (is the server down?); leaving it",
                linger,
            )
            shutdown.add_done_callback(_consume)
            return
    _consume(shutdown)


def _consume(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("flowwarden Temporal worker: shutdown: %s", task.exception())
