"""One event, once it failed: retries, the ``on_error`` routing and the dead-letter
queue, for both runtimes.

``attempt_loop`` runs the attempts until the event is settled: the first attempt's
outcome may come in already (the drivers' fast path tries the handler before any of
this). Each failure asks the stream's ``on_error`` handler (exact type, parent,
catch-all), which may SKIP (settle), RETRY (within the retry policy's attempts),
DLQ or leave it to the retry policy (RETHROW); an event that failed for good is parked
(``dead_letter``) and settled. A stop during a backoff leaves it unsettled.
"""

from __future__ import annotations

import logging
import random
import uuid
from typing import Any

from django.utils import timezone

from .. import initial_sync, metrics
from ..context import ChangeContext
from ..dlq import MANUAL_DLQ_TYPE, DlqPolicy, ErrorInfo, dead_letter_id
from ..dlq import DeadLetter as DeadLetterEntry
from ..dlq import error_info as make_error_info
from ..spec import NO_RETRY, ErrorAction, RetryPolicySpec, StreamSpec
from .driving import Decision
from .effects import Backoff, CallErrorHandler, ParkFailedEvent, SaveDeadLetter, Settle, TryOnce

logger = logging.getLogger("flowwarden_django.streams")


class FilterError(RuntimeError):
    """The stream's filter raised: the event stays unsettled and the stream restarts."""


class DeadLetterWriteError(RuntimeError):
    """An event that failed for good could not be parked: it stays unsettled.

    The reference settles such an event anyway, which loses it; here the stream
    restarts and the event is redelivered, so the DLQ write is tried again.
    """


class UnhandledEventError(RuntimeError):
    """An event failed for good and the stream has no dead-letter queue: it stays
    unsettled and the stream restarts (the event is redelivered)."""


def attempt_loop(
    spec: StreamSpec,
    handler: Any,
    ctx: ChangeContext,
    lifecycle: bool,
    consumer: Any,
    *,
    failed: Exception | None = None,
) -> Decision[bool | None]:
    """Attempt the event until it is settled: True on success, False when it was
    skipped or parked in the DLQ, None when a stop interrupted a backoff. *failed*:
    the first attempt already ran and raised this. *consumer* counts ``errors`` and
    ``retries`` and keeps the ``last_error``.

    Raises (leaving the event unsettled, so the stream restarts and it is
    redelivered) when the filter fails, when the event failed for good without a
    dead-letter queue, or when its DLQ write failed.
    """
    retry = spec.retry_policy or NO_RETRY
    attempt = 1
    while True:
        ctx.attempt_number = attempt
        if failed is not None:
            error: Exception | None = failed
            failed = None
        else:
            error = yield TryOnce(handler, ctx, lifecycle)
        if error is None:
            return True
        consumer.errors += 1
        consumer.last_error = error
        consumer.attempt_failed()
        action = yield from error_action(spec, error, ctx)
        if action is ErrorAction.SKIP:
            event_error(spec.name, error, ctx, will_retry=False)
            logger.warning("stream %r: skipped %s after: %r", spec.name, ctx.summary(), error)
            yield Settle(ctx, lifecycle)
            return False
        if action is ErrorAction.RETRY:
            again = attempt < retry.max_attempts
        elif action is ErrorAction.RETHROW:
            again = retry.should_retry(error, attempt)
        else:
            again = False
        event_error(spec.name, error, ctx, will_retry=again)
        if not again:
            yield ParkFailedEvent(error, ctx, lifecycle)
            return False
        delay = announce_retry(spec.name, ctx, error, attempt, retry)
        consumer.retries += 1
        if (yield Backoff(delay)):
            return None
        attempt += 1


def error_action(spec: StreamSpec, error: Exception, ctx: ChangeContext) -> Decision[ErrorAction]:
    """What the stream's ``on_error`` handler says of *error* (RETHROW without one,
    or when it fails)."""
    handler = spec.error_handler_for(error)
    if handler is None:
        return ErrorAction.RETHROW
    try:
        decision = yield CallErrorHandler(handler, error, ctx)
        return ErrorAction.RETHROW if decision is None else ErrorAction(decision)
    except Exception:
        logger.exception(
            "stream %r: the on_error handler failed; applying the retry policy", spec.name
        )
        return ErrorAction.RETHROW


def event_error(name: str, error: Exception, ctx: ChangeContext, *, will_retry: bool) -> None:
    """Send ``event_error`` for one failed attempt."""
    metrics.emit(
        metrics.event_error,
        name,
        error=error,
        will_retry=will_retry,
        attempt=ctx.attempt_number,
        event_id=ctx.event_id,
    )


def announce_retry(
    stream_name: str,
    ctx: ChangeContext,
    error: BaseException,
    attempt: int,
    retry: RetryPolicySpec,
) -> float:
    """The delay before retrying *ctx* after its *attempt* failed with *error* (the retry
    policy's backoff, with its jitter), logged as one warning."""
    delay = retry.delay(attempt) * (random.uniform(0.8, 1.2) if retry.jitter else 1.0)
    logger.warning(
        "stream %r: %s failed (%s); retry %d/%d in %.2fs",
        stream_name,
        ctx.summary(),
        error,
        attempt,
        retry.max_attempts - 1,
        delay,
    )
    return delay


# -- the dead-letter queue -------------------------------------------------------------


def dead_letter(
    spec: StreamSpec,
    error: Exception,
    ctx: ChangeContext,
    lifecycle: bool,
    consumer: Any,
    failure_log: Any,
) -> Decision[None]:
    """Park the event that failed for good, then settle it."""
    queue = spec.dead_letter_queue
    if queue is None or not queue.enabled:
        logger.error(
            "stream %r: %s failed for good and the stream has no dead-letter queue; "
            "restarting to redeliver it",
            spec.name,
            ctx.summary(),
        )
        raise UnhandledEventError(f"stream {spec.name!r}: {ctx.summary()} failed: {error!r}") from (
            error
        )
    policy = DlqPolicy(
        queue.retention_days, queue.include_original_document, queue.include_stack_trace
    )
    info = make_error_info(error, include_stack_trace=queue.include_stack_trace)
    yield from park(spec, ctx, info, policy, consumer, failure_log)
    yield Settle(ctx, lifecycle)


def park_on_request(
    spec: StreamSpec, ctx: ChangeContext, reason: str, consumer: Any, failure_log: Any
) -> Decision[None]:
    """``ctx.send_to_dlq(reason)``: park the event now, under the stream's queue's
    policy (else keeping everything); a failed write raises into the handler."""
    queue = spec.dead_letter_queue
    policy = (
        DlqPolicy(queue.retention_days, queue.include_original_document, queue.include_stack_trace)
        if queue is not None
        else DlqPolicy(0, True, True)
    )
    info = ErrorInfo(MANUAL_DLQ_TYPE, reason, None)
    yield from park(spec, ctx, info, policy, consumer, failure_log)


def park(
    spec: StreamSpec,
    ctx: ChangeContext,
    info: ErrorInfo,
    policy: DlqPolicy,
    consumer: Any,
    failure_log: Any,
) -> Decision[None]:
    """Write the dead letter of *ctx*; ``DeadLetterWriteError`` when it cannot be."""
    entry = dead_letter_entry(spec.name, ctx, info, policy)
    try:
        yield SaveDeadLetter(entry, policy)
    except Exception as exc:
        metrics.emit(metrics.event_dlq_failed, spec.name, error=exc)
        failure_log.failed(exc)
        raise DeadLetterWriteError(
            f"stream {spec.name!r}: could not park {ctx.summary()}: {exc}"
        ) from exc
    failure_log.succeeded()
    consumer.dead_lettered += 1
    consumer.dlq_dirty.set()
    metrics.emit(metrics.event_sent_to_dlq, spec.name, entry_id=entry.id)
    logger.error(
        "stream %r: %s parked in the dead-letter queue as %s (%s: %s)",
        spec.name,
        ctx.summary(),
        entry.id,
        info.type,
        info.message,
    )


def dead_letter_entry(
    stream_name: str, ctx: ChangeContext, info: ErrorInfo, policy: DlqPolicy
) -> DeadLetterEntry:
    """The dead letter of the event (or copied document) in *ctx*, failed with *info*."""
    now = timezone.now()
    return DeadLetterEntry(
        id=entry_id(stream_name, ctx),
        stream_name=stream_name,
        operation_type=ctx.operation_type,
        error=info,
        attempts=ctx.attempt_number,
        created_at=now,
        first_attempt_at=now,
        last_attempt_at=now,
        document_key=ctx.document_key,
        full_document=ctx.full_document if policy.include_original_document else None,
        resume_token=ctx.resume_token,
        expires_at=policy.compute_expires_at(now),
        metadata=ctx.metadata,
    )


_SNAPSHOT_ENTRY_NAMESPACE = uuid.UUID("6f1c8a52-4a51-4f0e-9d38-4b7f2f0f5c11")


def entry_id(stream_name: str, ctx: ChangeContext) -> str:
    """The dead letter's id: per resume token for an event, per ``_id`` for a copied
    document (the same on every redelivery, so a repeated failure overwrites it)."""
    if ctx.is_snapshot:
        key = initial_sync.encode_id((ctx.document_key or {}).get("_id"))
        return uuid.uuid5(_SNAPSHOT_ENTRY_NAMESPACE, f"{stream_name}\x00{key}").hex
    return dead_letter_id(stream_name, ctx.resume_token)
