"""The public twins made from an SPI's sync signature (``streams/_twins.py``): they
carry the SPI's signature, take their arguments as the SPI method would, and the
thread twin runs the instance's own sync method."""

from __future__ import annotations

import asyncio
import inspect
from datetime import UTC, datetime

import pytest

from flowwarden_django.streams.backends._native_dlq import NativeDlqStore
from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.streams.checkpoint import CheckpointStore
from flowwarden_django.streams.dlq import PENDING, DlqStore

AT = datetime(2026, 1, 1, tzinfo=UTC)


class RecordingDlqStore(NativeDlqStore):
    """Runs each operation as a plain call and records what the operation was given."""

    def __init__(self) -> None:
        self.given: list[tuple[object, ...]] = []

    def _run(self, operation):
        return operation

    async def _arun(self, operation, default, /, *args, **kwargs):
        return operation

    def _transition_operation(self, *args):
        self.given.append(args)
        return True


def test_the_twins_carry_the_spi_signature():
    for name in ("transition", "atransition"):
        generated = inspect.signature(getattr(NativeDlqStore, name))
        assert generated == inspect.signature(DlqStore.transition), name
    assert inspect.iscoroutinefunction(NativeDlqStore.atransition)
    assert inspect.iscoroutinefunction(CheckpointStore.asave_seen)
    assert CheckpointStore.asave_seen.__name__ == "asave_seen"


def test_an_operation_gets_every_parameter_in_order_defaults_applied():
    store = RecordingDlqStore()
    assert store.transition("e1", "REPLAYING", at=AT)
    assert asyncio.run(store.atransition("e1", "ACKNOWLEDGED", at=AT, by="ops", note="n"))
    assert store.given == [
        ("e1", "REPLAYING", (PENDING,), AT, "", ""),
        ("e1", "ACKNOWLEDGED", (PENDING,), AT, "ops", "n"),
    ]


def test_keyword_only_parameters_are_refused_positionally():
    store = RecordingDlqStore()
    with pytest.raises(TypeError):
        store.transition("e1", "REPLAYING", (PENDING,), AT, "", "")
    assert store.given == []


def test_the_thread_twin_runs_the_instances_override():
    calls = []

    class Counting(InMemoryCheckpointStore):
        def save_heartbeat(self, stream_name, at):
            calls.append(stream_name)
            super().save_heartbeat(stream_name, at)

    store = Counting()
    asyncio.run(store.asave_heartbeat("s", AT))
    assert calls == ["s"]
    assert store.find("s").last_heartbeat_at == AT
