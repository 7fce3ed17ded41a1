"""Fixtures of the admin tests."""

import pytest

from flowwarden_django.streams.registry import register_stream, stream_registry


@pytest.fixture
def declare():
    names = []

    def declare(name, **options):
        names.append(name)
        return register_stream(name, "orders", on_insert=lambda doc: None, **options)

    yield declare
    for name in names:
        stream_registry.unregister(name)
