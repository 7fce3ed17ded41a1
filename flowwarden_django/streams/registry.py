"""Declaring streams: the ``@change_stream`` family of decorators, ``register_stream``,
and the registry both feed.

Decorators only record what was declared; the specs are built and validated when
the registry is read (``manage.py check`` and the runtime), so ``@checkpoint``
may sit above or below ``@change_stream``.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from .spec import (
    DEFAULT_NO_RETRY_ON,
    HANDLER_OPERATIONS,
    CheckpointSpec,
    DeadLetterQueueSpec,
    RestartPolicySpec,
    RetryPolicySpec,
    StreamSpec,
    kebab_case,
)

C = TypeVar("C", bound=type)
P = ParamSpec("P")

_STREAM_ATTR = "_flowwarden_stream"
_CHECKPOINT_ATTR = "_flowwarden_checkpoint"
_RESTART_ATTR = "_flowwarden_restart_policy"
_RETRY_ATTR = "_flowwarden_retry_policy"
_DLQ_ATTR = "_flowwarden_dead_letter_queue"
_ON_ERROR_ATTR = "_flowwarden_on_error"
F = TypeVar("F", bound=Callable[..., Any])


class DuplicateStreamError(ValueError):
    """Two declarations use the same stream name."""


class StreamRegistry:
    """Every declared stream, by name, in declaration order."""

    def __init__(self) -> None:
        self._classes: list[type] = []
        self._specs: list[StreamSpec] = []
        self._lock = threading.Lock()

    def add_class(self, cls: type) -> None:
        """Record a class decorated with ``@change_stream``."""
        with self._lock:
            if cls not in self._classes:
                self._classes.append(cls)

    def add_spec(self, spec: StreamSpec) -> StreamSpec:
        """Record a programmatic declaration."""
        with self._lock:
            self._specs.append(spec)
        return spec

    def declarations(self) -> list[StreamSpec]:
        """Every declaration as a spec, duplicates included (validation reports them)."""
        with self._lock:
            classes, specs = list(self._classes), list(self._specs)
        return [spec_from_class(cls) for cls in classes] + specs

    def specs(self) -> dict[str, StreamSpec]:
        """The declared streams by name; ``DuplicateStreamError`` if a name repeats."""
        found: dict[str, StreamSpec] = {}
        for spec in self.declarations():
            if spec.name in found:
                raise DuplicateStreamError(
                    f"stream {spec.name!r} is declared twice: in {found[spec.name].origin} "
                    f"and in {spec.origin}"
                )
            found[spec.name] = spec
        return found

    def get(self, name: str) -> StreamSpec:
        """One stream's spec; ``KeyError`` naming the declared streams if unknown."""
        specs = self.specs()
        if name not in specs:
            raise KeyError(f"no stream {name!r}; declared: {', '.join(sorted(specs)) or 'none'}")
        return specs[name]

    def unregister(self, name: str) -> None:
        """Forget a declaration (tests and dynamic registration)."""
        with self._lock:
            self._classes = [c for c in self._classes if spec_from_class(c).name != name]
            self._specs = [s for s in self._specs if s.name != name]

    def clear(self) -> None:
        """Forget every declaration."""
        with self._lock:
            self._classes.clear()
            self._specs.clear()


stream_registry = StreamRegistry()


def change_stream(
    name: str | None = None,
    *,
    collection: str | None = None,
    database: str | None = None,
    full_document: str = "default",
    full_document_before_change: str = "off",
    deployment_mode: str = "ALL_INSTANCES",
    enabled: bool = True,
    auto_start: bool = True,
    client: str = "default",
    lock_service: str = "default",
    transactional: bool = False,
    transaction_using: str = "default",
    checkpoint_store: str = "default",
    description: str = "",
    parallelism: int = 1,
    key: Callable[[Mapping[str, Any]], Any] | None = None,
    window: int | None = None,
    execution: str = "inline",
    registry: StreamRegistry | None = None,
) -> Callable[[C], C]:
    """Declare a class as a change-stream consumer.

    The class defines any of ``on_insert``, ``on_update``, ``on_delete``,
    ``on_replace``, ``on_snapshot`` (the documents of an initial sync) and
    ``on_change`` (taking ``ctx``, ``doc`` or ``doc, ctx``;
    ``def`` or ``async def``), and optionally ``pipeline()``, ``filter(ctx)``
    and error handlers (``@on_error(...)`` methods, or a method named
    ``on_error`` as the catch-all). ``deployment_mode="SINGLE_LEADER"`` runs it
    in one process at a time, holding a lease of the ``lock_service`` alias.
    The name defaults to the kebab-case class name. The class is instantiated
    once per stream start, with no arguments.

    ``parallelism=N`` handles up to N events at once: events of one ``key`` (a
    function of the change event, by default its ``documentKey``) strictly in stream
    order, different keys concurrently; the checkpoint is the low watermark, and at
    most ``window`` events (default ``4 * N``) are read ahead of it.
    ``execution="celery"`` sends each event to a Celery worker (the task
    ``flowwarden_django.handle_stream_event``) with the same order and anchor.
    """
    options = dict(locals())  # the arguments, which are ``StreamSpec`` fields
    del options["registry"]

    def decorate(cls: C) -> C:
        setattr(cls, _STREAM_ATTR, options)
        (registry or stream_registry).add_class(cls)
        return cls

    return decorate


def _setting(attr: str, value: Any) -> Callable[[C], C]:
    """A class decorator that stores *value* on the class as *attr*."""

    def decorate(cls: C) -> C:
        setattr(cls, attr, value)
        return cls

    return decorate


def _declaring(
    spec_class: Callable[P, Any], attr: str, name: str, doc: str
) -> Callable[P, Callable[[C], C]]:
    """A decorator factory that takes *spec_class*'s arguments (its signature, defaults
    included) and stores the spec on the class as *attr*."""

    def declare(*args: P.args, **kwargs: P.kwargs) -> Callable[[C], C]:
        return _setting(attr, spec_class(*args, **kwargs))

    declare.__name__ = declare.__qualname__ = name
    declare.__doc__ = doc
    declare.__signature__ = inspect.signature(spec_class).replace(  # type: ignore[attr-defined]
        return_annotation="Callable[[C], C]"
    )
    return declare


checkpoint = _declaring(
    CheckpointSpec,
    _CHECKPOINT_ATTR,
    "checkpoint",
    "Set how a ``@change_stream`` class keeps its checkpoint (see ``CheckpointSpec``).",
)
restart_policy = _declaring(
    RestartPolicySpec,
    _RESTART_ATTR,
    "restart_policy",
    "Set the backoff of the managed restart after a cursor dies (see ``RestartPolicySpec``).",
)
dead_letter_queue = _declaring(
    DeadLetterQueueSpec,
    _DLQ_ATTR,
    "dead_letter_queue",
    "Park events that failed for good in a dead-letter store (see ``DeadLetterQueueSpec``).",
)


def retry_policy(
    max_attempts: int = 3,
    initial_delay: str | float = "500ms",
    max_delay: str | float = "30s",
    multiplier: float = 2.0,
    retry_on: tuple[type[BaseException], ...] = (),
    no_retry_on: tuple[type[BaseException], ...] = DEFAULT_NO_RETRY_ON,
    jitter: bool = True,
) -> Callable[[C], C]:
    """Retry a failed handler on the stream's thread (see ``RetryPolicySpec``)."""
    retry_on, no_retry_on = tuple(retry_on), tuple(no_retry_on)
    return _setting(_RETRY_ATTR, RetryPolicySpec(**locals()))


def on_error(*types: type[BaseException]) -> Callable[[F], F]:
    """Mark a stream method ``handler(self, exc, ctx) -> ErrorAction`` as the error
    handler for *types* (and their subclasses); no types: the catch-all.

    Resolution: the exception's exact type, then its nearest parent, then the
    catch-all. Returning ``None`` means ``RETHROW``.
    """

    def decorate(function: F) -> F:
        setattr(function, _ON_ERROR_ATTR, tuple(types))
        return function

    return decorate


def register_stream(
    name: str,
    collection: str,
    *,
    on_insert: Callable[..., Any] | None = None,
    on_update: Callable[..., Any] | None = None,
    on_delete: Callable[..., Any] | None = None,
    on_replace: Callable[..., Any] | None = None,
    on_change: Callable[..., Any] | None = None,
    on_snapshot: Callable[..., Any] | None = None,
    registry: StreamRegistry | None = None,
    **options: Any,
) -> StreamSpec:
    """Declare a stream without a class (from settings, a database, ...).

    Takes the ``@change_stream`` options plus ``checkpoint=CheckpointSpec(...)``,
    ``restart_policy=RestartPolicySpec(...)``, ``retry_policy=RetryPolicySpec(...)``,
    ``dead_letter_queue=DeadLetterQueueSpec(...)``, ``pipeline``, ``filter`` and
    ``on_error`` (a sequence of ``(exception types, handler)``; empty types = the
    catch-all); goes through the same validation. ``on_snapshot`` receives the
    documents of an initial sync (``CheckpointSpec(start_position="COPY_EXISTING")``).
    """
    handlers = {
        op: fn
        for op, fn in zip(
            HANDLER_OPERATIONS,
            (on_insert, on_update, on_delete, on_replace, on_snapshot),
            strict=True,
        )
        if fn is not None
    }
    origin = options.pop("origin", f"register_stream({name!r})")
    if "on_error" in options:
        options["on_error"] = tuple((tuple(types), fn) for types, fn in options["on_error"])
    spec = StreamSpec(
        name=name,
        collection=collection,
        handlers=handlers,
        on_change=on_change,
        origin=origin,
        **options,
    )
    return (registry or stream_registry).add_spec(spec)


def spec_from_class(cls: type) -> StreamSpec:
    """Build the spec of a ``@change_stream`` class, with fresh bound handlers.

    Handlers are bound to a new instance each call: the runtime calls this once
    per stream start.
    """
    options: Mapping[str, Any] = getattr(cls, _STREAM_ATTR)
    instance = _StreamInstance(cls)
    handlers = {
        op: instance.method(f"on_{op}")
        for op in HANDLER_OPERATIONS
        if callable(getattr(cls, f"on_{op}", None))
    }
    values = dict(options)
    values["name"] = values["name"] or kebab_case(cls.__name__)
    values["collection"] = values["collection"] or ""
    return StreamSpec(
        **values,
        handlers=handlers,
        on_change=instance.optional_method("on_change"),
        pipeline=instance.optional_method("pipeline"),
        filter=instance.optional_method("filter"),
        on_error=_error_routes(instance),
        checkpoint=getattr(cls, _CHECKPOINT_ATTR, CheckpointSpec()),
        restart_policy=getattr(cls, _RESTART_ATTR, RestartPolicySpec()),
        retry_policy=getattr(cls, _RETRY_ATTR, None),
        dead_letter_queue=getattr(cls, _DLQ_ATTR, None),
        origin=f"{cls.__module__}.{cls.__qualname__}",
    )


class _StreamInstance:
    """Creates the declared class's instance on first use, so building a spec for
    ``manage.py check`` runs no user ``__init__``."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self._instance: Any = None

    def get(self) -> Any:
        if self._instance is None:
            self._instance = self.cls()
        return self._instance

    def optional_method(self, name: str) -> Callable[..., Any] | None:
        """:meth:`method` when the class defines *name*, else ``None``."""
        return self.method(name) if callable(getattr(self.cls, name, None)) else None

    def method(self, name: str) -> Callable[..., Any]:
        function = getattr(self.cls, name)
        instance = self

        def bound(*args: Any, **kwargs: Any) -> Any:
            return getattr(instance.get(), name)(*args, **kwargs)

        bound.__wrapped__ = function  # type: ignore[attr-defined]
        bound.__name__ = name
        bound.__qualname__ = f"{self.cls.__qualname__}.{name}"
        bound._flowwarden_unbound = function  # type: ignore[attr-defined]
        return bound


def _error_routes(
    instance: _StreamInstance,
) -> tuple[tuple[tuple[type[BaseException], ...], Any], ...]:
    """The class's ``@on_error`` methods, plus a method named ``on_error`` as the catch-all."""
    routes = []
    for attribute in dir(instance.cls):
        function = getattr(instance.cls, attribute, None)
        types = getattr(function, _ON_ERROR_ATTR, None)
        if types is not None:
            routes.append((types, instance.method(attribute)))
        elif attribute == "on_error" and callable(function):
            routes.append(((), instance.method(attribute)))
    return tuple(routes)


def replace_spec(spec: StreamSpec, **changes: Any) -> StreamSpec:
    """A copy of *spec* with *changes* (specs are plain dataclasses)."""
    return dataclasses.replace(spec, **changes)
