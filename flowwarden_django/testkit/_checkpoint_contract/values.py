"""The values the checkpoint contract writes (timestamps at the stores' precision,
resume tokens, initial-sync progress) and its exact-equality assertions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ...streams.checkpoint import CheckpointStore


def now_ms() -> datetime:
    """The current UTC time truncated to milliseconds, the precision every store keeps."""
    moment = datetime.now(UTC)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def token(label: str) -> dict[str, str]:
    """A resume token shaped like the server's."""
    return {"_data": label}


def write_every_anchor(store: CheckpointStore, name: str, now: datetime) -> None:
    """Each anchor write, with and without a heartbeat, at *now*, then a heartbeat and
    a reset whose guard misses (it expects a processed token that is not there)."""
    store.save_seen(name, token("s1"), now)
    store.save_seen(name, token("s2"), now, now)
    store.save_processed(name, token("p1"), now)
    store.save_processed(name, token("p2"), now, now)
    store.save_heartbeat(name, now)
    store.reset_after_history_lost(name, token("fresh"), token("other"), now)


def sync_progress(batch: int, **changes: Any) -> dict[str, Any]:
    """An initial-sync progress mapping shaped like the runtime's."""
    return {
        "phase": "copying",
        "batch": batch,
        "last_id": '{"$oid": "65a1b2c3d4e5f60718293a4b"}',
        "copied": batch * 1000,
        "estimated": 50000,
        "started_at": "2026-06-01T12:30:15.123000+00:00",
        **changes,
    }


def _same(actual: Any, expected: Any, path: str, *, ordered: bool) -> None:
    """Assert equal values with identical types, recursively; with *ordered*, dict
    keys in the same order too."""
    assert type(actual) is type(expected), (
        f"{path}: type {type(actual).__name__}, expected {type(expected).__name__}"
    )
    if isinstance(expected, dict):
        keys, wanted = (list(actual), list(expected)) if ordered else (set(actual), set(expected))
        assert keys == wanted, f"{path}: keys {keys} != {wanted}"
        for key in expected:
            _same(actual[key], expected[key], f"{path}.{key}", ordered=ordered)
    elif isinstance(expected, list):
        assert len(actual) == len(expected), f"{path}: length differs"
        for index, (left, right) in enumerate(zip(actual, expected, strict=True)):
            _same(left, right, f"{path}[{index}]", ordered=ordered)
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def same_json(actual: Any, expected: Any, path: str = "initial_sync") -> None:
    """Equal JSON values with identical types; key order is free (PostgreSQL's jsonb
    reorders keys)."""
    _same(actual, expected, path, ordered=False)


def same_bson(actual: Any, expected: Any, path: str = "token") -> None:
    """Equal BSON values with identical types and key order (tokens compare exactly)."""
    _same(actual, expected, path, ordered=True)
