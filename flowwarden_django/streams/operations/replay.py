"""Operator actions on dead letters: replay, acknowledge, discard, purge.

A replay re-runs one entry through its stream's current handlers (and filter),
in this process, on the caller's thread. It first claims the entry
(``PENDING`` → ``REPLAYING``), so two operators replaying the same entry at once
run it once. Success settles it as ``REPLAYED``; a failure puts it back to
``PENDING`` with the new error and one more replay counted. Replays never touch
the stream's checkpoint: the event was settled when it was parked. For a
transactional stream the handler's effects and the ``REPLAYED`` mark commit in one
transaction when the ORM DLQ store is on the stream's database. An entry left
``REPLAYING`` by a replay that died midway can still be acknowledged or discarded.

The handler gets what the entry kept: operation, document key, resume token and,
if the stream's policy kept it, the full document. Update descriptions and
pre-images are not kept, so ``ctx.update_description`` is ``None`` in a replay.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from ...common.stream_attempts import in_transactional_attempt
from ...common.user_input import check_note
from ..context import ChangeContext
from ..dispatch import HandlerCaller
from ..dlq import (
    ACKNOWLEDGED,
    DISCARDED,
    PENDING,
    REPLAYED,
    REPLAYING,
    DeadLetter,
    error_info,
)
from ..registry import StreamRegistry, stream_registry
from ..spec import StreamSpec
from ..stores import dlq_stores

logger = logging.getLogger("flowwarden_django.streams.dlq")


class ReplayDeadLetteredError(RuntimeError):
    """A handler called ``ctx.send_to_dlq()`` during a replay: the replay failed."""


@dataclasses.dataclass(frozen=True)
class ReplayOutcome:
    """What one replay did: ``status`` is the entry's status afterwards."""

    entry_id: str
    succeeded: bool
    status: str
    error: str = ""


def event_from_dead_letter(entry: DeadLetter, spec: StreamSpec | None = None) -> dict[str, Any]:
    """The change event a replay hands to the handlers, rebuilt from the entry."""
    event: dict[str, Any] = {
        "_id": entry.resume_token or {"_data": f"replay-{entry.id}"},
        "operationType": entry.operation_type,
    }
    if spec is not None:
        event["ns"] = {"db": spec.database, "coll": spec.collection}
    if entry.document_key is not None:
        event["documentKey"] = dict(entry.document_key)
    if entry.full_document is not None:
        event["fullDocument"] = dict(entry.full_document)
    return event


def _refuse_dlq(ctx: ChangeContext, reason: str) -> None:
    raise ReplayDeadLetteredError(f"the handler sent the event to the DLQ again: {reason}")


def run_handlers(
    spec: StreamSpec,
    entry: DeadLetter,
    caller: HandlerCaller | None = None,
    then: Callable[[], None] | None = None,
) -> None:
    """Run *entry* through *spec*'s filter and handler once; raise what the handler
    raises. *then* runs after a success, inside the same transaction for
    transactional streams (so the handler's effects and what *then* records commit
    together)."""
    event = event_from_dead_letter(entry, spec)
    ctx = ChangeContext(
        event,
        stream_name=spec.name,
        attempt_number=entry.attempts + entry.replay_count + 1,
        send_to_dlq=_refuse_dlq,
    )
    for key, value in (entry.metadata or {}).items():
        ctx.add_metadata(key, value)
    handler = spec.handler_for(entry.operation_type)
    caller = caller or HandlerCaller()

    def call() -> None:
        accepted = handler is not None and (
            spec.filter is None or caller.call(spec.filter, ctx.full_document, ctx)
        )
        if accepted:
            caller.call(handler, ctx.full_document, ctx)
        if then is not None:
            then()

    if spec.transactional:
        using = spec.transaction_using
        with transaction.atomic(using=using), in_transactional_attempt(spec.name, using):
            call()
    else:
        call()


class ReplayConflictError(RuntimeError):
    """The entry left ``REPLAYING`` while it was being replayed (acknowledged or
    discarded meanwhile): the replay's outcome is not recorded."""


def replay_dead_letter(
    entry_id: str,
    *,
    store: str = "default",
    by: str = "",
    registry: StreamRegistry | None = None,
) -> ReplayOutcome:
    """Replay one entry of the DLQ store *store* (an alias) through its stream's handlers."""
    registry = registry or stream_registry
    dlq = dlq_stores[store]
    entry = dlq.find_by_id(entry_id)
    if entry is None:
        return ReplayOutcome(entry_id, False, "", "no such dead letter")
    if not dlq.transition(entry_id, REPLAYING, from_statuses=(PENDING,), at=timezone.now(), by=by):
        current = dlq.find_by_id(entry_id)
        status = current.status if current else ""
        return ReplayOutcome(entry_id, False, status, f"not pending (status {status or 'gone'})")

    def mark_replayed() -> None:
        if not dlq.transition(
            entry_id,
            REPLAYED,
            from_statuses=(REPLAYING,),
            at=timezone.now(),
            by=by,
            note="replayed",
        ):
            raise ReplayConflictError(f"dead letter {entry_id} left REPLAYING during its replay")

    try:
        spec = registry.get(entry.stream_name)
        run_handlers(spec, entry, then=mark_replayed)
    except ReplayConflictError as exc:
        current = dlq.find_by_id(entry_id)
        return ReplayOutcome(entry_id, False, current.status if current else "", str(exc))
    except Exception as exc:
        logger.warning("replay of dead letter %s (%s) failed: %s", entry_id, entry.stream_name, exc)
        dlq.record_replay_failure(entry_id, error_info(exc), at=timezone.now())
        return ReplayOutcome(entry_id, False, PENDING, f"{type(exc).__name__}: {exc}")
    logger.info("dead letter %s (%s) replayed", entry_id, entry.stream_name)
    return ReplayOutcome(entry_id, True, REPLAYED)


def replay_dead_letters(
    entry_ids: Iterable[str],
    *,
    store: str = "default",
    by: str = "",
    registry: StreamRegistry | None = None,
) -> list[ReplayOutcome]:
    """Replay entries one by one, in the given order; one failure does not stop the rest."""
    return [replay_dead_letter(i, store=store, by=by, registry=registry) for i in entry_ids]


def replay_stream(
    stream_name: str,
    *,
    store: str = "default",
    by: str = "",
    limit: int | None = None,
    registry: StreamRegistry | None = None,
) -> list[ReplayOutcome]:
    """Replay a stream's pending entries, oldest first (the order they failed in)."""
    pending = dlq_stores[store].find_by_stream(stream_name, status=PENDING, limit=limit)
    ids = [entry.id for entry in reversed(pending)]
    return replay_dead_letters(ids, store=store, by=by, registry=registry)


#: Statuses an operator may settle by hand: a replay that died midway (its process
#: killed) leaves an entry ``REPLAYING`` for good otherwise.
RESOLVABLE_STATUSES = (PENDING, REPLAYING)


def _resolve(entry_id: str, status: str, store: str, by: str, note: str) -> bool:
    """Settle a pending (or stuck replaying) entry as *status*, with a checked *note*."""
    note = check_note(note)
    return dlq_stores[store].transition(
        entry_id,
        status,
        from_statuses=RESOLVABLE_STATUSES,
        at=timezone.now(),
        by=by,
        note=note,
    )


def acknowledge_dead_letter(
    entry_id: str, *, store: str = "default", by: str = "", note: str = ""
) -> bool:
    """Mark a pending (or stuck replaying) entry handled by hand; False otherwise.
    ``UserJSONError`` (a ``ValueError``) for a *note* over ``MAX_NOTE_CHARS`` or with
    a NUL; nothing changes then."""
    return _resolve(entry_id, ACKNOWLEDGED, store, by, note)


def discard_dead_letter(
    entry_id: str, *, store: str = "default", by: str = "", note: str = ""
) -> bool:
    """Mark a pending (or stuck replaying) entry as not worth handling; False otherwise.
    Its *note* is checked as :func:`acknowledge_dead_letter` checks it."""
    return _resolve(entry_id, DISCARDED, store, by, note)


def purge_expired_dead_letters(now: datetime | None = None) -> dict[str, int]:
    """Delete expired entries in every configured DLQ store; the count per alias."""
    now = now or timezone.now()
    return {alias: dlq_stores[alias].purge_expired(now) for alias in dlq_stores}
