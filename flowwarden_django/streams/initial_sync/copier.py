"""Initial sync: copy a collection's existing documents, then stream with no gap.

A stream declared ``@checkpoint(start_position="COPY_EXISTING")`` copies on its first
start (and ``on_history_lost="RESYNC"`` copies again when its history is lost):

1. the progress record is started (a conditional ``save_initial_sync``: it also
   claims the copy), then the change stream's current position is captured with
   ``source.initial_position()`` and persisted as the seen anchor, before the first
   document is read;
2. documents matching the pipeline's ``$match`` (see ``copy_filter``) are read in
   ``_id`` order, ``copy_batch_size`` at a time, each handed to the snapshot handler
   (``on_snapshot``, else ``on_insert``, else ``on_change``; ``ctx.operation_type``
   is ``"snapshot"``), and each batch ends with one conditional progress write
   (``expected_batch`` = the previous batch number). Transactional streams run a
   batch's handler calls and its progress write in one transaction; the others
   apply the retry policy, error handlers and dead-letter queue to each document;
3. the change stream then opens after the captured position, so every change made
   during the copy is delivered after it.

Delivery is at least once: a document changed during the copy can be copied in its
new version and then see its change event, and a non-transactional batch cut short
by a crash is copied again. Handlers must be idempotent (upserts and deletes by
``_id``). A restart during the copy continues after the last committed batch, with
the same captured position. A copy whose first batch was never committed starts
over with a fresh position (nothing was copied yet, so nothing can be missed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from .. import metrics
from ..checkpoint import Checkpoint, progress_batch
from ..context import ChangeContext
from .filter import copy_filter
from .progress import COPYING, DONE, HISTORY_LOST

if TYPE_CHECKING:
    from ..runtime.threaded import StreamConsumer
    from ..source import ChangeSource

logger = logging.getLogger("flowwarden_django.streams")


class InitialSyncConflictError(RuntimeError):
    """The progress record moved under this copier: another process copies this stream."""


class CopyInterrupted(Exception):
    """A stop was asked for during the copy: the consumer stops; the copy resumes after
    its last committed batch on the next start."""


def encode_id(value: Any) -> str:
    """An ``_id`` as canonical extended JSON text (``{"v": ...}``), as progress keeps it."""
    from bson import json_util  # pymongo is an optional extra: only a copy needs it

    return json_util.dumps({"v": value}, json_options=json_util.CANONICAL_JSON_OPTIONS)


def decode_id(text: str) -> Any:
    """The ``_id`` kept by :func:`encode_id`, with its BSON type."""
    from bson import json_util

    return json_util.loads(text, json_options=json_util.CANONICAL_JSON_OPTIONS)["v"]


def _iso(moment: datetime) -> str:
    return moment.isoformat()


class InitialSync:
    """One run of the copy, on the consumer's thread (see the module docstring)."""

    def __init__(self, consumer: StreamConsumer, source: ChangeSource) -> None:
        self.consumer = consumer
        self.source = source
        self.spec = consumer.spec
        self.name = consumer.spec.name
        self.store = consumer.store
        self.handler = self.spec.snapshot_handler()

    # -- the progress record ---------------------------------------------------------

    def _write(self, progress: Mapping[str, Any], expected: int | None) -> None:
        # The consumer's ObservedCheckpointStore forwards it inside the lease fence.
        if not self.store.save_initial_sync(self.name, progress, expected_batch=expected):
            raise InitialSyncConflictError(
                f"stream {self.name!r}: the initial-sync progress moved past batch "
                f"{expected} under this copier: another process is copying this stream; "
                "stopping this copy"
            )

    # -- the copy --------------------------------------------------------------------

    def run(self, saved: Checkpoint | None, reason: str) -> Mapping[str, Any]:
        """Copy (or finish copying); return the position to stream after."""
        stages = list(self.spec.pipeline()) if self.spec.pipeline is not None else []
        query = copy_filter(stages, self.name)
        progress = saved.initial_sync if saved is not None else None
        stored_batch = progress_batch(progress)
        resuming = progress is not None and progress.get("phase") == COPYING
        if (
            resuming
            and progress.get("last_id") is not None
            and saved is not None
            and saved.last_seen_token is not None
        ):
            state = dict(progress)
            position: Mapping[str, Any] = saved.last_seen_token
            after_id = decode_id(progress["last_id"])
        else:
            asked = dict(progress or {}) if resuming else {}
            now = _iso(timezone.now())
            state = {
                "phase": COPYING,
                "batch": 0 if stored_batch is None else stored_batch + 1,
                "last_id": None,
                "copied": 0,
                "estimated": int(self.source.estimated_count()),
                "started_at": asked.get("started_at") or now,
                "updated_at": now,
                "finished_at": None,
                "reason": reason,
            }
            for key in ("requested_by", "requested_at"):  # who asked for a resync
                if asked.get(key) is not None:
                    state[key] = asked[key]
            self._write(state, stored_batch)
            position = self._capture(saved, reason)
            after_id = None
        logger.info(
            "stream %r: initial sync (%s) %s at %d of about %d documents",
            self.name,
            state["reason"],
            "resumes" if state["copied"] else "starts",
            state["copied"],
            state["estimated"],
        )
        metrics.emit(
            metrics.initial_sync_started,
            self.name,
            reason=state["reason"],
            copied=state["copied"],
            estimated=state["estimated"],
            resumed=bool(state["copied"]),
        )
        size = self.spec.checkpoint.copy_batch_size
        while True:
            self._check_interrupted()
            documents = self.source.copy_batch(query, after_id, size)
            if not documents:
                break
            after_id = documents[-1]["_id"]
            following = {
                **state,
                "batch": state["batch"] + 1,
                "last_id": encode_id(after_id),
                "copied": state["copied"] + len(documents),
                "updated_at": _iso(timezone.now()),
            }
            self._copy(documents, following, state["batch"])
            state = following
            if len(documents) < size:
                break
        finished = timezone.now()
        done = {
            **state,
            "phase": DONE,
            "batch": state["batch"] + 1,
            "updated_at": _iso(finished),
            "finished_at": _iso(finished),
        }
        self._write(done, state["batch"])
        duration = (finished - datetime.fromisoformat(state["started_at"])).total_seconds()
        logger.info(
            "stream %r: initial sync (%s) done: %d documents in %.1fs",
            self.name,
            state["reason"],
            state["copied"],
            duration,
        )
        metrics.emit(
            metrics.initial_sync_finished,
            self.name,
            reason=state["reason"],
            copied=state["copied"],
            duration=duration,
            started_at=datetime.fromisoformat(state["started_at"]),
        )
        return position

    def _capture(self, saved: Checkpoint | None, reason: str) -> Mapping[str, Any]:
        """The change stream's current position, persisted as the seen anchor."""
        position = self.source.initial_position()
        now = timezone.now()
        if reason == HISTORY_LOST:
            # The dead processed anchor goes (guarded, as RESUME_FROM_NOW does).
            dead = saved.last_processed_token if saved is not None else None
            self.store.reset_after_history_lost(self.name, position, dead, now)
        else:
            self.store.save_seen(self.name, position, now, heartbeat_at=now)
        return position

    def _check_interrupted(self) -> None:
        self.consumer.check_lease()
        if self.consumer.stopping:
            raise CopyInterrupted(f"stream {self.name!r}: stopped during the initial sync")

    def _copy(
        self, documents: list[Mapping[str, Any]], progress: Mapping[str, Any], expected: int
    ) -> None:
        # Asked once a batch, not once a document: a receiver of event_processed
        # connected during a batch counts from the next one.
        observed = metrics.event_processed.has_listeners(self.name)
        if self.spec.transactional:
            # Handlers and the progress write commit together or not at all.
            with transaction.atomic(using=self.spec.transaction_using):
                for document in documents:
                    self._handle(document, observed)
                self._write(progress, expected)
        else:
            for document in documents:
                self._handle(document, observed)
            self._write(progress, expected)
        # After the commit: the batch is durable.
        metrics.emit(
            metrics.initial_sync_progress,
            self.name,
            documents=len(documents),
            copied=progress["copied"],
            batch=progress["batch"],
            estimated=progress.get("estimated"),
        )

    def _handle(self, document: Mapping[str, Any], observed: bool = True) -> None:
        consumer, name, spec = self.consumer, self.name, self.spec
        ctx = ChangeContext.for_snapshot(
            document,
            stream_name=name,
            database=spec.database,
            collection=spec.collection,
            send_to_dlq=consumer._send_to_dlq,
        )
        if observed:
            started = time.perf_counter()
            settled = consumer._attempt_loop(self.handler, ctx, False)
            metrics.emit(
                metrics.event_processed,
                name,
                duration=time.perf_counter() - started,
                success=settled,
            )
        else:
            settled = consumer._attempt_loop(self.handler, ctx, False)
        if settled is None:
            # A stop cut the retries short: the batch is not committed.
            raise CopyInterrupted(f"stream {name!r}: stopped during the initial sync")
        consumer.documents_copied += 1
