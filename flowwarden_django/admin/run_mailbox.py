"""The run page's messages and events: the newest messages sent to the run (topic,
sender, when, delivered or pending, idempotency key, payload) and the values it
published (key, value, when), each with a link to the whole list in the messages' and
events' admin (``admin/messages.py``).

Payloads and values are the run's data, shown to whoever may view the run, as its
resume input is: ``HEALTH_DETAILS`` hides instance ids and error texts, which they are
not.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils.http import urlencode

from ..common.formatting import state_json
from ..models import WorkflowEvent, WorkflowMessage, WorkflowRun

#: The most messages (the newest) and events the run's page lists.
PAGE_ROWS = 20


@dataclasses.dataclass(frozen=True)
class RunMailbox:
    """What the run's page shows of its messages and events."""

    #: The newest ``PAGE_ROWS`` messages, oldest first: ``{"message", "payload", "url"}``
    #: (the payload as JSON on one line, the message's admin page).
    messages: list[dict[str, Any]]
    message_count: int
    messages_url: str
    #: The first ``PAGE_ROWS`` events by key: ``{"event", "value"}``.
    events: list[dict[str, Any]]
    event_count: int
    events_url: str
    #: The topic the run waits for (status ``waiting_message``), else "".
    waiting_topic: str

    @property
    def shown(self) -> bool:
        """Whether the page shows the section: the run has messages or waits for one."""
        return bool(self.message_count or self.waiting_topic)


def run_mailbox(run: WorkflowRun, site_name: str) -> RunMailbox:
    """*run*'s messages and events as its page shows them (four queries)."""
    db = run._state.db
    messages = WorkflowMessage.objects.using(db).filter(coordination_id=run.pk)
    newest = list(reversed(messages.order_by("-id")[:PAGE_ROWS]))
    events = WorkflowEvent.objects.using(db).filter(coordination_id=run.pk)
    first = list(events.order_by("key")[:PAGE_ROWS])
    waits = run.status == WorkflowRun.Status.WAITING_MESSAGE
    return RunMailbox(
        messages=[
            {"message": m, "payload": one_line(m.payload), "url": _page_url(site_name, m.pk)}
            for m in newest
        ],
        message_count=len(newest) if len(newest) < PAGE_ROWS else messages.count(),
        messages_url=_list_url(site_name, "workflowmessage", run.pk),
        events=[{"event": e, "value": state_json(e.value)} for e in first],
        event_count=len(first) if len(first) < PAGE_ROWS else events.count(),
        events_url=_list_url(site_name, "workflowevent", run.pk),
        waiting_topic=run.waiting_topic if waits else "",
    )


def one_line(value: Any) -> str:
    """A JSON value on one line, keys sorted (a table cell wraps it)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _page_url(site_name: str, pk: int) -> str:
    return reverse(
        "admin:flowwarden_django_workflowmessage_change", args=[quote(pk)], current_app=site_name
    )


def _list_url(site_name: str, model: str, coordination_id: str) -> str:
    """The changelist of *model* filtered to one run."""
    url = reverse(f"admin:flowwarden_django_{model}_changelist", current_app=site_name)
    return f"{url}?{urlencode({'coordination_id': coordination_id})}"
