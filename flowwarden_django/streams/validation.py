"""Validation of declared streams, shared by both ways of declaring one.

Each problem names the stream and the attribute; ``checks.py`` turns them into
Django system-check messages (``flowwarden_django.E1xx`` / ``W1xx``).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings

from ..common.app_models import models
from ..conf import fw_settings
from .dispatch import handler_shape
from .initial_sync.filter import CopyFilterError, copy_filter
from .spec import (
    DEPLOYMENT_MODES,
    FULL_DOCUMENT_BEFORE_CHANGE_MODES,
    FULL_DOCUMENT_MODES,
    HISTORY_LOST_STRATEGIES,
    START_POSITIONS,
    StreamSpec,
    parse_duration,
)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong (``error``) or doubtful (``warning``) with a declared stream."""

    level: str
    code: str
    stream: str
    attribute: str
    message: str
    hint: str = ""
    origin: str = ""

    def text(self) -> str:
        where = f" ({self.origin})" if self.origin else ""
        return f"stream {self.stream!r}{where}: {self.attribute}: {self.message}"


class _Collector:
    def __init__(self, spec: StreamSpec) -> None:
        self.spec = spec
        self.problems: list[Problem] = []

    def error(self, code: str, attribute: str, message: str, hint: str = "") -> None:
        self.problems.append(
            Problem("error", code, self.spec.name, attribute, message, hint, self.spec.origin)
        )

    def warning(self, code: str, attribute: str, message: str, hint: str = "") -> None:
        self.problems.append(
            Problem("warning", code, self.spec.name, attribute, message, hint, self.spec.origin)
        )


def _choice(out: _Collector, attribute: str, value: Any, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        out.error("E101", attribute, f"{value!r} is not one of {', '.join(allowed)}")


#: Why a stream option names an alias of a ``FLOWWARDEN`` setting, and what an entry
#: looks like, for the hint (settings not listed: no example that fits every case).
_ALIAS_SETTINGS: dict[str, tuple[str, str]] = {
    "LOCK_SERVICES": (
        ", which SINGLE_LEADER needs for its lease",
        '{"BACKEND": "flowwarden_django.streams.backends.orm.OrmLockService"}',
    ),
    "MONGO_CLIENTS": ("", '{"URL": "mongodb://host:27017/?replicaSet=rs0"}'),
}
_MISSING: Any = object()


def _configured(out: _Collector, code: str, attribute: str, alias: str, setting: str) -> Any:
    """The entry of *alias* in ``FLOWWARDEN[setting]``; error *code* and ``_MISSING``
    when there is none."""
    entries: Mapping[str, Any] = getattr(fw_settings, setting) or {}
    if alias in entries:
        return entries[alias]
    why, example = _ALIAS_SETTINGS.get(setting, ("", ""))
    out.error(
        code,
        attribute,
        f"{alias!r} is not in FLOWWARDEN[{setting!r}]{why} "
        f"(configured: {', '.join(sorted(entries)) or 'none'})",
        f'Add FLOWWARDEN["{setting}"]["{alias}"] = {example}.' if example else "",
    )
    return _MISSING


def validate_spec(spec: StreamSpec) -> list[Problem]:
    """Every problem of one stream (duplicates are checked by :func:`validate_all`)."""
    out = _Collector(spec)
    if not isinstance(spec.name, str) or not spec.name.strip():
        out.error("E102", "name", "a stream needs a non-empty name")
    if not spec.collection:
        out.error("E103", "collection", "no collection to watch", 'Pass collection="..."')
    _validate_handlers(out, spec)
    _validate_checkpoint(out, spec)
    _validate_initial_sync(out, spec)
    _validate_restart_policy(out, spec)
    _choice(out, "full_document", spec.full_document, FULL_DOCUMENT_MODES)
    _choice(
        out,
        "full_document_before_change",
        spec.full_document_before_change,
        FULL_DOCUMENT_BEFORE_CHANGE_MODES,
    )
    _choice(out, "deployment_mode", spec.deployment_mode, DEPLOYMENT_MODES)
    if spec.deployment_mode == "SINGLE_LEADER":
        _configured(out, "E104", "lock_service", spec.lock_service, "LOCK_SERVICES")
    _validate_parallelism(out, spec)
    _validate_retry_policy(out, spec)
    _validate_dead_letter_queue(out, spec)
    _validate_error_handlers(out, spec)
    _validate_connections(out, spec)
    return out.problems


def _validate_handlers(out: _Collector, spec: StreamSpec) -> None:
    if not spec.handlers and spec.on_change is None:
        out.error(
            "E105",
            "handlers",
            "no handler: define on_insert, on_update, on_delete, on_replace or on_change",
        )
    callables = {**spec.handlers, "change": spec.on_change, "filter": spec.filter}
    for operation, handler in callables.items():
        if handler is None:
            continue
        try:
            shape = handler_shape(handler)
        except TypeError as exc:
            attribute = "filter" if operation == "filter" else f"on_{operation}"
            out.error("E106", attribute, str(exc))
            continue
        if operation == "update" and shape != "ctx" and spec.full_document == "default":
            out.warning(
                "W101",
                "on_update",
                'takes the document, but with full_document="default" updates carry none '
                "(doc is None)",
                'Use full_document="updateLookup", or take ctx and read ctx.update_description.',
            )
    if spec.filter is not None and "delete" in spec.handlers:
        out.error(
            "E107",
            "filter",
            "a filter cannot be combined with on_delete: delete events carry no document to filter",
        )
    if spec.full_document_before_change != "off" and set(spec.handlers) == {"insert"}:
        out.warning(
            "W102",
            "full_document_before_change",
            "is set but the stream only handles inserts, which have no pre-image",
        )


def _check_at_least_one(out: _Collector, attribute: str, value: object) -> None:
    """E108 unless the checkpoint's *attribute* is a whole number of at least 1."""
    if not _whole(value) or value < 1:
        out.error(
            "E108",
            f"checkpoint.{attribute}",
            f"must be a whole number of at least 1, got {value!r}",
        )


def _validate_checkpoint(out: _Collector, spec: StreamSpec) -> None:
    policy = spec.checkpoint
    _check_at_least_one(out, "save_every_n", policy.save_every_n)
    for attribute in ("save_interval_seconds", "idle_heartbeat_interval_seconds"):
        value = getattr(policy, attribute)
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            out.error(
                "E108",
                f"checkpoint.{attribute}",
                f"must be a number of seconds of at least 0, got {value!r}",
            )
    _choice(out, "checkpoint.start_position", policy.start_position, START_POSITIONS)
    _choice(out, "checkpoint.on_history_lost", policy.on_history_lost, HISTORY_LOST_STRATEGIES)
    if policy.idle_heartbeat_interval_seconds == 0:
        out.warning(
            "W103",
            "checkpoint.idle_heartbeat_interval_seconds",
            "is 0: an idle stream never certifies its position and can lose it when the "
            "oplog rolls over",
        )
        lagging = isinstance(policy.save_every_n, int) and policy.save_every_n > 1
        if policy.save_interval_seconds == 0 and lagging:
            out.warning(
                "W104",
                "checkpoint",
                "save_interval_seconds=0, idle_heartbeat_interval_seconds=0 and "
                "save_every_n>1: up to save_every_n-1 events stay unsaved indefinitely",
            )
    if spec.transactional and not spec.windowed and policy.save_every_n != 1:
        out.warning(
            "W105",
            "checkpoint.save_every_n",
            "is ignored by a transactional stream: every event's anchor is written in its "
            "own transaction",
        )


#: The most handler calls a stream may run at once (each is a thread on the threaded
#: runtime).
MAX_PARALLELISM = 512
#: The largest window a stream may declare (the events it holds in memory).
MAX_WINDOW = 100_000


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate_parallelism(out: _Collector, spec: StreamSpec) -> None:
    """``parallelism``, ``key`` and ``window`` (``core.window``)."""
    parallelism = spec.parallelism
    if not _whole(parallelism) or not 1 <= parallelism <= MAX_PARALLELISM:
        out.error(
            "E120",
            "parallelism",
            f"must be a whole number from 1 to {MAX_PARALLELISM}, got {parallelism!r}",
            "1 handles one event at a time; N handles up to N events at once, in order per key.",
        )
        return
    if spec.key is not None and not callable(spec.key):
        out.error(
            "E121",
            "key",
            f"must be a function of the change event, got {spec.key!r}",
            'For example key=lambda event: event["fullDocument"]["customer_id"].',
        )
    window = spec.window
    if window is not None and (not _whole(window) or not parallelism <= window <= MAX_WINDOW):
        out.error(
            "E122",
            "window",
            f"must be a whole number from parallelism ({parallelism}) to {MAX_WINDOW}, "
            f"got {window!r}",
            "Leave it out for 4 events per slot.",
        )
    _validate_execution(out, spec)
    if not spec.windowed and (spec.key is not None or window is not None):
        out.warning(
            "W107",
            "key" if spec.key is not None else "window",
            "has no effect on a stream handled one event at a time (parallelism=1)",
            "Set parallelism=N, or drop it.",
        )


def _validate_execution(out: _Collector, spec: StreamSpec) -> None:
    """``execution``: a known one; Celery with a result backend (the answers)."""
    from .remote_events import EXECUTIONS

    if spec.execution not in EXECUTIONS:
        out.error(
            "E123",
            "execution",
            f"{spec.execution!r} is not one of {', '.join(EXECUTIONS)}",
        )
        return
    if spec.execution != "celery":
        return
    try:
        from celery import current_app
    except ImportError:
        out.error(
            "E123",
            "execution",
            "'celery' needs Celery installed",
            "pip install 'flowwarden-django[celery]'",
        )
        return
    backend = current_app.conf.result_backend
    if not backend or str(backend).startswith("disabled"):
        out.error(
            "E123",
            "execution",
            "'celery' needs a Celery result backend: the consumer waits for each "
            "event's answer there",
            'Set CELERY_RESULT_BACKEND (for example "redis://127.0.0.1:6379/1", or '
            '"django-db" with django-celery-results installed: see docs/celery.md).',
        )


def _validate_initial_sync(out: _Collector, spec: StreamSpec) -> None:
    """``COPY_EXISTING`` and ``RESYNC``: a batch size, a snapshot handler, a pipeline
    that translates to the copy's filter."""
    policy = spec.checkpoint
    _check_at_least_one(out, "copy_batch_size", policy.copy_batch_size)
    if not policy.copies:
        return
    why = (
        'start_position="COPY_EXISTING"'
        if policy.start_position == "COPY_EXISTING"
        else 'on_history_lost="RESYNC"'
    )
    if spec.snapshot_handler() is None:
        out.error(
            "E118",
            "handlers",
            f"{why} copies existing documents, but the stream has no handler for them: "
            "define on_snapshot, on_insert or on_change",
        )
    if spec.pipeline is None:
        return
    try:
        stages = list(spec.pipeline())
    except Exception as exc:
        out.error("E119", "pipeline", f"pipeline() raised {exc!r}")
        return
    try:
        copy_filter(stages, spec.name)
    except CopyFilterError as exc:
        out.error(
            "E119",
            "pipeline",
            f"{exc} ({why})",
            "Copied documents are filtered by the pipeline's $match conditions on "
            "fullDocument.<field> and operationType only; filter the rest in the handler "
            "or with filter().",
        )


def _validate_restart_policy(out: _Collector, spec: StreamSpec) -> None:
    policy = spec.restart_policy
    if not isinstance(policy.max_attempts, int) or policy.max_attempts < 0:
        out.error(
            "E109",
            "restart_policy.max_attempts",
            f"must be 0 (unlimited) or more, got {policy.max_attempts!r}",
        )
    for attribute in ("initial_delay", "max_delay"):
        value = getattr(policy, attribute)
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            out.error("E109", f"restart_policy.{attribute}", str(exc))
            continue
        if seconds <= 0:
            out.error("E109", f"restart_policy.{attribute}", f"must be more than 0, got {value!r}")
    if not isinstance(policy.multiplier, int | float) or policy.multiplier < 1:
        out.error(
            "E109",
            "restart_policy.multiplier",
            f"must be at least 1, got {policy.multiplier!r}",
        )


def _validate_retry_policy(out: _Collector, spec: StreamSpec) -> None:
    policy = spec.retry_policy
    if policy is None:
        return
    if isinstance(policy.max_attempts, bool) or not isinstance(policy.max_attempts, int):
        out.error("E115", "retry_policy.max_attempts", "must be an integer")
    elif policy.max_attempts < 1:
        out.error(
            "E115",
            "retry_policy.max_attempts",
            f"must be at least 1 (it counts the first attempt), got {policy.max_attempts}",
        )
    for attribute in ("initial_delay", "max_delay"):
        try:
            parse_duration(getattr(policy, attribute))
        except ValueError as exc:
            out.error("E115", f"retry_policy.{attribute}", str(exc))
    if not isinstance(policy.multiplier, int | float) or policy.multiplier <= 0:
        out.error(
            "E115", "retry_policy.multiplier", f"must be more than 0, got {policy.multiplier!r}"
        )
    for attribute in ("retry_on", "no_retry_on"):
        for kind in getattr(policy, attribute):
            if not (isinstance(kind, type) and issubclass(kind, BaseException)):
                out.error(
                    "E115", f"retry_policy.{attribute}", f"{kind!r} is not an exception class"
                )


def _validate_dead_letter_queue(out: _Collector, spec: StreamSpec) -> None:
    queue = spec.dead_letter_queue
    if queue is None:
        if spec.retry_policy is not None or spec.on_error:
            out.warning(
                "W106",
                "dead_letter_queue",
                "none declared: an event that fails for good is not dropped; the stream "
                "restarts and the event is redelivered until it succeeds",
                "Add @dead_letter_queue() to park such events and keep the stream going.",
            )
        return
    if (
        isinstance(queue.retention_days, bool)
        or not isinstance(queue.retention_days, int)
        or queue.retention_days < 0
    ):
        out.error(
            "E116",
            "dead_letter_queue.retention_days",
            f"must be a whole number of days, 0 or more (0 = forever), got "
            f"{queue.retention_days!r}",
        )
    if queue.enabled:
        _configured(out, "E116", "dead_letter_queue.store", queue.store, "DLQ_STORES")


def _validate_error_handlers(out: _Collector, spec: StreamSpec) -> None:
    claimed: dict[Any, Any] = {}
    for types, handler in spec.on_error:
        name = getattr(handler, "__name__", repr(handler))
        for kind in types or ("catch-all",):
            if kind != "catch-all" and not (
                isinstance(kind, type) and issubclass(kind, BaseException)
            ):
                out.error("E117", f"on_error ({name})", f"{kind!r} is not an exception class")
                continue
            if kind in claimed:
                label = kind if kind == "catch-all" else kind.__name__
                out.error(
                    "E117",
                    f"on_error ({name})",
                    f"{label} is already handled by {claimed[kind]}",
                    "Each exception type (and the catch-all) may have one error handler.",
                )
            claimed[kind] = name
        function = getattr(handler, "_flowwarden_unbound", handler)
        try:
            parameters = [
                p
                for p in inspect.signature(function).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
        except (TypeError, ValueError):
            continue
        expected = 3 if function is not handler else 2  # an unbound method also takes self
        if len(parameters) != expected:
            out.error(
                "E117",
                f"on_error ({name})",
                "an error handler takes (exc, ctx) and returns an ErrorAction",
            )


def _validate_connections(out: _Collector, spec: StreamSpec) -> None:
    _configured(out, "E110", "client", spec.client, "MONGO_CLIENTS")
    store = _configured(out, "E111", "checkpoint_store", spec.checkpoint_store, "CHECKPOINT_STORES")
    if store is not _MISSING and spec.transactional:
        _validate_transactional(out, spec, store)


def _validate_transactional(out: _Collector, spec: StreamSpec, store_config: Any) -> None:
    from django.db import router

    from .backends.orm import OrmCheckpointStore
    from .stores import load_backend_class

    if spec.transaction_using not in settings.DATABASES:
        out.error(
            "E112",
            "transaction_using",
            f"{spec.transaction_using!r} is not a database alias",
        )
        return
    try:
        backend = load_backend_class(spec.checkpoint_store, store_config)
    except Exception:  # reported by the checkpoint store checks
        return
    options = (store_config.get("OPTIONS") or {}) if isinstance(store_config, Mapping) else {}
    # Without "using" the ORM store writes where the router sends StreamCheckpoint.
    using = options.get("using") or router.db_for_write(models.StreamCheckpoint)
    if not issubclass(backend, OrmCheckpointStore) or using != spec.transaction_using:
        out.error(
            "E112",
            "transactional",
            "needs the ORM checkpoint store on the handler's database "
            f"({spec.transaction_using!r}); store {spec.checkpoint_store!r} is "
            f"{backend.__name__}" + (f" on {using!r}" if using else ""),
            "Point the stream's checkpoint_store at an OrmCheckpointStore alias on the same "
            "database, or drop transactional=True.",
        )


def validate_all(specs: Iterable[StreamSpec]) -> list[Problem]:
    """Problems of every stream, plus duplicate names."""
    problems: list[Problem] = []
    seen: dict[str, StreamSpec] = {}
    for spec in specs:
        problems.extend(validate_spec(spec))
        first = seen.setdefault(spec.name, spec)
        if first is not spec:
            problems.append(
                Problem(
                    "error",
                    "E113",
                    spec.name,
                    "name",
                    f"declared twice: in {first.origin} and in {spec.origin}",
                    "Give each stream a unique name.",
                    spec.origin,
                )
            )
    return problems
