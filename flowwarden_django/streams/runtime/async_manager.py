"""``AsyncStreamManager``: the streams of one process on one event loop.

It is :class:`~.manager.StreamManager` with one change: a started stream is an
:class:`~.event_loop.AsyncStreamConsumer` task on the manager's event loop (one
thread, started with the first stream) instead of a ``StreamConsumer`` on a thread
of its own. The supervisor thread is the same: it holds the ``SINGLE_LEADER``
leases, publishes the status rows and applies operators' requests, so the health
view, the status command, the admin and the Prometheus metrics see no difference.

``flowwarden_streams run --asyncio`` uses it, as does every runner of streams when
``FLOWWARDEN["STREAM_RUNNER"]`` is ``"asyncio"`` (see :func:`new_stream_manager`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any

from ...conf import fw_settings
from ..async_source import async_mongo_clients, async_pymongo_source
from ..checkpoint import CheckpointStore
from ..clients import pymongo_source
from ..registry import StreamRegistry
from ..source import ChangeSource
from ..spec import StreamSpec
from .event_loop import AsyncStreamConsumer
from .manager import StreamManager

logger = logging.getLogger("flowwarden_django.streams")

#: The values of ``FLOWWARDEN["STREAM_RUNNER"]``.
STREAM_RUNNERS = ("threads", "asyncio")


class _LoopTask:
    """A consumer's run on the manager's loop, seen as the thread the base class
    expects (``is_alive()``, ``join()``)."""

    def __init__(self, future: concurrent.futures.Future[None]) -> None:
        self.future = future

    def is_alive(self) -> bool:
        return not self.future.done()

    def join(self, timeout: float | None = None) -> None:
        concurrent.futures.wait([self.future], timeout)


class AsyncStreamManager(StreamManager):
    """Runs every started stream as a task on one event loop (see the module docstring).

    *source_factory* makes each stream's async source (called on the loop);
    *sync_source_factory* makes the sync source an initial sync copies through and the
    supervisor reads the oplog window from.
    """

    def __init__(
        self,
        registry: StreamRegistry | None = None,
        source_factory: Callable[[StreamSpec], Any] = async_pymongo_source,
        *,
        sync_source_factory: Callable[[StreamSpec], ChangeSource] = pymongo_source,
        instance_id: str | None = None,
        publish_status: bool = True,
    ) -> None:
        super().__init__(
            registry,
            sync_source_factory,
            instance_id=instance_id,
            publish_status=publish_status,
        )
        self.async_source_factory = source_factory
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None

    # -- the loop ----------------------------------------------------------------------

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The manager's event loop, on its thread (started on first use)."""
        with self._lock:
            thread = self._loop_thread
            if thread is None or not thread.is_alive():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="fw-streams-loop", daemon=False
                )
                self._loop, self._loop_thread = loop, thread
                thread.start()
            assert self._loop is not None
            return self._loop

    def _new_consumer(  # type: ignore[override]
        self, spec: StreamSpec, store: CheckpointStore, lease_valid: Callable[[], bool] | None
    ) -> AsyncStreamConsumer:
        return AsyncStreamConsumer(
            spec,
            store,
            self.async_source_factory,
            lease_valid=lease_valid,
            copy_source_factory=self.source_factory,
        )

    def _start_consumer(  # type: ignore[override]
        self, consumer: AsyncStreamConsumer, burst: bool
    ) -> _LoopTask:
        """Schedule *consumer* on the manager's loop."""
        loop = self._running_loop()
        return _LoopTask(asyncio.run_coroutine_threadsafe(self._consume(consumer, burst), loop))

    @staticmethod
    async def _consume(consumer: AsyncStreamConsumer, burst: bool) -> None:
        try:
            await consumer.run(burst=burst)
        except Exception:  # terminal: state is CRASHED and last_error says why
            logger.debug("stream %r ended", consumer.spec.name, exc_info=True)

    def stop_all(self, timeout: float | None = 30) -> None:
        """Stop every stream (as the base class), then the loop and its MongoDB clients."""
        super().stop_all(timeout)
        if any(task.is_alive() for task in list(self._threads.values())):
            return  # timeout=0 (a signal handler): the loop ends with the last stop_all
        with self._lock:
            loop, thread = self._loop, self._loop_thread
            self._loop = self._loop_thread = None
        if loop is None or thread is None or not thread.is_alive():
            return
        closing = asyncio.run_coroutine_threadsafe(async_mongo_clients.aclose(), loop)
        try:
            closing.result(timeout=10)
        except Exception:
            logger.debug("closing the async MongoDB clients failed", exc_info=True)
        # The loop's default executor (blocking store calls) ends with it: its threads
        # are not daemons.
        ending = asyncio.run_coroutine_threadsafe(loop.shutdown_default_executor(), loop)
        try:
            ending.result(timeout=timeout)
        except Exception:
            logger.debug("ending the loop's executor failed", exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()


def new_stream_manager(runner: str | None = None, **options: Any) -> StreamManager:
    """A ``StreamManager`` for *runner* (``"threads"`` or ``"asyncio"``), by default
    ``FLOWWARDEN["STREAM_RUNNER"]``; *options* go to its constructor."""
    runner = runner or fw_settings.STREAM_RUNNER
    if runner == "asyncio":
        return AsyncStreamManager(**options)
    if runner == "threads":
        return StreamManager(**options)
    raise ValueError(f'FLOWWARDEN["STREAM_RUNNER"] must be one of {STREAM_RUNNERS}, not {runner!r}')
