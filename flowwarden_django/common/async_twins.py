"""Async twins of sync calls: the same call, run through
``sync_to_async(thread_sensitive=True)``.

A twin made here has its sync call's signature (``inspect.signature`` and the docs
follow ``__wrapped__``), its own name (the sync one with an ``a`` in front) and its
own docstring, so the parameters are written once, on the sync call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from asgiref.sync import sync_to_async

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")


def _dressed(twin: Any, func: Callable[..., Any], doc: str) -> Any:
    """*twin* dressed as *func*'s twin: *func*'s signature (``__wrapped__``), its own
    name (*func*'s with an ``a`` in front) and docstring *doc*; never abstract (the
    twin of an abstract method runs whichever override the instance has)."""
    functools.update_wrapper(twin, func)
    twin.__dict__.pop("__isabstractmethod__", None)
    twin.__name__ = f"a{func.__name__}"
    owner = func.__qualname__.rpartition(".")[0]
    twin.__qualname__ = f"{owner}.{twin.__name__}" if owner else twin.__name__
    twin.__doc__ = doc
    return twin


def thread_sensitive_twin(func: Callable[P, R], doc: str) -> Callable[P, Coroutine[Any, Any, R]]:
    """The async function ``a<name>`` that runs *func* (a module's function) with the
    same arguments in Django's thread-sensitive executor; *doc* is its docstring."""

    async def twin(*args: P.args, **kwargs: P.kwargs) -> R:
        return await sync_to_async(func, thread_sensitive=True)(*args, **kwargs)

    return _dressed(twin, func, doc)


def method_twin(
    method: Callable[Concatenate[S, P], R], doc: str, *, own_executor: bool = False
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """The async method ``a<name>`` that runs the instance's *method* (looked up by
    name, so a subclass's override is the one run) with the same arguments in
    Django's thread-sensitive executor, or with *own_executor* through the
    instance's own ``_run_sync`` (a snapshot store's, on the executor the store
    names); *doc* is its docstring."""
    name = method.__name__
    if own_executor:

        async def twin(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            return await self._run_sync(getattr(self, name), *args, **kwargs)

    else:

        async def twin(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            bound = getattr(self, name)
            return await sync_to_async(bound, thread_sensitive=True)(*args, **kwargs)

    return _dressed(twin, method, doc)
