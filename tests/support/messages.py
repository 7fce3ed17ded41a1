"""Helpers of the message tests (``tests/workflows/messages``): the database aliases
they run on, new coordination ids, and the rows they check."""

from __future__ import annotations

import uuid

import pytest

from flowwarden_django.models import WorkflowMessage, WorkflowRun
from tests.support.lanes import lane_marks

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
