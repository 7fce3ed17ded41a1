"""One Temporal client per process, used from synchronous Django code.

The SDK is asyncio-only; Django views, ``Workflow.run()`` and management commands are
not. ``TemporalConnection`` keeps an event loop on a daemon thread, connects on first
use (reconnecting after a failure) and runs each call there with a timeout.

Every client the package opens (here, and the worker's) comes from
:func:`open_client`: its gRPC connection pings the server when it has heard nothing
for a while (``common.network.grpc_keepalive``, from
``FLOWWARDEN["DEAD_CONNECTION_TIMEOUT"]``), so a silent partition closes it within
that bound instead of leaving calls and polls waiting on a dead connection.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ...common.network import grpc_keepalive
from .config import TemporalConfig

T = TypeVar("T")


def keep_alive_config(bound: float | None = None) -> Any:
    """The SDK's ``KeepAliveConfig`` for *bound* seconds (``DEAD_CONNECTION_TIMEOUT``
    by default)."""
    from temporalio.client import KeepAliveConfig

    timings = grpc_keepalive(bound)
    return KeepAliveConfig(interval_millis=timings.interval_ms, timeout_millis=timings.timeout_ms)


def open_client(config: TemporalConfig) -> Awaitable[Any]:
    """``Client.connect`` to the configured server and namespace, with keepalives
    within ``DEAD_CONNECTION_TIMEOUT`` (no timeout of its own: the caller's)."""
    from temporalio.client import Client

    return Client.connect(
        config.target, namespace=config.namespace, keep_alive_config=keep_alive_config()
    )


class TemporalConnection:
    """A lazily connected ``temporalio.client.Client`` and the loop it lives on."""

    def __init__(self, config: TemporalConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="flowwarden-temporal", daemon=True
                )
                thread.start()
                self._loop = loop
            return self._loop

    async def _connected(self) -> Any:
        if self._client is None:
            self._client = await asyncio.wait_for(
                open_client(self.config), self.config.connect_timeout
            )
        return self._client

    def call(self, operation: Callable[[Any], Awaitable[T]], timeout: float | None = None) -> T:
        """Run ``operation(client)`` on the connection's loop; its result, or its error."""

        async def run() -> T:
            client = await self._connected()
            return await operation(client)

        future = asyncio.run_coroutine_threadsafe(run(), self._ensure_loop())
        try:
            return future.result(timeout if timeout is not None else self.config.call_timeout)
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        """Stop the loop (the client goes with it); the next call starts afresh."""
        with self._lock:
            loop, self._loop, self._client = self._loop, None, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
