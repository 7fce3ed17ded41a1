"""The step runners of the Celery and Temporal providers are made from the workflow's
definition, so they carry all of it: the queue too (a run recorded without one obeys
its workflow's queue)."""

import pytest

from flowwarden_django.workflows import Workflow, step, workflow_registry


@step
def only(state):
    return state


@pytest.fixture
def carrier_definition():
    # Unregistered afterwards: its queue is not configured, which the system checks
    # of other tests on this worker would report (W206).
    yield Workflow.define(
        "remote-steps-carry-the-queue", [only], store="memory", version=3, queue="carrier"
    )
    workflow_registry.unregister("remote-steps-carry-the-queue")


def test_the_celery_step_runner_carries_the_definition(carrier_definition):
    pytest.importorskip("celery")
    from flowwarden_django.integrations.celery.provider import _StepWorkflow

    wf = carrier_definition.workflow("cid-1", kind=_StepWorkflow, head="h", origin="next")
    assert isinstance(wf, _StepWorkflow)
    assert (wf.name, wf.coordination_id, wf.version, wf.queue) == (
        "remote-steps-carry-the-queue",
        "cid-1",
        3,
        "carrier",
    )
    assert (wf.expected_head, wf.origin, wf.held_by) == ("h", "next", ())


def test_the_temporal_step_runner_carries_the_definition(carrier_definition):
    pytest.importorskip("temporalio")
    from flowwarden_django.integrations.temporal.activities import _ActivityWorkflow

    wf = carrier_definition.workflow(
        "cid-2", kind=_ActivityWorkflow, origin="run", held_by=("token",)
    )
    assert isinstance(wf, _ActivityWorkflow)
    assert (wf.version, wf.queue, wf.origin, wf.held_by) == (3, "carrier", "run", ("token",))
