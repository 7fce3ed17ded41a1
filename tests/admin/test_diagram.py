"""A workflow's diagram (``admin.diagram``): steps in order, declared kinds and
jumps, a run's position; and the defined workflows with their runs by status."""

from __future__ import annotations

import pytest
from django.utils import timezone

from flowwarden_django.admin.diagram import build_diagram, defined_workflows
from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import step, workflow_registry
from tests.support.timeline_workflow import CHILD, ORDERS, define_orders, forget_orders

Status = WorkflowRun.Status


@pytest.fixture
def orders():
    definition = define_orders()
    yield definition
    forget_orders()


def a_run(status: str, last_step: str) -> WorkflowRun:
    now = timezone.now()
    return WorkflowRun(
        coordination_id="d-1",
        workflow_name=ORDERS,
        status=status,
        last_step=last_step,
        created_at=now,
        updated_at=now,
    )


def test_the_steps_in_order_with_their_kinds_and_declared_jumps(orders):
    diagram = build_diagram(orders)
    assert (diagram.name, diagram.version, diagram.current) == (ORDERS, 1, None)
    assert [(s.index, s.name, s.kind) for s in diagram.steps] == [
        (1, "reserve", ""),
        (2, "review", "approval"),
        (3, "cool-off", "sleep"),
        (4, "pack", "spawn"),
        (5, "ship", ""),
    ]
    ship = diagram.steps[-1]
    assert ship.next == "" and ship.jumps == (("reserve", "back"),) and not ship.jumps_anywhere
    assert diagram.steps[0].jumps == () and diagram.steps[0].jumps_anywhere
    assert diagram.steps[1].kind_text == "approval"


@pytest.mark.parametrize(
    ("status", "last_step", "positions"),
    [
        (Status.WAITING, "review", ["passed", "here", "next", "", ""]),
        (Status.RUNNING, "review", ["passed", "passed", "next", "", ""]),
        (Status.FAILED, "cool-off", ["passed", "passed", "passed", "here", ""]),
        (Status.COMPLETED, "ship", ["", "", "", "", ""]),
    ],
)
def test_a_runs_position_is_marked(orders, status, last_step, positions):
    diagram = build_diagram(orders, a_run(status, last_step))
    assert [s.position for s in diagram.steps] == positions
    assert diagram.run_id == "d-1"


def test_a_jump_recorded_by_the_head_moves_the_next_step(orders):
    diagram = build_diagram(orders, a_run(Status.RUNNING, "ship"), next_step="reserve")
    assert diagram.current is not None and diagram.current.name == "reserve"


def test_a_kind_must_be_one_the_diagram_knows():
    with pytest.raises(ValueError, match="kind must be one of"):
        step("x", kind="teleport")(lambda state: None)


@pytest.mark.django_db
def test_every_defined_workflow_with_its_versions_and_runs_by_status(orders):
    now = timezone.now()
    for n, status in enumerate([Status.COMPLETED, Status.COMPLETED, Status.WAITING]):
        WorkflowRun.objects.create(
            coordination_id=f"d-{n}",
            workflow_name=ORDERS,
            status=status,
            created_at=now,
            updated_at=now,
        )
    entries = {e.name: e for e in defined_workflows()}
    assert entries[ORDERS].versions == (1,) and entries[ORDERS].steps == 5
    assert dict(entries[ORDERS].counts) == {"completed": 2, "waiting": 1}
    assert entries[ORDERS].total == 3 and entries[CHILD].total == 0
    assert set(entries) == set(workflow_registry.names())
