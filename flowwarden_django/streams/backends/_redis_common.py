"""The Redis connection every Redis backend shares: one lazily opened client."""

from __future__ import annotations

import threading
from typing import Any


class RedisConnection:
    """One redis-py client, from a django-redis cache alias (``cache``, ``"default"``
    when nothing is given), a ``url``, or a ready ``client``; connected on first use.

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
            return redis.Redis.from_url(self.url)
        from django_redis import get_redis_connection

        return get_redis_connection(self.cache or "default")

    def close(self) -> None:
        """Close a client this object opened (a cache's or a given one stays open)."""
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None
