"""Exactly-once effects for a transactional stream handled in parallel.

A transactional stream commits each event's effects with its anchor. Handled in
parallel, an event may commit while an earlier one is still running: the processed
anchor (the low watermark) cannot pass it yet. So its transaction records a
**settled mark** instead (``StreamSettledEvent``, the ORM checkpoint store's table,
on the same database), and the write that later moves the anchor past it deletes the
mark in the same transaction (``MarkedAnchorPolicy``). A restart finds the marks of
the events it is about to deliver again and skips them (``SettledMarks``): their
effects are committed, so none is applied twice, whatever the crash.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from ...common.connections import discard_unusable_connections
from ..core.anchors import At, resolve_at
from ..tokens import token_digest
from .policy import ProcessedAnchorPolicy


class SettledMarks:
    """The settled marks of one stream: what the generation found, and new ones."""

    def __init__(self, store: Any, stream_name: str, found: set[str] | None = None) -> None:
        self.store = store
        self.stream_name = stream_name
        #: The events marked settled before this generation began (by digest); read
        #: now unless given (an event loop reads them on a thread first).
        self.found: set[str] = store.settled_marks(stream_name) if found is None else found

    def mark(self, token: Mapping[str, Any]) -> None:
        """Mark the event of *token* settled, in the caller's transaction."""
        self.store.mark_settled(self.stream_name, token_digest(token))

    def committed(self, token: Mapping[str, Any]) -> bool:
        """Whether the event of *token* is marked settled now (a database read)."""
        return self.store.is_settled(self.stream_name, token_digest(token))

    def settled_before(self, token: Mapping[str, Any]) -> bool:
        """Whether the event of *token* committed in an earlier generation."""
        return bool(self.found) and token_digest(token) in self.found


class MarkedAnchorPolicy(ProcessedAnchorPolicy):
    """The anchor policy of a transactional stream handled in parallel: each write
    moves the processed anchor and deletes the marks of the events it passed, in one
    transaction on *using* (the stream's ``transaction_using``)."""

    def __init__(self, store: Any, stream_name: str, *, using: str, **options: Any) -> None:
        super().__init__(store, stream_name, **options)
        self.using = using
        #: Where the marks are (the ORM store under the consumer's observed wrapper).
        self.marks_store = getattr(store, "inner", store)
        self._passed: list[str] = []

    def on_settled(self, token: Mapping[str, Any], at: At, *, strict: bool = False) -> None:
        """Record an event the watermark passed (its mark goes with the next write)."""
        with self._lock:
            self._passed.append(token_digest(token))
            if self._settled(token, at, False):
                self._persist()

    def _persist(self, *, strict: bool = False, force: bool = False) -> bool:
        written = self._to_write(force=strict or force)
        if written is None:
            return False
        try:
            with transaction.atomic(using=self.using):
                self.store.save_processed(
                    self.stream_name,
                    written[0],
                    resolve_at(written[1]),
                    heartbeat_at=timezone.now(),
                )
                if self._passed:
                    self.marks_store.forget_settled(self.stream_name, self._passed)
        except Exception as exc:
            self._write_failed(exc, strict=False)
            if not connections[self.using].in_atomic_block:
                discard_unusable_connections()
            return False
        self._passed = []
        self._written(written)
        return True


def anchor_policy_class(spec: Any) -> Callable[..., ProcessedAnchorPolicy]:
    """The sync anchor policy of *spec*'s generations: ``MarkedAnchorPolicy`` (bound
    to its transaction database) for a transactional stream handled in parallel."""
    if not (spec.transactional and spec.windowed):
        return ProcessedAnchorPolicy

    def make(store: Any, stream_name: str, **options: Any) -> MarkedAnchorPolicy:
        return MarkedAnchorPolicy(store, stream_name, using=spec.transaction_using, **options)

    return make
