"""The Redis connection every Redis backend shares: one lazily opened client."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core import checks

from ..stores import store_setting
from ._extras import missing_extra


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


def check_connection_options(
    cls: type, alias: str, options: Mapping[str, Any]
) -> list[checks.CheckMessage]:
    """The option checks of every Redis backend: the extra is installed, and the cache alias
    (unless a ``url`` or ``client`` is given) is a django-redis cache."""
    error = missing_extra(alias, "redis", "redis", cls.__name__)
    if error is not None:
        return [error]
    if options.get("url") is not None or options.get("client") is not None:
        return []
    cache = options.get("cache") or "default"
    setting = f'{store_setting(alias)}["OPTIONS"]["cache"]'
    error = missing_extra(alias, "django_redis", "redis", cls.__name__)
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
    backend = settings.CACHES[cache].get("BACKEND", "")
    if not backend.startswith("django_redis."):
        return [
            checks.Error(
                f"{setting} = {cache!r} is a {backend} cache, not a django-redis one.",
                hint='Point CACHES[...]["BACKEND"] at "django_redis.cache.RedisCache", or give '
                'OPTIONS {"url": "redis://host:6379/0"} instead.',
                id="flowwarden_django.E008",
            )
        ]
    return []
