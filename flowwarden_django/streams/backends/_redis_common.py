"""The Redis connection every Redis backend shares: one lazily opened client, and
one ``redis.asyncio`` client per running event loop for the native async API."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from django.conf import settings
from django.core import checks

from ...common.network import redis_options
from ..async_source import close_at_loop_end
from ._calls import Call
from ._extras import missing_extra

# -- the requests of a store operation (see ``_calls``) besides a plain ``Call`` ------


@dataclasses.dataclass(frozen=True, slots=True)
class Pipeline:
    """The *calls* in one pipeline (a ``MULTI`` when *transaction*); gives their results."""

    calls: tuple[Call, ...]
    transaction: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class Script:
    """The Lua script *source* on *keys* and *args*; gives its result."""

    source: str
    keys: list[str]
    args: list[Any] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class ScanKeys:
    """Every key ``SCAN`` finds matching the glob *match*, as a list."""

    match: str
    count: int = 500


Request = Call | Pipeline | Script | ScanKeys


def perform(connection: RedisConnection, request: Request) -> Any:
    """Make *request* on the connection's redis-py client."""
    client = connection.client
    if isinstance(request, Call):
        return request.on(client)
    if isinstance(request, Pipeline):
        with client.pipeline(transaction=request.transaction) as pipe:
            for queued in request.calls:
                queued.on(pipe)
            return pipe.execute()
    if isinstance(request, Script):
        return connection.sync_script(request.source)(keys=request.keys, args=request.args)
    return list(client.scan_iter(match=request.match, count=request.count))


async def aperform(loop_client: LoopClient, request: Request) -> Any:
    """Make *request* on one event loop's ``redis.asyncio`` client."""
    client = loop_client.client
    if isinstance(request, Call):
        return await request.on(client)
    if isinstance(request, Pipeline):
        async with client.pipeline(transaction=request.transaction) as pipe:
            for queued in request.calls:
                queued.on(pipe)
            return await pipe.execute()
    if isinstance(request, Script):
        return await loop_client.script(request.source)(keys=request.keys, args=request.args)
    return [key async for key in client.scan_iter(match=request.match, count=request.count)]


class RedisConnection:
    """One redis-py client, from a django-redis cache alias (``cache``, ``"default"``
    when nothing is given), a ``url``, or a ready ``client``; connected on first use.
    A client made from a ``url`` gets the timeouts and keepalives of
    ``DEAD_CONNECTION_TIMEOUT`` (``common/network.py``); a cache's or a given client is
    configured by its owner.

    The options and their meaning are those of ``RedisCheckpointStore``.
    """

    def __init__(self, cache: str | None = None, url: str | None = None, client: Any = None):
        if sum(x is not None for x in (cache, url, client)) > 1:
            raise TypeError("give only one of cache, url and client")
        self.cache = cache if (url is None and client is None) else None
        self.url = url
        self._client = client
        self._owns_client = False
        self._lock = threading.Lock()
        self._async_lock = threading.Lock()
        self._async_factory: Callable[[], Any] | bool | None = False  # False: not derived yet
        self._sync_scripts: dict[str, Any] = {}
        self._async_clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[LoopClient, AsyncIterator[None]]
        ] = weakref.WeakKeyDictionary()

    @property
    def client(self) -> Any:
        """The redis-py client."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._connect()
        return self._client

    def _connect(self) -> Any:
        if self.url is not None:
            import redis

            self._owns_client = True
            # Options in the URL's query (?socket_timeout=5) win over these.
            return redis.Redis.from_url(self.url, **redis_options())
        from django_redis import get_redis_connection

        return get_redis_connection(self.cache or "default")

    def close(self) -> None:
        """Close a client this object opened (a cache's or a given one stays open), and
        let go of the async clients: each is closed on its own loop if that still runs."""
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None
        self._sync_scripts.clear()
        with self._async_lock:
            self._async_clients.clear()

    def sync_script(self, source: str) -> Any:
        """*source* registered on :attr:`client` (once; ``Redis.register_script``)."""
        script = self._sync_scripts.get(source)
        if script is None:
            client = self.client  # connected outside the lock, which connecting takes
            with self._lock:
                script = self._sync_scripts.get(source)
                if script is None:
                    script = self._sync_scripts[source] = client.register_script(source)
        return script

    def _perform(self, request: Request) -> Any:
        """Make one request of a store operation (see ``_calls``) on :attr:`client`."""
        return perform(self, request)

    async def _async_performer(self) -> Callable[[Request], Awaitable[Any]] | None:
        """What makes a request on :meth:`async_client`, or ``None`` without one."""
        loop_client = await self.async_client()
        return None if loop_client is None else functools.partial(aperform, loop_client)

    # -- the native async API ------------------------------------------------------

    async def async_client(self) -> LoopClient | None:
        """The ``redis.asyncio`` client of the running event loop (made on first use),
        or ``None`` when the sync client's configuration cannot be mirrored faithfully:
        the caller then falls back to the default (the sync operation in a thread).

        A ``redis.asyncio`` connection belongs to the loop that opened it, so each
        loop gets its own client; it is closed when that loop shuts its async
        generators down (``asyncio.run`` and ``async_to_sync`` do, on exit).
        """
        loop = asyncio.get_running_loop()
        with self._async_lock:
            held = self._async_clients.get(loop)
        if held is not None:
            return held[0]
        factory = self._async_client_factory()
        if factory is None:
            return None
        entry = LoopClient(factory())
        # The closer refers to the entry, not the other way round: dropping the dict's
        # pair (``close``) finalizes the closer at once, which closes the client on its
        # loop.
        closer = close_at_loop_end(
            self._async_lock,
            self._async_clients,
            loop,
            entry,
            lambda: entry.client.aclose(close_connection_pool=True),
        )
        with self._async_lock:
            self._async_clients[loop] = (entry, closer)
        await closer.__anext__()
        return entry

    def _async_client_factory(self) -> Callable[[], Any] | None:
        if self._async_factory is False:
            self._async_factory = self._derive_async_factory()
        return self._async_factory  # type: ignore[return-value]

    def _derive_async_factory(self) -> Callable[[], Any] | None:
        import redis.asyncio

        if self.url is not None:
            url = self.url
            options = redis_options()
            return lambda: redis.asyncio.Redis.from_url(url, **options)
        return async_factory_like(self.client)


class LoopClient:
    """The ``redis.asyncio`` client of one event loop, with its registered scripts."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._scripts: dict[str, Any] = {}

    def script(self, source: str) -> Any:
        """*source* registered on this client (``redis.asyncio.Redis.register_script``)."""
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self.client.register_script(source)
        return script


# Connection settings the sync pool keeps for its own bookkeeping, which an async
# pool makes for itself; and the sync parser (the async client picks its own for the
# same protocol).
_POOL_INTERNALS = frozenset(
    {
        "himport_registry",
        "maint_notifications_config",
        "maint_notifications_pool_handler",
        "orig_host_address",
        "orig_socket_timeout",
        "orig_socket_connect_timeout",
        "event_dispatcher",
        "parser_class",
    }
)
# Settings holding sync-only objects: given one, the async client is not derived.
_SYNC_ONLY = frozenset({"redis_connect_func", "connection_pool_class"})


def _init_parameters(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            names.update(inspect.signature(init).parameters)
    return names - {"self", "args", "kwargs"}


def async_factory_like(client: Any) -> Callable[[], Any] | None:
    """A maker of ``redis.asyncio`` clients connecting as the sync *client* does, from
    its pool's ``connection_kwargs``; ``None`` when that cannot be done faithfully (not
    a plain TCP, TLS or Unix-socket pool, or a setting with no async equivalent).
    A ``redis.retry.Retry`` becomes a ``redis.asyncio.retry.Retry`` with the same
    backoff, retries and errors; any other retry policy is not mirrored."""
    import redis
    import redis.asyncio
    import redis.asyncio.retry
    import redis.retry

    pool = getattr(client, "connection_pool", None)
    if type(pool) is not redis.ConnectionPool:
        return None
    classes = {
        redis.Connection: redis.asyncio.Connection,
        redis.SSLConnection: redis.asyncio.SSLConnection,
        redis.UnixDomainSocketConnection: redis.asyncio.UnixDomainSocketConnection,
    }
    connection_class = classes.get(pool.connection_class)
    if connection_class is None:
        return None
    accepted = _init_parameters(connection_class)
    kwargs: dict[str, Any] = {}
    for name, value in pool.connection_kwargs.items():
        if name in _POOL_INTERNALS:
            continue
        if name == "retry" and type(value) is redis.retry.Retry:
            value = redis.asyncio.retry.Retry(
                value._backoff, value._retries, value._supported_errors
            )
        if name in _SYNC_ONLY or name not in accepted:
            if value is None:
                continue
            return None
        kwargs[name] = value
    max_connections = pool.max_connections

    def make() -> Any:
        async_pool = redis.asyncio.ConnectionPool(
            connection_class=connection_class, max_connections=max_connections, **kwargs
        )
        return redis.asyncio.Redis(connection_pool=async_pool)

    return make


def redis_option_checks(
    alias_setting: str, backend: str, options: Mapping[str, Any]
) -> list[checks.CheckMessage]:
    """The option checks of every Redis backend (*alias_setting*: the setting path of
    its alias): the extra is installed, and the cache alias (unless a ``url`` or
    ``client`` is given) is a django-redis cache."""
    error = missing_extra(alias_setting, "redis", "redis", backend)
    if error is not None:
        return [error]
    if options.get("url") is not None or options.get("client") is not None:
        return []
    cache = options.get("cache") or "default"
    setting = f'{alias_setting}["OPTIONS"]["cache"]'
    error = missing_extra(alias_setting, "django_redis", "redis", backend)
    if error is not None:
        return [error]
    if cache not in settings.CACHES:
        return [
            checks.Error(
                f"{setting} = {cache!r} is not a cache alias in CACHES.",
                hint="Name a django-redis cache alias, or give OPTIONS "
                '{"url": "redis://host:6379/0"} instead.',
                id="flowwarden_django.E006",
            )
        ]
    cache_backend = settings.CACHES[cache].get("BACKEND", "")
    if not cache_backend.startswith("django_redis."):
        return [
            checks.Error(
                f"{setting} = {cache!r} is a {cache_backend} cache, not a django-redis one.",
                hint='Point CACHES[...]["BACKEND"] at "django_redis.cache.RedisCache", or give '
                'OPTIONS {"url": "redis://host:6379/0"} instead.',
                id="flowwarden_django.E008",
            )
        ]
    return []


class PrefixedRedisConnection(RedisConnection):
    """A :class:`RedisConnection` whose keys all start with ``key_prefix``: the
    constructor of the Redis lock service and dead-letter store."""

    def __init__(
        self,
        url: str | None = None,
        cache: str | None = None,
        key_prefix: str = "fw:",
        client: Any = None,
    ) -> None:
        RedisConnection.__init__(self, cache=cache, url=url, client=client)
        self.key_prefix = key_prefix
