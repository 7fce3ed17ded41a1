"""Old import paths that still work, with a warning, for one minor release.

A module that moved leaves a one-line module at its old path::

    __getattr__ = moved_module(__name__, "flowwarden_django.streams.runtime.manager")

Each name read from the old path is looked up in the new module, and the reader is told
where to import it from now (a ``FlowwardenDeprecationWarning``, which Python's default
filter shows once per calling line, not once per name): from the public package when it exports the
name, else from the module's new path. The policy (CHANGELOG.md, "Deprecations") keeps
an old path until the release named by :data:`REMOVED_IN`.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: The release that drops the old paths kept here.
REMOVED_IN = "0.3"

#: Where a name is public, most specific package first.
_PUBLIC_PACKAGES = (
    "flowwarden_django.streams",
    "flowwarden_django.workflows",
    "flowwarden_django.testkit",
)


class FlowwardenDeprecationWarning(DeprecationWarning):
    """An import path, name or argument of flowwarden-django that a later release drops."""


def public_home(name: str, value: Any, new_module: str) -> str:
    """The import to recommend for *name*: a public package that exports this very
    *value* under that name, else *new_module*."""
    for package in _PUBLIC_PACKAGES:
        module = importlib.import_module(package)
        if name in getattr(module, "__all__", ()) and getattr(module, name) is value:
            return package
    return new_module


def warn_moved(old: str, name: str, value: Any, new_module: str) -> None:
    """Warn that ``from {old} import {name}`` is deprecated and say what replaces it."""
    warnings.warn(
        f"{old}.{name} has moved: use 'from {public_home(name, value, new_module)} import "
        f"{name}' (the old path goes in flowwarden-django {REMOVED_IN})",
        FlowwardenDeprecationWarning,
        stacklevel=3,
    )


def moved_module(
    old: str, new_module: str | None, elsewhere: dict[str, str] | None = None
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the old path *old*: each name of *elsewhere* is read
    from the module it maps the name to, any other public name from *new_module* (when
    the whole module moved), each with a warning."""
    homes = elsewhere or {}

    def __getattr__(name: str) -> Any:
        home = homes.get(name, new_module)
        if home is None or name.startswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        try:
            value = getattr(importlib.import_module(home), name)
        except AttributeError:
            raise AttributeError(f"module {old!r} has no attribute {name!r}") from None
        warn_moved(old, name, value, home)
        return value

    return __getattr__


def lazy_exports(package: str, homes: Mapping[str, Iterable[str]]) -> Callable[[str], Any]:
    """A package ``__getattr__`` that imports each of its public names on first use, so
    importing the package stays cheap (no database, driver or runtime module loaded).
    *homes* maps each module (absolute, or relative to *package*: ``".provider"``) to
    the names it provides."""
    home_of = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        try:
            home = home_of[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        return getattr(importlib.import_module(home, package), name)

    return __getattr__
