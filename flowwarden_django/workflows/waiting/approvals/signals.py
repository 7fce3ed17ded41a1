"""Approval events as Django signals: connect a receiver to any of these.

Each is sent once per event (its ``ApprovalNotification`` row is taken once, after
the event's transaction committed; see ``notifications``), with ``sender=`` the
``Approval`` model and the keyword arguments ``approval`` (the row), ``event`` (an
``ApprovalNotification.Event`` value), ``number`` (the reminder's number; 0
otherwise), ``recipients`` (``[{"user": name} | {"group": name}, ...]``) and
``notification`` (the outbox row). A receiver that raises is logged and changes
nothing.
"""

from __future__ import annotations

from django.dispatch import Signal

approval_requested = Signal()
approval_assigned = Signal()
approval_reminded = Signal()
approval_escalated = Signal()

#: The signal of each ``ApprovalNotification.Event`` value.
BY_EVENT = {
    "requested": approval_requested,
    "assigned": approval_assigned,
    "reminded": approval_reminded,
    "escalated": approval_escalated,
}
