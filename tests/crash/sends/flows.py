"""The ``crash-paid`` workflow: ``wait`` waits for a message on ``paid``; ``took``
completes with the message it got (its id, payload and sender) and the role of the
process that ran it (``FLOWWARDEN_CRASH_ROLE``: ``consumer``, woken after the
stream's commit, or ``sweeper``, the recovery sweep; ``test`` for the test itself).
"""

from __future__ import annotations

import os
from typing import Any

from flowwarden_django.workflows import (
    StepContext,
    Workflow,
    WorkflowDefinition,
    done,
    step,
    wait_for,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from tests.crash.sends import TOPIC, WORKFLOW


@step("wait")
def wait(state: dict[str, Any]) -> Any:
    return wait_for(state, TOPIC)


@step("took")
def took(state: dict[str, Any], ctx: StepContext) -> Any:
    message = ctx.message
    if message is None:  # no timeout: never, unless the engine is wrong
        raise AssertionError(f"run {ctx.coordination_id} continued without a message")
    return done(
        {
            **state,
            "message": message.id,
            "payload": message.payload,
            "sender": message.sender,
            "by": os.environ.get("FLOWWARDEN_CRASH_ROLE", "test"),
        }
    )


def define(using: str) -> WorkflowDefinition:
    """Register ``crash-paid`` with its runs and snapshots on database *using*."""
    return Workflow.define(WORKFLOW, [wait, took], OrmSnapshotStore(using=using), using=using)
