"""What a step sees of a message sent to its run (``ctx.message``), and what a step
may ask of the mailboxes (``StepOutbox``: ``ctx.send``, ``ctx.set_event``).

They live below the engine and the mailbox (``waiting.messages``), so that
``StepContext`` can name them; ``flowwarden_django.workflows`` re-exports ``Message``.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True)
class Message:
    """A message sent to a run (``Workflow.send``, ``ctx.send``), as stored: its
    ``topic``, its JSON object ``payload``, who sent it (``sender``: free text, a
    sending run's coordination id for ``ctx.send``), when (``sent_at``) and its row's
    ``id`` (the mailbox's order: a lower id was sent first)."""

    topic: str
    payload: dict[str, Any]
    sender: str
    sent_at: datetime
    id: int

    @classmethod
    def from_row(cls, row: Any) -> Message:
        """The message of a ``WorkflowMessage`` row."""
        return cls(
            topic=row.topic,
            payload=row.payload,
            sender=row.sender,
            sent_at=row.sent_at,
            id=row.pk,
        )


class StepOutbox(Protocol):
    """What ``ctx.send`` and ``ctx.set_event`` go through: the engine gives each attempt
    of a step one (``waiting.messages.sending.AttemptOutbox``)."""

    def send(
        self, coordination_id: str, topic: str, payload: Any, *, using: str | None = None
    ) -> Message: ...

    def set_event(self, key: str, value: Any) -> None: ...
