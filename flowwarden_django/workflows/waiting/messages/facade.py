"""``RunMessaging``: the messages and events of ``engine.Workflow`` (it inherits
this), so that the engine's facade stays the engine's: ``send``/``asend`` a message
to the run, ``get_event``/``aget_event`` what it publishes."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ....common.async_twins import method_twin
from ...definition.messages import Message
from .events import aget_event, get_event
from .sending import send_message

if TYPE_CHECKING:
    from ...runs.records import RunRecords


class RunMessaging:
    """Messages to one run and the events it publishes (see ``waiting.messages``)."""

    if TYPE_CHECKING:

        @property
        def coordination_id(self) -> str: ...

        @property
        def runs(self) -> RunRecords: ...

    def send(
        self,
        topic: str,
        payload: dict[str, Any],
        idempotency_key: str | None = None,
        sender: str = "",
    ) -> Message:
        """Send *payload* (a JSON object) on *topic* to this run, in the caller's
        transaction if there is one; the run wakes once it commits (a step waits for
        it with ``wait_for``). Once per *idempotency_key*: a repeat stores nothing and
        returns the first message. ``UnknownRunError``, ``RunFinishedError``
        (completed), ``RunCancelledError``, ``UserJSONError``."""
        sent = send_message(
            self.coordination_id,
            topic,
            payload,
            idempotency_key=idempotency_key,
            sender=sender,
            using=self.runs.db,
            workflow=self,  # type: ignore[arg-type]  # a Workflow continues itself
        )
        return sent.message

    asend = method_twin(
        send,
        """``send()`` from async code (``thread_sensitive=True``, as ``aapprove``: the
        insert joins the connection's transaction, the wake waits for its commit).""",
    )

    def get_event(self, key: str, timeout: float | timedelta | None = None) -> Any:
        """The value this run last published under *key* (``ctx.set_event``), waiting
        up to *timeout* seconds for one to be set; ``None`` when none came."""
        return get_event(self.coordination_id, key, timeout, using=self.runs.db)

    async def aget_event(self, key: str, timeout: float | timedelta | None = None) -> Any:
        """``get_event()`` from async code: it waits on the event loop."""
        return await aget_event(self.coordination_id, key, timeout, using=self.runs.db)
