"""Stream managers and consumers of either runner over a ``FakeOplog``, so one test
runs against both the threaded and the asyncio runtime."""

import asyncio

from flowwarden_django.streams.async_source import async_mongo_clients, async_pymongo_source
from flowwarden_django.streams.clients import pymongo_source
from flowwarden_django.streams.runtime import StreamConsumer
from flowwarden_django.streams.runtime.async_manager import AsyncStreamManager
from flowwarden_django.streams.runtime.event_loop import AsyncStreamConsumer
from flowwarden_django.streams.runtime.manager import StreamManager
from flowwarden_django.testkit.fake_source import AsyncFakeChangeSource, FakeChangeSource

RUNNERS = ("threads", "asyncio")


def new_manager(runner, oplog, **options):
    """A manager of *runner* (``"threads"`` or ``"asyncio"``) whose streams read *oplog*."""
    if runner == "asyncio":
        return AsyncStreamManager(
            source_factory=lambda spec: AsyncFakeChangeSource(oplog),
            sync_source_factory=lambda spec: FakeChangeSource(oplog),
            **options,
        )
    return StreamManager(source_factory=lambda spec: FakeChangeSource(oplog), **options)


class BlockingAsyncConsumer(AsyncStreamConsumer):
    """``AsyncStreamConsumer`` driven like ``StreamConsumer``: made from a sync source
    factory (read through ``AsyncFakeChangeSource``; copies use the sync source) and
    ``run()`` blocks, on an event loop of its own."""

    def __init__(self, spec, store, source_factory, **options):
        super().__init__(
            spec, store, _async_view(source_factory), copy_source_factory=source_factory, **options
        )

    def run(self, *, burst=False):
        async def main():
            try:
                await AsyncStreamConsumer.run(self, burst=burst)
            finally:
                await async_mongo_clients.aclose()

        asyncio.run(main())


def _async_view(source_factory):
    """The async source factory reading what *source_factory* reads: the stream's
    ``AsyncMongoClient`` for the production pymongo source, else a fake's async view."""
    if source_factory is pymongo_source:
        return async_pymongo_source
    return lambda spec: AsyncFakeChangeSource.wrapping(source_factory(spec))


def consumer_class(runner):
    """The consumer class of *runner*, both made and run the same way."""
    return BlockingAsyncConsumer if runner == "asyncio" else StreamConsumer
