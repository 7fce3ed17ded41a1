"""Helpers shared by the lock services: argument checks and the warning for a
swallowed backend error."""

from __future__ import annotations

import logging

from ..locks import note_unavailable

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
