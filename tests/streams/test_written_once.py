"""Each Redis and MongoDB store operation is written once for both APIs
(docs/development.md, "Sync and async written once"): the public sync and async
methods come from the native bases, and a backend class adds only its store
operations, so a hand-written twin that could drift from its sibling fails here."""

from __future__ import annotations

import inspect

import pytest

from flowwarden_django.streams.backends._native_checkpoint import NativeCheckpointStore
from flowwarden_django.streams.backends._native_dlq import NativeDlqStore
from flowwarden_django.streams.backends._native_locks import NativeLockService
from flowwarden_django.streams.backends.mongo import (
    MongoCheckpointStore,
    MongoDlqStore,
    MongoLockService,
)
from flowwarden_django.streams.backends.redis import (
    RedisCheckpointStore,
    RedisDlqStore,
    RedisLockService,
)
from flowwarden_django.streams.checkpoint import CheckpointStore
from flowwarden_django.streams.dlq import DlqStore
from flowwarden_django.streams.locks import LockService

BACKENDS = [
    (RedisCheckpointStore, NativeCheckpointStore, CheckpointStore),
    (MongoCheckpointStore, NativeCheckpointStore, CheckpointStore),
    (RedisDlqStore, NativeDlqStore, DlqStore),
    (MongoDlqStore, NativeDlqStore, DlqStore),
    (RedisLockService, NativeLockService, LockService),
    (MongoLockService, NativeLockService, LockService),
]


def twins(spi: type) -> list[tuple[str, str]]:
    """The (sync, async) method pairs of an SPI: ``x`` and ``ax``."""
    names = {name for name, _ in inspect.getmembers(spi, inspect.isfunction)}
    return sorted(
        (name, f"a{name}")
        for name in names
        if not name.startswith("_") and f"a{name}" in names and name not in {"close", "guard"}
    )


@pytest.mark.parametrize(("backend", "native", "spi"), BACKENDS, ids=lambda c: c.__name__)
def test_the_backend_writes_neither_twin(backend: type, native: type, spi: type) -> None:
    pairs = twins(spi)
    assert len(pairs) >= 5
    for sync_name, async_name in pairs:
        assert sync_name not in vars(backend), f"{backend.__name__}.{sync_name}"
        assert async_name not in vars(backend), f"{backend.__name__}.{async_name}"
        assert getattr(backend, sync_name) is getattr(native, sync_name), sync_name
        assert getattr(backend, async_name) is getattr(native, async_name), async_name
        assert inspect.iscoroutinefunction(getattr(backend, async_name)), async_name


@pytest.mark.parametrize(("backend", "native", "spi"), BACKENDS, ids=lambda c: c.__name__)
def test_the_backend_supplies_every_operation(backend: type, native: type, spi: type) -> None:
    operations = [f"_{name}_operation" for name in spi._thread_twinned]
    assert operations
    for name in operations:
        assert callable(getattr(backend, name, None)), f"{backend.__name__}.{name}"
