"""Helpers of the message tests (``tests/workflows/messages``): the database aliases
they run on, new coordination ids, and the rows they check."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from flowwarden_django.models import WorkflowMessage, WorkflowRun
from tests.support.lanes import lane_marks
from tests.support.step_log import assert_chained

POSTGRES = pytest.param("postgres", marks=lane_marks("postgres", databases=["default", "postgres"]))
MARIADB = pytest.param("mariadb", marks=lane_marks("mariadb", databases=["default", "mariadb"]))
#: SQLite ("default") and PostgreSQL.
ALIASES = pytest.mark.parametrize("alias", ["default", POSTGRES])
#: SQLite, PostgreSQL and MariaDB.
EVERY_DATABASE = pytest.mark.parametrize("alias", ["default", POSTGRES, MARIADB])


def new_cid() -> str:
    return f"msg-{uuid.uuid4().hex[:12]}"


def run_of(alias: str, cid: str) -> WorkflowRun:
    return WorkflowRun.objects.using(alias).get(pk=cid)


def mailbox(alias: str, cid: str) -> list[WorkflowMessage]:
    """The run's messages, oldest first."""
    return list(WorkflowMessage.objects.using(alias).filter(coordination_id=cid).order_by("id"))


def waits_with(alias: str, cid: str, delivered: int) -> bool:
    """Whether run *cid* waits for a message with *delivered* of its messages handed
    out: at its wait number ``delivered + 1`` (a message is bound to a wait while the
    run runs, never while it waits)."""
    run = run_of(alias, cid)
    taken = WorkflowMessage.objects.using(alias).filter(
        coordination_id=cid, delivered_to__isnull=False
    )
    return run.status == "waiting_message" and taken.count() == delivered


#: How many messages the loop tests' runs handle (``listen`` → ``handle``, issue 47).
LOOP_TIMES = 5


def assert_handled_once_in_order(
    wf: Any, rows: list[WorkflowMessage], payloads: list[Any], steps: list[str]
) -> None:
    """The loop tests' checks of a completed run *wf* that handled *payloads* (its
    ``state["handled"]``): its snapshots are one chain of *steps* at increasing
    ``seq``; its mailbox *rows* (oldest first) are the payloads, one row per message
    in the order sent; each was delivered exactly once, to its own waiting snapshot,
    the waits in chain order (the first message to the first wait, and so on)."""
    from flowwarden_django.workflows.definition.metadata import LAST_STEP, NEXT_STEP
    from flowwarden_django.workflows.waiting.messages.waiting import WAIT_METADATA

    final = wf.current_result()
    assert final is not None and final.status == "completed", final
    assert final.final_state["handled"] == payloads
    assert_chained(wf, steps)
    history = wf.history()
    waits = [s.id for s in history if WAIT_METADATA in s.metadata]
    assert len(waits) == len(payloads)
    assert [row.payload for row in rows] == payloads
    assert [row.delivered_to for row in rows] == waits  # distinct snapshots, in order
    assert all(row.delivered_at is not None for row in rows)
    # Every pass but the last jumped back; the last ended the run.
    jumps = [s.metadata.get(NEXT_STEP) for s in history if s.metadata.get(LAST_STEP) == "handle"]
    assert len(jumps) == len(payloads) and jumps[-1] is None
    assert all(jumps[:-1])
