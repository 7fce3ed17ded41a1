"""Messages to runs, and events runs publish (issue 47).

A step returns ``wait_for(state, topic, timeout=None)``; the run waits (status
``waiting_message``) until a message on *topic* is sent to it with
``Workflow.for_coordination(cid).send(topic, payload)`` (``asend``; ``ctx.send`` from
another run's step; ``send_message`` where the workflow is not defined), and its next
step reads ``ctx.message``. A step publishes values with ``ctx.set_event(key,
value)``; ``Workflow.get_event(key, timeout=None)`` reads them.

The guarantees: a durable mailbox per run and topic (a message sent before the wait
is kept; several are delivered one per wait, in the order sent); at most one message
per idempotency key; a send commits or rolls back with the caller's transaction, and
wakes the run only once it committed (the recovery sweep is the fallback); each
message is delivered once, bound to the waiting snapshot, so a retry of the step
after the wait sees the same one. See ``waiting``, ``sending``, ``mailbox``,
``waking`` and ``events``. Nothing here imports the admin or DRF.
"""

from ...definition.messages import Message
from .errors import RunCancelledError, RunFinishedError
from .events import aget_event, get_event, set_event
from .sending import SentMessage, asend_message, send_message
from .waiting import WaitForMessage, wait_for

__all__ = [
    "Message",
    "RunCancelledError",
    "RunFinishedError",
    "SentMessage",
    "WaitForMessage",
    "aget_event",
    "asend_message",
    "get_event",
    "send_message",
    "set_event",
    "wait_for",
]
