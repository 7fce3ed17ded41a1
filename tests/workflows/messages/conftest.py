"""Fixtures of the message tests: workflows defined on the test's database alias
(``alias``, see ``tests.support.messages.ALIASES``) with an ORM snapshot store, and the
in-process recovery sweep of that alias."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flowwarden_django.workflows import Workflow, WorkflowDefinition, workflow_registry
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.operations.recovery import recover_stalled_runs


@pytest.fixture
def define(alias: str) -> Iterator[Callable[..., WorkflowDefinition]]:
    """``define(steps)``: a workflow of *steps* on the test's alias, under a new name."""
    names: list[str] = []

    def make(steps: list[Any], *, version: int = 1, name: str | None = None) -> WorkflowDefinition:
        name = name or f"messages-{uuid.uuid4().hex[:8]}"
        names.append(name)
        store = OrmSnapshotStore(using=alias)
        return Workflow.define(name, steps, store, using=alias, version=version)

    yield make
    for name in names:
        workflow_registry.unregister(name)


@pytest.fixture
def sweep(alias: str) -> Callable[[], list[str]]:
    """The in-process recovery sweep of the alias (``flowwarden_workflows recover``)."""

    def run() -> list[str]:
        return recover_stalled_runs(
            lambda run: Workflow.for_coordination(run.pk, using=alias).run(), using=alias
        )

    return run
