"""Calling user handlers: which arguments they take, and ``async def`` support."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async

#: Handler shapes: ``handler(ctx)``, ``handler(doc)``, ``handler(doc, ctx)``.
SHAPES = ("ctx", "doc", "doc_ctx")
_CONTEXT_NAMES = ("ctx", "context")


def _function_of(handler: Callable[..., Any]) -> tuple[Callable[..., Any], bool]:
    """The function to inspect, and whether its first parameter is ``self``."""
    unbound = getattr(handler, "_flowwarden_unbound", None)
    if unbound is not None:
        return unbound, True
    return handler, False


def handler_shape(handler: Callable[..., Any]) -> str:
    """``"ctx"``, ``"doc"`` or ``"doc_ctx"``; ``TypeError`` for any other signature.

    One parameter is the context when it is named ``ctx``/``context`` or annotated
    with ``ChangeContext``; otherwise it is the document.
    """
    function, has_self = _function_of(handler)
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot read the signature of {handler!r}: {exc}") from exc
    if has_self:
        parameters = parameters[1:]
    positional = [
        p
        for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(positional) == 2:
        return "doc_ctx"
    if len(positional) == 1:
        parameter = positional[0]
        annotation = parameter.annotation
        annotation_name = getattr(annotation, "__name__", str(annotation))
        if parameter.name in _CONTEXT_NAMES or "ChangeContext" in annotation_name:
            return "ctx"
        return "doc"
    names = ", ".join(p.name for p in positional) or "nothing"
    raise TypeError(
        f"a handler takes (ctx), (doc) or (doc, ctx); {getattr(function, '__qualname__', handler)} "
        f"takes {names}"
    )


def is_async(handler: Callable[..., Any]) -> bool:
    """Whether the handler is an ``async def``."""
    function, _ = _function_of(handler)
    return inspect.iscoroutinefunction(function)


async def _await(awaitable: Any) -> Any:
    return await awaitable


class HandlerCaller:
    """Calls handlers with the arguments their shape wants; runs ``async def``
    handlers to completion with ``asgiref``'s ``async_to_sync``.

    A handler's signature is read once (on its first call) and remembered with the
    handler itself, so a new function that reuses a dead one's ``id`` is read anew.
    """

    def __init__(self) -> None:
        self._shapes: dict[int, tuple[Callable[..., Any], str]] = {}

    def shape(self, handler: Callable[..., Any]) -> str:
        """*handler*'s shape (``SHAPES``), read on first use."""
        entry = self._shapes.get(id(handler))
        if entry is None or entry[0] is not handler:
            entry = self._shapes[id(handler)] = (handler, handler_shape(handler))
        return entry[1]

    def call(self, handler: Callable[..., Any], doc: Any, ctx: Any) -> Any:
        """Call *handler* for one event and wait for it when it is a coroutine."""
        entry = self._shapes.get(id(handler))
        shape = entry[1] if entry is not None and entry[0] is handler else self.shape(handler)
        if shape == "doc":
            result = handler(doc)
        elif shape == "ctx":
            result = handler(ctx)
        else:
            result = handler(doc, ctx)
        # None, what a plain handler returns, is never awaitable: skip the check.
        if result is not None and inspect.isawaitable(result):
            return self._run(result)
        return result

    def run(self, awaitable: Any) -> Any:
        """Wait for what an ``async def`` handler returned (see :meth:`call`)."""
        return self._run(awaitable)

    def _run(self, awaitable: Any) -> Any:
        # async_to_sync runs the coroutine's thread-sensitive sync_to_async calls (the
        # ORM) on this thread, with this thread's connection: inside a transactional
        # stream's atomic block.
        return async_to_sync(_await)(awaitable)

    def close(self) -> None:
        """Release what the caller holds (nothing at present)."""


class AsyncHandlerCaller(HandlerCaller):
    """Calls handlers from an event loop: an ``async def`` is awaited there, a sync one
    runs through ``sync_to_async(thread_sensitive=True)``, on the stream's thread (so
    its ORM calls have that thread's connection)."""

    def __init__(self) -> None:
        super().__init__()
        self._async: dict[int, tuple[Callable[..., Any], bool]] = {}
        #: A parallel stream's thread pool: sync code runs there, several calls at once,
        #: instead of on the stream's single thread.
        self.executor: Any = None

    def _to_async(self, function: Callable[..., Any]) -> Callable[..., Any]:
        if self.executor is not None:
            return sync_to_async(function, thread_sensitive=False, executor=self.executor)
        return sync_to_async(function, thread_sensitive=True)

    def awaitable(self, function: Callable[..., Any]) -> bool:
        """Whether *function* is an ``async def`` (read once per function)."""
        known = self._async.get(id(function))
        if known is None or known[0] is not function:
            known = self._async[id(function)] = (function, is_async(function))
        return known[1]

    async def acall(self, function: Callable[..., Any], doc: Any, ctx: Any) -> Any:
        """Call *function* with the arguments its shape wants."""
        if self.awaitable(function):
            shape = self.shape(function)
            if shape == "doc":
                return await function(doc)
            if shape == "ctx":
                return await function(ctx)
            return await function(doc, ctx)
        return await self._to_async(self.call)(function, doc, ctx)

    async def acall_with(self, function: Callable[..., Any], *args: Any) -> Any:
        """Call *function* with *args* as they are (a document handler, ``on_error``)."""
        if self.awaitable(function):
            return await function(*args)
        return await self._to_async(function)(*args)
