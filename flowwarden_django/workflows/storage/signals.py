"""Snapshot lifecycle events as Django signals: connect a receiver to any of these.

Each is sent with ``sender=`` the store and ``event=`` the ``SnapshotEvent``. A
receiver that raises is logged and never aborts the store operation.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from ...common.robust_signals import send_logged
from .snapshot import Deleted, Forked, Loaded, Saved, SnapshotEvent

logger = logging.getLogger("flowwarden_django.workflows")

snapshot_saved = Signal()
snapshot_loaded = Signal()
snapshot_forked = Signal()
snapshot_deleted = Signal()

_BY_KIND = {
    Saved: snapshot_saved,
    Loaded: snapshot_loaded,
    Forked: snapshot_forked,
    Deleted: snapshot_deleted,
}


def has_receivers(kind: type[SnapshotEvent]) -> bool:
    """Whether the signal of events of *kind* may have a receiver (a cheap check:
    stores make no event when neither it nor a listener wants one)."""
    return bool(_BY_KIND[kind].receivers)


def send(store: Any, event: SnapshotEvent) -> None:
    """Send the signal of *event*'s kind; receivers' errors are logged."""
    signal = _BY_KIND[type(event)]
    if not signal.receivers:
        return
    send_logged(
        signal, logger, "snapshot signal receiver %r failed on %r", event, sender=store, event=event
    )
