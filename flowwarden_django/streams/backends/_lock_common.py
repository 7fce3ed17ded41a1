"""Helpers shared by the lock services: argument checks, the warning for a
swallowed backend error, and system-check messages named for ``LOCK_SERVICES``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from django.core import checks

from ..locks import note_unavailable
from ..stores import lock_services, store_setting

logger = logging.getLogger("flowwarden_django.streams.locks")


def check_owner(owner: str) -> None:
    """An owner is a non-empty string: the ORM table marks a free lease with ``""``."""
    if not isinstance(owner, str) or not owner:
        raise ValueError(f"a lease owner must be a non-empty string, not {owner!r}")


def warn_unavailable(operation: str, name: str, error: BaseException) -> None:
    """Log a backend error that ``try_acquire``/``renew`` turn into ``None`` (and note
    it for the caller: ``locks.unavailable_error``)."""
    note_unavailable(error)
    logger.warning(
        "lock service: %s of the lease on %r failed, treated as not held: %s",
        operation,
        name,
        error,
        exc_info=error,
    )


def renamed_checks(
    check: Callable[..., list[checks.CheckMessage]],
    backend: type,
    alias: str,
    options: Mapping[str, Any],
) -> list[checks.CheckMessage]:
    """Run a checkpoint store's option checks for a lock service taking the same options.

    *check* is the store's undecorated ``check_options`` function; it runs with
    *backend* as its class (so messages name the lock service), and the setting
    path in every message becomes ``FLOWWARDEN["LOCK_SERVICES"]["<alias>"]``.
    """
    store_path, lock_path = store_setting(alias), lock_services.alias_setting(alias)
    renamed = []
    for message in check(backend, alias, options):
        renamed.append(
            type(message)(
                message.msg.replace(store_path, lock_path),
                hint=message.hint,
                obj=message.obj,
                id=message.id,
            )
        )
    return renamed
