"""Fixtures and helpers of the REST API tests (``tests/api/``); no tests here.

A workflow ``api-refund`` asks for an approval when the amount is 100 or more
(assigned to ``alice`` and the group ``finance``); its next step records the
decision it was given in ``tests.support.refund_workflow.seen_decisions``, so tests can tell
how often a run resumed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.db import connections
from django.test import Client
from django.test.utils import override_settings
from rest_framework.authtoken.models import Token

from flowwarden_django.models import Approval
from flowwarden_django.workflows import (
    Hibernated,
    RunStatus,
    WorkflowDefinition,
    workflow_registry,
)
from tests.support.lanes import lane_marks
from tests.support.refund_workflow import define_refunds

API = "/api/v1"
WORKFLOW = "api-refund"


@pytest.fixture
def refunds() -> Iterator[WorkflowDefinition]:
    """The ``api-refund`` workflow, on the ``default`` snapshot store alias."""
    definition = define_refunds(WORKFLOW)
    yield definition
    workflow_registry.unregister(WORKFLOW)


def perms(user: User, *codenames: str) -> User:
    """Give *user* flowwarden_django permissions; return it fresh (no perm cache)."""
    for codename in codenames:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="flowwarden_django", codename=codename)
        )
    return User.objects.get(pk=user.pk)


@dataclass
class People:
    """The users of a test: ``alice`` (assignee), ``bob`` (in group finance),
    ``carol`` (nothing), ``viewer`` (may view runs and snapshots), ``forker``
    (viewer + fork), ``auditor`` (may view approvals), ``admin`` (superuser)."""

    alice: User
    bob: User
    carol: User
    viewer: User
    forker: User
    auditor: User
    admin: User

    def client(self, name: str, *, csrf: bool = False) -> Client:
        """A test client logged in (session) as *name*."""
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(getattr(self, name))
        return client


def make_people() -> People:
    finance = Group.objects.create(name="finance")
    made = {
        name: User.objects.create_user(name, password="pw")
        for name in ("alice", "bob", "carol", "viewer", "forker", "auditor")
    }
    made["bob"].groups.add(finance)
    made["viewer"] = perms(made["viewer"], "view_workflowrun", "view_snapshotrecord")
    made["forker"] = perms(
        made["forker"], "view_workflowrun", "view_snapshotrecord", "fork_workflowrun"
    )
    made["auditor"] = perms(made["auditor"], "view_approval")
    made["admin"] = User.objects.create_superuser("admin", password="pw")
    return People(**made)


@pytest.fixture
def people() -> People:
    return make_people()


def token_client(user: User) -> Client:
    """A test client (CSRF checks on) that authenticates with *user*'s DRF token."""
    key = Token.objects.get_or_create(user=user)[0].key
    return Client(enforce_csrf_checks=True, headers={"Authorization": f"Token {key}"})


def pending(
    definition: WorkflowDefinition,
    amount: int = 500,
    coordination_id: str | None = None,
    **extra: Any,
) -> Approval:
    """Start a run that waits for an approval; return the approval."""
    started = definition.start({"amount": amount, **extra}, coordination_id=coordination_id)
    assert isinstance(started.result, Hibernated)
    assert started.result.status == RunStatus.WAITING
    return Approval.objects.get(coordination_id=started.coordination_id)


def post_json(client: Client, url: str, body: Any, **headers: str) -> Any:
    return client.post(url, body, content_type="application/json", headers=headers)


# -- PostgreSQL ------------------------------------------------------------------------


class EverythingOnPostgres:
    """A database router that sends every model to the ``postgres`` alias."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "postgres"

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "postgres"

    def allow_relation(self, *objects: Any, **hints: Any) -> bool:
        return True


def postgres_lane() -> Any:
    """A ``lane`` parameter value running the test against PostgreSQL (see ``on_lane``)."""
    marks = lane_marks("postgres", databases=["default", "postgres"], transaction=True)
    return pytest.param("postgres", marks=marks, id="postgres")


@pytest.fixture
def on_lane(lane: str) -> Iterator[None]:
    """Route every model to the database of parameter ``lane`` ("sqlite": as is)."""
    if lane == "sqlite":
        yield
        return
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.EverythingOnPostgres"]):
        yield
    connections["postgres"].close()


def field_errors(body: dict[str, Any]) -> list[str]:
    """The fields a 400 body reports (its ``code`` is ``invalid``, with a ``detail``)."""
    assert body["code"] == "invalid" and body["detail"], body
    return [name for name in body if name not in ("code", "detail")]
