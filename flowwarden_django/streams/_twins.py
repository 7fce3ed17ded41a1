"""The public twins of a store operation, generated from its sync signature.

A store SPI (``CheckpointStore``, ``DlqStore``, ``LockService``) declares each sync
operation once, with its signature and docstring; :func:`thread_twin` makes its
``a…`` twin, which runs the sync method (the instance's, so an override is the one
that runs) through ``self._run_sync``. A store with a native async client declares
each operation as one sans-I/O operation (see ``backends._calls``); :func:`native_pair`
makes both public methods from the SPI's signature: the sync one runs the operation
with ``self._run``, the async one with ``self._arun``, falling back to the thread
twin of the next class in the MRO. So no signature is spelt out twice.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from asgiref.sync import sync_to_async

T = TypeVar("T")


def _named(function: Any, method: Callable[..., Any], name: str, doc: str | None) -> Any:
    """*function* dressed as *method* renamed *name*: its signature and annotations."""
    function.__name__ = name
    function.__qualname__ = f"{method.__qualname__.rpartition('.')[0]}.{name}".lstrip(".")
    function.__doc__ = doc
    function.__module__ = method.__module__
    function.__signature__ = inspect.signature(method)
    function.__annotations__ = dict(method.__annotations__)
    return function


def thread_twin(method: Callable[..., Any]) -> Any:
    """The ``a…`` twin of *method*: ``await self._run_sync(self.<method>, ...)``."""
    name = method.__name__

    async def twin(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        return await self._run_sync(getattr(self, name), *args, **kwargs)

    return _named(twin, method, f"a{name}", f"Async :meth:`{name}`.")


def _positional(signature: inspect.Signature) -> Callable[..., tuple[Any, ...]]:
    """What turns a call's arguments into all its parameters, in order, positionally
    (defaults applied): how a store operation takes them."""
    kinds = [parameter.kind for parameter in signature.parameters.values()]
    # A call that passes every parameter positionally is taken as it is, unless some
    # are keyword-only: then it must be bound, to refuse it as the method would.
    count = -1 if inspect.Parameter.KEYWORD_ONLY in kinds else len(kinds) - 1

    def arguments(store: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        if not kwargs and len(args) == count:
            return args
        bound = signature.bind(store, *args, **kwargs)
        bound.apply_defaults()
        return tuple(bound.arguments.values())[1:]

    return arguments


def positional_method(method: Callable[..., Any], operation: str) -> Any:
    """The SPI *method* (its name and signature) running ``self.<operation>(...)``,
    which takes every parameter of *method*, in order."""
    arguments = _positional(inspect.signature(method))

    def call(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, operation)(*arguments(self, args, kwargs))

    return _named(call, method, method.__name__, None)


def native_pair(owner: type, name: str, operation: str) -> None:
    """Set ``owner.<name>`` and ``owner.a<name>``, both running ``self.<operation>(...)``
    (which takes every parameter of the SPI method *name*, in order): the sync one
    with ``self._run``, the async one with ``self._arun``, whose fallback is the
    ``a<name>`` of the next class in *owner*'s MRO."""
    method = getattr(owner, name)
    arguments = _positional(inspect.signature(method))
    twin_name = f"a{name}"

    def sync(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        return self._run(getattr(self, operation)(*arguments(self, args, kwargs)))

    async def twin(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        running = getattr(self, operation)(*arguments(self, args, kwargs))
        default = getattr(super(owner, self), twin_name)
        return await self._arun(running, default, *args, **kwargs)

    for function, function_name in ((sync, name), (twin, twin_name)):
        _named(function, method, function_name, None)
        function.__qualname__ = f"{owner.__qualname__}.{function_name}"
        setattr(owner, function_name, function)


class RunsSync:
    """What the thread twins run on: a store SPI's ``_run_sync``.

    A class naming sync operations in its ``_thread_twinned`` gets the ``a…`` twin of
    each (:func:`thread_twin`), as if it had declared them itself.
    """

    #: ``thread_sensitive`` of the ``a…`` defaults: ``True`` for stores on the Django
    #: database, ``False`` for those that never touch it.
    async_thread_sensitive: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in cls.__dict__.get("_thread_twinned", ()):
            setattr(cls, f"a{name}", thread_twin(cls.__dict__[name]))

    async def _run_sync(self, method: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``method(*args, **kwargs)`` off the event loop, on the executor that
        :attr:`async_thread_sensitive` names."""
        call = sync_to_async(method, thread_sensitive=self.async_thread_sensitive)
        return await call(*args, **kwargs)
