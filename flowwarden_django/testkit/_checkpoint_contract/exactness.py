"""The checkpoint contract: what the reference suite lacked."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from ...streams.checkpoint import Checkpoint, CheckpointStore
from .values import now_ms, same_bson, token, write_every_anchor


class ExactnessContract:
    """What the reference suite lacked: partial writes keep ``instance_id`` and
    ``metadata``, tokens round-trip as exact BSON, exact names, UTC timestamps, bad
    input refused, and the listing.

    Mixed into :class:`~flowwarden_django.testkit.CheckpointStoreContract`, which gives
    the ``store`` and ``name`` fixtures.
    """

    def test_partial_writes_keep_instance_id_and_metadata(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        metadata = {"env": "test", "nested": {"n": 3, "tags": ["a", "b"]}}
        store.save(Checkpoint(name, "pod-a", None, None, None, None, None, metadata))
        write_every_anchor(store, name, now)
        store.reset_after_history_lost(name, None, token("p2"), now)
        found = store.find(name)
        assert found.instance_id == "pod-a"
        assert dict(found.metadata) == metadata

    def test_tokens_round_trip_exactly_as_bson(self, store: CheckpointStore, name: str) -> None:
        bson = pytest.importorskip("bson")
        from bson import Binary, Int64, Timestamp

        original = {
            "_data": "8263A1B2C3000000012B022C0100296E5A1004",
            "raw": Binary(b"\x00\x01\xfe\xff", 0),
            "uuid": Binary(uuid.UUID(int=7).bytes, 4),
            "clusterTime": Timestamp(1_700_000_000, 42),
            "big": Int64(2**40),
            "small": 7,
            "float": 1.5,
            "flag": True,
            "nothing": None,
            "nested": {"list": [1, Int64(-(2**62)), {"deep": Binary(b"z", 5)}], "s": "é"},
        }
        expected = bson.decode(bson.encode(original))
        now = now_ms()
        store.save_processed(name, original, now)
        store.save_seen(name, original, now)
        found = store.find(name)
        same_bson(found.last_processed_token, expected, "last_processed_token")
        same_bson(found.last_seen_token, expected, "last_seen_token")
        store.save(Checkpoint(name, None, original, now, original, now))
        same_bson(store.find(name).last_processed_token, expected, "saved token")

    def test_reset_guard_compares_tokens_exactly(self, store: CheckpointStore, name: str) -> None:
        pytest.importorskip("bson")
        from bson import Binary, Int64, Timestamp

        now = now_ms()

        stored = {
            "_data": "82AA",
            "ts": Timestamp(10, 1),
            "bin": Binary(b"\x01\x02", 5),
            "n": Int64(5),
        }
        near_misses = [
            {**stored, "_data": "82aa"},
            {**stored, "ts": Timestamp(10, 2)},
            {**stored, "bin": Binary(b"\x01\x03", 5)},
            {**stored, "bin": Binary(b"\x01\x02", 0)},
            {**stored, "n": 5},
            {**stored, "n": 5.0},
            {"ts": Timestamp(10, 1), "_data": "82AA", "bin": Binary(b"\x01\x02", 5), "n": Int64(5)},
            {"_data": "82AA", "ts": Timestamp(10, 1), "bin": Binary(b"\x01\x02", 5)},
        ]
        store.save_processed(name, stored, now)
        for miss in near_misses:
            store.reset_after_history_lost(name, token("fresh"), miss, now)
            assert store.find(name).last_processed_token is not None, f"{miss} matched {stored}"
        store.reset_after_history_lost(name, token("fresh"), dict(stored), now)
        assert store.find(name).last_processed_token is None

    def test_rejects_bad_input(self, store: CheckpointStore, name: str) -> None:
        naive = datetime(2026, 1, 1)
        now = now_ms()
        with pytest.raises(TypeError):
            store.save_seen(name, ["not", "a", "document"], now)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            store.save_processed(name, token("p"), naive)
        with pytest.raises(ValueError):
            store.save_heartbeat(name, naive)
        with pytest.raises(TypeError):
            store.save_heartbeat(name, None)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.reset_after_history_lost(name, token("f"), None, None)  # type: ignore[arg-type]
        for bad_name in ("", "x" * 256, 5):
            with pytest.raises(ValueError):
                store.save_processed(bad_name, token("p"), now)  # type: ignore[arg-type]
        assert store.find(name) is None, "a rejected write must not create the record"

    def test_stream_names_are_exact(self, store: CheckpointStore, name: str) -> None:
        """Names differing only in case or a trailing space are different streams."""
        now = now_ms()
        names = [name, name.upper(), name + " "]
        for index, stream in enumerate(names):
            store.save_processed(stream, token(f"p{index}"), now)
        for index, stream in enumerate(names):
            found = store.find(stream)
            assert found.stream_name == stream
            assert found.last_processed_token == token(f"p{index}")
        longest = "n" * 255
        store.save_seen(longest, token("s"), now)
        assert store.find(longest).stream_name == longest
        store.delete(longest)

    def test_timestamps_come_back_in_utc(self, store: CheckpointStore, name: str) -> None:
        """Whatever zone goes in, UTC comes out, to at least millisecond precision."""
        paris = timezone(timedelta(hours=2))
        at = datetime(2026, 6, 1, 12, 30, 15, 123456, tzinfo=paris)
        store.save_processed(name, token("p"), at, at)
        store.save_seen(name, token("s"), at)
        found = store.find(name)
        for value in (found.last_processed_at, found.last_heartbeat_at, found.last_seen_at):
            assert value.utcoffset() == timedelta(0)
            assert timedelta(0) <= at - value < timedelta(milliseconds=1)

    def test_list_checkpoints(self, store: CheckpointStore, name: str) -> None:
        if not store.supports_listing:
            pytest.skip(f"{type(store).__name__} does not support listing")
        now = now_ms()
        store.save_processed(f"{name}-b", token("b"), now)
        store.save_seen(f"{name}-a", token("a"), now)
        listed = [cp for cp in store.list_checkpoints() if cp.stream_name.startswith(name)]
        assert [cp.stream_name for cp in listed] == [f"{name}-a", f"{name}-b"]
        assert listed[0].last_seen_token == token("a")
        assert listed[1].last_processed_token == token("b")
